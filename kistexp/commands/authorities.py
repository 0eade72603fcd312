"""`kistexp authorities ...`: questions about the directory authorities' vote.

``authorities_app`` is shared: other command modules add their commands (status, serve) to it.
"""

from __future__ import annotations

import typer

from kistexp.dirauth.paramsline import format_params
from kistexp.dirauth.whatif import whatif_report
from kistexp.jsonout import to_json
from kistexp.output import emit_json, say

authorities_app = typer.Typer(
    help="Directory authorities: the params vote, what-if questions, status.",
    no_args_is_help=True,
)


@authorities_app.command("whatif")
def whatif(
    n_authorities: int = typer.Option(
        ..., "--n-authorities", help="Configured v3 authorities (N), 9 today; at most 2147483647 (tor's int)."),
    vote: list[str] = typer.Option(
        [], "--vote", help="NAME='k=v k2=v2': that authority's params line (NAME= for an empty one)."
    ),
    target: str | None = typer.Option(
        None, "--target", help="k=v to reach (k= or k=absent: drop k); prints the fewest changes needed."
    ),
    unreachable: list[str] = typer.Option(
        [], "--unreachable", help="Authority that keeps its vote as is (cannot be asked to change)."
    ),
    absent: list[str] = typer.Option([], "--absent", help="Authority whose vote does not arrive."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Consensus params tor would compute from these votes, the tally in words, and the fewest vote changes.

    Authorities not named with --vote are silent (they vote but list nothing).
    """
    report = whatif_report(vote, n_authorities, target, unreachable, absent)

    for dropped in report.dropped:
        say(f"warning: {dropped.dropped_because}", err=True)
    if as_json:
        emit_json(to_json(report))
        return
    form = report.formation
    say(f"votes: {form.reason}")
    if report.consensus_params is None:
        say("consensus params: no consensus is computed")
    else:
        line = format_params(report.consensus_params)
        say(f"consensus params: {line or '(none)'}")
    for key, words in report.tally_words():
        say(f"  {key}: {words}")
    solved = report.target
    if solved is not None:
        want = "absent" if solved.target is None else solved.target
        say(f"target {solved.key}={want}: {solved.explanation}")
        for change in solved.changes:
            say(f"  change {change.describe()}")


def register(app: typer.Typer) -> None:
    app.add_typer(authorities_app, name="authorities")
