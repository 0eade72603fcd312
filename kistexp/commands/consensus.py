"""`kistexp consensus inspect FILE [--certs FILE]`: header, relay count, params and signature check
of a vote or consensus file (docs/consensus.md); `kistexp consensus fetch [-o FILE]`: today's consensus
from the directory authorities, verified and saved (kistexp/consensus_fetch.py)."""

from __future__ import annotations

from pathlib import Path

import typer

from kistexp.dirauth.authorities import AUTHORITY_SETS, parse_trusted
from kistexp.dirauth.authorities import authority_set as authority_set_named
from kistexp.dirauth.dirformat import format_time, parse_time
from kistexp.dirauth.documents import StatusSummary, inspect_file
from kistexp.dirauth.paramsline import ConsensusParams
from kistexp.errors import DirectoryError, DocumentError
from kistexp.output import add_row, emit_json, make_table, plain, print_table, say

consensus_app = typer.Typer(
    name="consensus", help="Inspect votes and consensuses (ns or microdesc flavour); fetch today's.",
    no_args_is_help=True,
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
        "verified": s.verified,
        "trusted_authorities": [{"nickname": n, "v3ident": i} for n, i in s.trusted],
        "other_certificates": list(s.other_certificates),
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
    # Everything shown comes from the file: printed as text (say/add_row), never as rich markup.
    method = f", consensus-method {s.consensus_method}" if s.consensus_method is not None else ""
    say(f"{s.source}: {s.flavor} {s.vote_status}{method}")
    say(f"  valid-after  {format_time(s.valid_after)} UTC")
    say(f"  fresh-until  {format_time(s.fresh_until)} UTC")
    say(f"  valid-until  {format_time(s.valid_until)} UTC")
    say(f"  relays       {s.relay_count}")
    say(f"  authorities  {s.authorities} dir-source, {s.signature_count} signatures")
    if s.params:
        say("  params       " + ConsensusParams(s.params).format())
    else:
        say("  params       (none)")
    if s.signatures is None:
        say("  signatures   NOT VERIFIED: no --certs given, so nothing above is authenticated")
        return
    say(f"  trusted      {len(s.trusted)} authorities: " + ", ".join(n for n, _ in s.trusted))
    if s.other_certificates:
        say(f"  ignored      certificates of {len(s.other_certificates)} identities that are not trusted "
             "authorities: " + ", ".join(s.other_certificates))
    c = s.signatures
    verdict = "OK" if c.ok else "NOT ENOUGH"
    say(f"  signatures   {c.valid}/{c.total} valid, {c.needed} needed (N={c.n_authorities}) {verdict}")
    table = make_table(None, ("identity", "signing key", "digest", "status"), show_header=True,
                       header_style="bold", box=None, pad_edge=False)
    for x in c.signatures:
        add_row(table, x.identity, x.signing_key_digest, x.algorithm, plain(x.status, "green" if x.ok else "red"))
    print_table(table)


def trusted_identities(authority_set: str, v3idents: list[str]) -> list[tuple[str, str]]:
    """(nickname, v3ident) pairs whose signatures count: ``--v3ident`` entries if given, else the set."""
    if v3idents:
        pairs = [parse_trusted(spec) for spec in v3idents]
        seen: set[str] = set()
        for nick, ident in pairs:
            if ident in seen or nick.lower() in seen:
                raise DirectoryError(f"--v3ident: {nick}={ident} is given twice")
            seen |= {ident, nick.lower()}
        return pairs
    return [(a.nickname, a.v3ident) for a in authority_set_named(authority_set)]


@consensus_app.command("inspect")
def inspect(
    file: Path = typer.Argument(..., help="A vote or consensus (ns or microdesc), uncompressed."),
    certs: Path = typer.Option(None, "--certs", help="Authority key certificates (e.g. tor's cached-certs)."),
    authority_set: str = typer.Option(
        "current", "--authority-set",
        help=f"Pinned authority identities whose signatures count: {' or '.join(AUTHORITY_SETS)}."),
    v3ident: list[str] = typer.Option(
        [], "--v3ident", metavar="NICK=V3IDENT",
        help="Trust this authority identity instead of the set (repeatable)."),
    n_authorities: int = typer.Option(
        None, "--n-authorities", min=1,
        help="Configured authorities N (default and minimum: the number of trusted identities)."),
    at: str = typer.Option(
        None, "--at", help="Check certificate validity at this UTC time 'YYYY-MM-DD HH:MM:SS' "
        "(default: the document's valid-after)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Show flavour, validity times, relay count, params and (with --certs) the signature check.

    Only signatures of the trusted authority identities count. Without --certs nothing is verified
    (said in the output; JSON "verified": false). Exits 1 when certificates are given and fewer
    than floor(N/2)+1 trusted authorities signed validly.
    """
    when = parse_time(at, "--at") if at is not None else None
    trusted = trusted_identities(authority_set, v3ident)
    summary = inspect_file(file, certs, n_authorities, when, trusted)
    if as_json:
        emit_json(_as_json(summary))
    else:
        _print(summary)
    if summary.signatures is not None and not summary.signatures.ok:
        raise DocumentError(f"{file}: not enough valid signatures: {summary.signatures.summary()}")


@consensus_app.command("fetch")
def fetch(
    output: Path = typer.Option(None, "-o", "--output", help="File to write (default: consensus-<valid-after> "
                                "in the current directory); written whole or not at all."),
    flavour: str = typer.Option("ns", "--flavour", help="ns (with exit policies: what the population wants) or "
                                "microdesc."),
    authority: list[str] = typer.Option(
        [], "--authority", metavar="NICK=HOST:PORT/V3IDENT",
        help="DirPort to ask and the authority's pinned identity (repeatable); default: today's nine."),
    certs: Path = typer.Option(None, "--certs", help="Key certificates to start from (e.g. tor's cached-certs); "
                               "otherwise fetched from the authorities."),
    certs_out: Path = typer.Option(None, "--certs-out", help="Also save the key certificates that verified it "
                                   "(for --certs of the population commands and simulate)."),
    timeout: float = typer.Option(30.0, "--timeout", help="Seconds each request may take in total (each "
                                  "authority is asked once, in random order, until one serves a valid consensus)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Download the current consensus from the directory authorities, keep it only if more than half of
    the pinned authorities signed it, and write it atomically. Exit 1 with one line when no authority
    serves a valid one (nothing is written)."""
    from kistexp.consensus_fetch import fetch_consensus_file
    from kistexp.dirauth.authorities import DEFAULT_AUTHORITIES
    from kistexp.output import err_console

    status = None if as_json else err_console.status("asking the directory authorities...")
    if status is not None:
        status.start()
    try:
        saved = fetch_consensus_file(output, flavour=flavour, authorities=list(authority) or DEFAULT_AUTHORITIES,
                                     certs=certs, certs_out=certs_out, timeout_s=timeout)
    finally:
        if status is not None:
            status.stop()
    if as_json:
        emit_json(saved)
        return
    say(f"{saved.path}: {saved.flavour} consensus, valid-after {format_time(saved.valid_after)} UTC, "
        f"{saved.relays} relays, {saved.size_bytes} bytes")
    say(f"  from         {saved.authority} {saved.url}")
    say(f"  signatures   {saved.signatures}")
    if saved.certs_path:
        say(f"  certificates {saved.certs_path}")


def register(app: typer.Typer) -> None:
    app.add_typer(consensus_app, name="consensus")
