"""`kistexp authorities status` and `kistexp authorities serve`: live authorities over DirPorts.

Both are added to the shared ``authorities`` sub-app.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from kistexp.commands.authorities import authorities_app
from kistexp.output import console, emit_json, err_console, say


@authorities_app.command("status")
def status(
    plan: Path | None = typer.Option(None, "--plan", help="Experiment plan: show its parameters (and authorities)."),
    param: list[str] = typer.Option([], "--param", help="Parameter to show (repeatable); default: all voted."),
    authority: list[str] = typer.Option(
        [], "--authority", help="NICK=HOST:PORT DirPort to ask (repeatable); default: today's nine."),
    certs: Path | None = typer.Option(None, "--certs", help="Trusted key certificates (e.g. tor's cached-certs)."),
    n_authorities: int | None = typer.Option(
        None, "--n-authorities", help="N of the signature and params rules (default: number of authorities)."),
    flavour: str = typer.Option("microdesc", "--flavour", help="Consensus flavour to check: microdesc or ns."),
    timeout: float = typer.Option(10.0, "--timeout", help="Seconds per connection/read."),
    retries: int = typer.Option(1, "--retries", help="Retries per authority on network errors."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Each authority's vote for the parameters, the consensus value, its valid-after and tor's tally.

    Unreachable authorities are reported per authority, not fatal."""
    from kistexp.dirauth.authorities import DEFAULT_AUTHORITIES
    from kistexp.directory import DirectoryClient, authorities_status

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
        progress = err_console.status("asking the authorities...") if not as_json else None
        if progress:
            progress.start()
        try:
            report = authorities_status(client, names, flavour)
        finally:
            if progress:
                progress.stop()
    if as_json:
        emit_json(report.to_json())
        return
    if report.consensus_error:
        console.print(f"consensus: unavailable ({report.consensus_error})", markup=False, highlight=False)
    if report.consensus_valid_after is not None:
        console.print(f"consensus ({report.consensus_flavour}): valid-after {_ts(report.consensus_valid_after)}, "
                      f"fresh-until {_ts(report.consensus_fresh_until)}; {report.consensus_signatures}",
                      markup=False, highlight=False)
    table = Table(title=f"votes ({report.n_authorities} authorities configured)")
    table.add_column("authority")
    table.add_column("vote valid-after")
    for p in report.params:
        table.add_column(p.name, justify="right")
    votes = {p.name: dict(p.votes) for p in report.params}
    for a in report.authorities:
        if a.error:
            table.add_row(a.nickname, "[red]unreachable[/red]", *["" for _ in report.params])
            continue
        cells = [str(votes[p.name].get(a.nickname)) if votes[p.name].get(a.nickname) is not None else "-"
                 for p in report.params]
        table.add_row(a.nickname, _ts(a.valid_after), *cells)
    table.add_row("[bold]consensus[/bold]", "",
                  *["absent" if p.consensus_value is None else str(p.consensus_value) for p in report.params])
    console.print(table)
    for p in report.params:
        console.print(f"  {p.name}: {p.tally}", markup=False, highlight=False)
    for a in report.authorities:
        if a.error:
            console.print(f"  {a.nickname}: {a.error}", markup=False, highlight=False)


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
