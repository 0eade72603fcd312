"""`kistexp authorities status` and `kistexp authorities serve`: live authorities over DirPorts.

Both are added to the shared ``authorities`` sub-app.
"""

from __future__ import annotations

from pathlib import Path

import typer

from kistexp.commands.authorities import authorities_app
from kistexp.errors import DirectoryError
from kistexp.jsonout import to_json
from kistexp.output import add_row, emit_json, err_console, make_table, plain, print_table, say


@authorities_app.command("status")
def status(
    plan: Path | None = typer.Option(None, "--plan", help="Experiment plan: show its parameters (and authorities)."),
    param: list[str] = typer.Option([], "--param", help="Parameter to show (repeatable); default: all voted."),
    authority: list[str] = typer.Option(
        [], "--authority", metavar="NICK=HOST:PORT/V3IDENT",
        help="DirPort to ask and the authority's pinned identity (repeatable); default: today's nine. "
        "Without /V3IDENT nothing it serves can be verified."),
    certs: Path | None = typer.Option(
        None, "--certs", help="Key certificates to start from (e.g. tor's cached-certs); only the configured "
        "authorities' are used."),
    n_authorities: int | None = typer.Option(
        None, "--n-authorities",
        help="N of the signature and params rules (default and minimum: the number of authorities)."),
    flavour: str = typer.Option("microdesc", "--flavour", help="Consensus flavour to check: microdesc or ns."),
    timeout: float = typer.Option(
        10.0, "--timeout", help="Seconds each request may take in total (connect, headers and body)."),
    retries: int = typer.Option(1, "--retries", help="Retries per authority on network errors (0-10)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Each authority's vote for the parameters, the consensus value, its valid-after and tor's tally.

    Unreachable authorities are reported per authority, not fatal. Exits 1 (after the report)
    when no consensus could be verified against the authorities' pinned identities."""
    from kistexp.dirauth.authorities import DEFAULT_AUTHORITIES
    from kistexp.directory import DirectoryClient, authorities_status, check_flavour

    check_flavour(flavour)
    names = list(param)
    auths: list = list(authority) or list(DEFAULT_AUTHORITIES)
    if plan is not None:
        from kistexp.plan import load_plan

        loaded = load_plan(plan)
        names = names or list(loaded.parameters)
        if not authority:
            auths = list(loaded.authorities.authorities)
    with DirectoryClient(auths, timeout_s=timeout, retries=retries, n_authorities=n_authorities) as client:
        if certs is not None:
            client.load_certificates(certs)
        unpinned = [e.nickname for e in client.unpinned()]
        progress = err_console.status("asking the authorities...") if not as_json else None
        if progress:
            progress.start()
        try:
            report = authorities_status(client, names, flavour)
        finally:
            if progress:
                progress.stop()
    if as_json:
        emit_json(to_json(report))
    else:
        _print_status(report, unpinned)
    if not report.verified:
        raise DirectoryError(f"no {flavour} consensus could be verified: {report.consensus_error}")


def _print_status(report, unpinned: list[str]) -> None:  # noqa: ANN001
    # Names, keys and errors come from servers: say/add_row print them as text, escaped.
    if unpinned:
        say(f"not pinned (no v3ident given, nothing they serve is verified): {', '.join(unpinned)}")
    if report.consensus_error:
        say(f"consensus: unavailable ({report.consensus_error})")
    if report.consensus_valid_after is not None:
        say(f"consensus ({report.consensus_flavour}): valid-after {_ts(report.consensus_valid_after)}, "
            f"fresh-until {_ts(report.consensus_fresh_until)}; {report.consensus_signatures}")
    table = make_table(f"votes ({report.n_authorities} authorities configured)",
                       ["authority", "vote valid-after", *((p.name, {"justify": "right"}) for p in report.params)])
    votes = {p.name: dict(p.votes) for p in report.params}
    for a in report.authorities:
        name = a.nickname + ("" if a.pinned else " (not pinned)")
        if a.error:
            add_row(table, name, plain("unreachable", "red"), *["" for _ in report.params])
            continue
        add_row(table, name, _ts(a.valid_after), *[
            "-" if votes[p.name].get(a.nickname) is None else votes[p.name][a.nickname] for p in report.params])
    add_row(table, plain("consensus", "bold"), "",
            *["absent" if p.consensus_value is None else p.consensus_value for p in report.params])
    print_table(table)
    for p in report.params:
        say(f"  {p.name}: {p.tally}")
    for a in report.authorities:
        if a.error:
            say(f"  {a.nickname}: {a.error}")


def _ts(when) -> str:  # noqa: ANN001
    return when.strftime("%Y-%m-%d %H:%M:%S")


@authorities_app.command("serve")
def serve(
    count: int = typer.Option(9, "--count", help="Number of fake authorities."),
    port: int = typer.Option(7000, "--port", help="Operator API port; authority i listens on port+i."),
    interval: str = typer.Option("10s", "--interval", help='One voting "hour" (e.g. 10s).'),
    token: str | None = typer.Option(None, "--token", help="Operator API token (default: random, printed)."),
    state_dir: Path | None = typer.Option(None, "--state-dir", help="Keep keys, params and token here."),
    host: str = typer.Option("127.0.0.1", "--host", help="Loopback address to bind (127.0.0.0/8 only)."),
    population: str | None = typer.Option(
        None, "--population", metavar="CACHES,CLIENTS", help="Attach simulated caches and clients, e.g. 200,1000."),
    as_json: bool = typer.Option(False, "--json", help="Print the network description as JSON."),
) -> None:
    """Run fake directory authorities on loopback until Ctrl-C (see docs/fake-authorities.md)."""
    from fake_authorities.serve import describe, parse_population
    from fake_authorities.serve import serve as run

    progress = None if as_json else err_console.status("starting the authorities (keys, first vote)...")
    if progress:
        progress.start()

    def ready(net) -> None:  # noqa: ANN001
        if progress:
            progress.stop()
        if as_json:
            emit_json({"operator_url": net.operator_url, "token": net.token,
                       "interval_s": net.timing.interval_s,
                       "authorities": [{"nickname": a.nickname, "v3ident": a.v3ident,
                                        "dir_url": a.dir_url} for a in net.directory_authorities()]})
        else:
            for line in describe(net):
                say(line)

    try:
        run(count, port, interval, token, state_dir, host, parse_population(population), on_ready=ready)
    finally:
        if progress:
            progress.stop()


def register(app: typer.Typer) -> None:
    """Commands are attached to the shared authorities sub-app at import; nothing else to add."""
