"""`kistexp consensus inspect FILE [--certs FILE]`: header, relay count, params and signature check
of a vote or consensus file (docs/consensus.md)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from kistexp.dirauth.dirformat import format_time, parse_time
from kistexp.dirauth.documents import StatusSummary, inspect_file
from kistexp.errors import DocumentError
from kistexp.output import console, emit_json

consensus_app = typer.Typer(
    name="consensus", help="Inspect votes and consensuses (ns or microdesc flavour).", no_args_is_help=True
)


def _as_json(s: StatusSummary) -> dict:
    out: dict = {
        "source": s.source,
        "flavor": s.flavor,
        "vote_status": s.vote_status,
        "consensus_method": s.consensus_method,
        "valid_after": s.valid_after,
        "fresh_until": s.fresh_until,
        "valid_until": s.valid_until,
        "relay_count": s.relay_count,
        "params": s.params,
        "authority_count": s.authorities,
        "signature_count": s.signature_count,
        "signatures": None,
    }
    if s.signatures is not None:
        c = s.signatures
        out["signatures"] = {
            "valid": c.valid,
            "total": c.total,
            "needed": c.needed,
            "n_authorities": c.n_authorities,
            "ok": c.ok,
            "per_signature": [
                {"identity": x.identity, "signing_key_digest": x.signing_key_digest,
                 "algorithm": x.algorithm, "status": x.status}
                for x in c.signatures
            ],
        }
    return out


def _print(s: StatusSummary) -> None:
    method = f", consensus-method {s.consensus_method}" if s.consensus_method is not None else ""
    console.print(f"[bold]{s.source}[/bold]: {s.flavor} {s.vote_status}{method}")
    console.print(f"  valid-after  {format_time(s.valid_after)} UTC")
    console.print(f"  fresh-until  {format_time(s.fresh_until)} UTC")
    console.print(f"  valid-until  {format_time(s.valid_until)} UTC")
    console.print(f"  relays       {s.relay_count}")
    console.print(f"  authorities  {s.authorities} dir-source, {s.signature_count} signatures")
    if s.params:
        console.print("  params       " + " ".join(f"{k}={v}" for k, v in s.params.items()), soft_wrap=True)
    else:
        console.print("  params       (none)")
    if s.signatures is None:
        console.print("  signatures   not checked (give --certs)")
        return
    c = s.signatures
    verdict = "[green]OK[/green]" if c.ok else "[red]NOT ENOUGH[/red]"
    console.print(f"  signatures   {c.valid}/{c.total} valid, {c.needed} needed (N={c.n_authorities}) {verdict}")
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for col in ("identity", "signing key", "digest", "status"):
        table.add_column(col)
    for x in c.signatures:
        style = "green" if x.ok else "red"
        table.add_row(x.identity, x.signing_key_digest, x.algorithm, f"[{style}]{x.status}[/{style}]")
    console.print(table)


@consensus_app.command("inspect")
def inspect(
    file: Path = typer.Argument(..., help="A vote or consensus (ns or microdesc), uncompressed."),
    certs: Path = typer.Option(None, "--certs", help="Authority key certificates (e.g. tor's cached-certs)."),
    n_authorities: int = typer.Option(9, "--n-authorities", min=1, help="Configured authorities N."),
    at: str = typer.Option(
        None, "--at", help="Check certificate validity at this UTC time 'YYYY-MM-DD HH:MM:SS' "
        "(default: the document's valid-after)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Show flavour, validity times, relay count, params and (with --certs) the signature check.

    Exits 1 when certificates are given and fewer than floor(N/2)+1 authorities signed validly.
    """
    when = parse_time(at, "--at") if at is not None else None
    summary = inspect_file(file, certs, n_authorities, when)
    if as_json:
        emit_json(_as_json(summary))
    else:
        _print(summary)
    if summary.signatures is not None and not summary.signatures.ok:
        raise DocumentError(f"{file}: not enough valid signatures: {summary.signatures.summary()}")


def register(app: typer.Typer) -> None:
    app.add_typer(consensus_app, name="consensus")
