"""`kistexp population paths|summary CONSENSUS`: path-selection frequencies and what a (sampled)
population consists of (docs/population.md)."""

from __future__ import annotations

from pathlib import Path

import attrs
import typer

from kistexp.output import add_row, console, emit_json, make_table, plain, print_table, say

population_app = typer.Typer(
    name="population", help="Relay population from a consensus: path selection, sampling, classes.",
    no_args_is_help=True,
)

_CONSENSUS = typer.Argument(None, help="ns or microdesc consensus, plain or xz (default: the bundled 2022-11-19 one; "
                            "kistexp consensus fetch gets today's).")
_CERTS = typer.Option(None, "--certs", help="Authority key certificates (e.g. tor's cached-certs): refuse a CONSENSUS "
                      "that the pinned authorities did not sign.")


def _pct(x: float) -> str:
    return f"{100 * x:.2f} %"


@population_app.command("paths")
def paths_cmd(
    consensus: Path = _CONSENSUS,
    certs: Path = _CERTS,
    circuits: int = typer.Option(100_000, "--circuits", help="Circuits to draw."),
    seed: int = typer.Option(1, "--seed", help="Random seed."),
    port: int = typer.Option(443, "--port", help="Target port the exit must accept."),
    per_client: int = typer.Option(1, "--circuits-per-client", help="Circuits per client (clients keep guards)."),
    scale: float = typer.Option(1.0, "--scale", help="Sample the network first (tornettools method)."),
    top: int = typer.Option(20, "--top", help="Relays shown in the table."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output (every picked relay)."),
) -> None:
    """Draw circuits as tor does (exit by port first, then guard, then middle) and count picks per relay."""
    from kistexp.population.paths import pick_paths
    from kistexp.population.relays import load_population
    from kistexp.population.sampling import sample
    from kistexp.population.summary import pick_frequencies

    pop = load_population(consensus, certs=certs)
    if scale != 1.0:
        pop = sample(pop, scale, seed)
    with console.status(f"drawing {circuits} circuits", spinner="dots") if not as_json else _null():
        paths = pick_paths(pop, circuits, port=port, seed=seed, circuits_per_client=per_client)
    picks = pick_frequencies(paths)
    classes = {p: paths.class_shares(p) for p in ("guard", "middle", "exit")}
    if as_json:
        emit_json({"source": pop.source, "circuits": circuits, "seed": seed, "port": port,
                   "circuits_per_client": per_client, "class_shares": classes,
                   "relays": [{"fingerprint": r.fingerprint, "nickname": r.nickname, "class": r.position_class,
                               "guard": r.guard, "middle": r.middle, "exit": r.exit} for r in picks]})
        return
    # the source is a file name and nicknames come from the consensus: printed as text, never markup
    say(plain(pop.source, "bold"), f": {circuits} circuits to port {port}, seed {seed}, {len(pop)} relays")
    t = make_table("share of picks by position class (D guard+exit, G guard, E exit, M other)",
                   ["position", *((c, {"justify": "right"}) for c in ("D", "E", "G", "M"))], box=None)
    for p, shares in classes.items():
        add_row(t, p, *(_pct(shares[c]) for c in ("D", "E", "G", "M")))
    print_table(t)
    columns = ("nickname", "fingerprint", "class", "guard", "middle", "exit")
    t = make_table(f"top {top} relays by picks", [(col, {"justify": "right" if col in ("guard", "middle", "exit")
                                                         else "left"}) for col in columns], box=None)
    for r in picks[:top]:
        add_row(t, r.nickname, r.fingerprint[:16], r.position_class, _pct(r.guard), _pct(r.middle), _pct(r.exit))
    print_table(t)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@population_app.command("summary")
def summary_cmd(
    consensus: Path = _CONSENSUS,
    certs: Path = _CERTS,
    scale: float = typer.Option(1.0, "--scale", help="Share of relays to keep, in (0, 1] (tornettools)."),
    seed: int = typer.Option(1, "--seed", help="Sampling and class-assignment seed."),
    classes_toml: Path = typer.Option(None, "--classes", help="Relay-class shares TOML."),
    profiles_toml: Path = typer.Option(None, "--profiles", help="Hardware profiles TOML."),
    geoip_file: Path = typer.Option(None, "--geoip", help="tor's IPv4 GeoIP file, plain or xz (default: the bundled "
                                    "copy of Debian's tor-geoipdb; /usr/share/tor/geoip is one)."),
    countries: int = typer.Option(12, "--countries", help="Countries shown in the table."),
    values: list[str] = typer.Option(None, "--values", help="A stage's consensus value NAME=VALUE (repeatable): "
                                     "show which client implementations it reaches (Arti ignores "
                                     "KISTSchedRunInterval) and Arti's KIST under it."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """The (sampled) population by flags, position class, relay class, country and weight; its clients."""
    from kistexp.population.classes import load_class_shares
    from kistexp.population.geoip import load_geoip
    from kistexp.population.relays import load_population
    from kistexp.population.sampling import sample
    from kistexp.population.summary import stage_reach, summarize

    stage = _parse_values(values or [])
    shares = load_class_shares(classes_toml, profiles_toml)
    geoip = load_geoip(geoip_file)
    pop = load_population(consensus, certs=certs)
    if scale != 1.0:
        pop = sample(pop, scale, seed)
    s = summarize(pop, geoip=geoip, shares=shares, class_seed=seed, scale=scale)
    reached = stage_reach(stage, shares) if stage else None
    if as_json:
        emit_json(s if reached is None else {**attrs.asdict(s), "stage": attrs.asdict(reached)})
        return
    console.print(plain(s.source, "bold").append_text(plain(
        f": {s.relays} relays, ΣB {s.total_weight_kBps:,} kB/s, "
        f"capacity {s.capacity_gbit:,.1f} Gbit/s, {s.weights_case or 'footer'} weights; "
        f"{s.users:,} users, {s.circuits_per_10min:,.0f} exit circuits per 10 min")))
    console.print(plain("  weight kB/s  " + "  ".join(f"{k} {v:,.0f}" for k, v in s.weight_quantiles_kBps)))
    # flags and class names come from the consensus and the classes file
    console.print(plain("  flags        " + "  ".join(f"{k} {v}" for k, v in s.flags)), soft_wrap=True)
    console.print(plain("  tornettools  " + "  ".join(f"{k} {_pct(v)}" for k, v in s.tornet_classes)))
    for title, rows in (("position class", s.position_classes), ("scheduler", s.schedulers),
                        ("relay class", s.relay_classes), ("country", s.countries[:countries])):
        t = make_table(title, [(col, {"justify": "left" if col == title else "right"})
                               for col in (title, "relays", "% relays", "% weight")], box=None, title_justify="left")
        for r in rows:
            add_row(t, r.key, str(r.relays), _pct(r.relay_share), _pct(r.weight_share))
        print_table(t)
    console.print(plain("  clients      " + "  ".join(f"{k} {_pct(v)}" for k, v in s.client_classes)
                        + " of client processes (Arti ignores KISTSchedRunInterval; measurement clients run tor)"))
    if reached is not None:
        reach, kist = reached.reach, reached.arti
        said = ", ".join(f"{k}={v}" for k, v in reached.values)
        missed = "; misses " + ", ".join(f"{k} {_pct(v)}" for k, v in reach.missed) if reach.missed else ""
        console.print(plain(f"  stage        {said} reaches {_pct(reach.share)} of clients ("
                            + (", ".join(k for k, _ in reach.reached) or "none") + f"){missed}"))
        lowat = kist.socket_notsent_lowat()
        clamped = f"; clamped to Arti's bounds: {', '.join(kist.clamped)}" if kist.clamped else ""
        console.print(plain(f"  arti KIST    {'on' if kist.enabled else 'off'}: TCP_NOTSENT_LOWAT {lowat} bytes on "
                            f"Linux (kist-tcp-notsent-lowat={kist.tcp_notsent_lowat}){clamped}"))


def _parse_values(items: list[str]) -> dict[str, int]:
    """``NAME=VALUE`` items as a stage's values; the name must be in kistexp's catalogue."""
    from kistexp import params as tor_params
    from kistexp.errors import KistexpError

    out: dict[str, int] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise KistexpError(f"--values {item[:80]!r}: expected NAME=VALUE, e.g. KISTSchedRunInterval=2")
        if tor_params.get(name) is None:
            close = tor_params.suggest(name)
            raise KistexpError(f"--values: unknown consensus parameter {name[:80]!r}"
                               + (f"; did you mean {close}?" if close else ""))
        try:
            value = int(text)
        except ValueError:
            raise KistexpError(f"--values {name}={text[:40]!r}: not an integer") from None
        if not tor_params.INT32_MIN <= value <= tor_params.INT32_MAX:
            raise KistexpError(f"--values {name}={value}: out of range (consensus values are 32-bit signed integers)")
        out[name] = value
    return out


def register(app: typer.Typer) -> None:
    app.add_typer(population_app, name="population")
