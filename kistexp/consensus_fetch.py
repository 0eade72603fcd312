"""Today's consensus from the directory authorities, saved to a file (``kistexp consensus fetch``).

The document comes through the hardened directory client (``kistexp.directory``): bounded in time and
size, and kept only if more than half of the pinned authorities signed it with keys certified now
(docs/directory-client.md). It is written as served, atomically (``kistexp.safeio.write_atomic``): a
failure at any point (no authority reachable, a forged or truncated body, a full disk) leaves no file and
no temporary file behind. The population commands and ``kistexp simulate --consensus`` read the result.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import attrs

from kistexp.dirauth.authorities import DEFAULT_AUTHORITIES, DirectoryAuthority
from kistexp.directory import DirectoryClient, Endpoint, check_flavour
from kistexp.errors import DirectoryError
from kistexp.safeio import write_atomic

#: Seconds one request may take in total: a 2.4 MB consensus over a slow link fits.
DEFAULT_TIMEOUT_S = 30.0


@attrs.frozen
class SavedConsensus:
    """What ``fetch_consensus_file`` wrote."""

    path: str
    flavour: str
    authority: str  # nickname of the authority that served it
    url: str
    valid_after: dt.datetime
    valid_until: dt.datetime
    relays: int
    signatures: str  # the check's summary, e.g. "8/8 signatures valid, 5 needed (N=9)"
    size_bytes: int
    certs_path: str = ""  # where the certificates that verified it went ("" when not asked for)


def default_name(flavour: str, valid_after: dt.datetime) -> str:
    """``consensus-YYYY-MM-DD-HH-MM-SS`` (ns) or ``microdesc-consensus-...``, as the bundled one is named."""
    stamp = valid_after.strftime("%Y-%m-%d-%H-%M-%S")
    return f"consensus-{stamp}" if flavour == "ns" else f"microdesc-consensus-{stamp}"


def fetch_consensus_file(
    output: str | Path | None = None,
    *,
    flavour: str = "ns",
    authorities: Iterable[DirectoryAuthority | Endpoint | str] = DEFAULT_AUTHORITIES,
    certs: str | Path | None = None,
    certs_out: str | Path | None = None,
    directory: str | Path = ".",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    clock: Callable[[], float] | None = None,
) -> SavedConsensus:
    """Fetch a verified ``flavour`` consensus and write it to ``output`` (default: ``default_name`` in
    ``directory``); with ``certs_out``, the key certificates that verified it go there first.

    ``certs`` seeds the client's certificates (tor's cached-certs), otherwise they are fetched from the
    authorities. ``clock`` (POSIX seconds) is the time certificates must be current at, the wall clock by
    default. Raises DirectoryError/DocumentError in one line; nothing is written then."""
    check_flavour(flavour)
    auths: Sequence[DirectoryAuthority | Endpoint | str] = list(authorities)
    # each authority is asked once, in random order, as tor does (no retries: the next one is the retry)
    with DirectoryClient(auths, timeout_s=timeout_s, retries=0, clock=clock) as client:
        if certs is not None:
            client.load_certificates(certs)
        doc, fetched = client.fetch_consensus_document(flavour)
        check = client.verify_consensus(doc, f"{fetched.endpoint.nickname} {fetched.url}")
        used = sorted({s.identity for s in check.signatures if s.ok})
        cert_text = "".join(client.certificates[i].text for i in used if i in client.certificates)
    path = Path(output) if output is not None else Path(directory) / default_name(flavour, doc.valid_after)
    if path.is_dir():
        raise DirectoryError(f"{path}: cannot write the consensus: it is a directory")
    wrote_certs = ""
    if certs_out is not None:
        write_atomic(certs_out, cert_text.encode("ascii"), "key certificates", DirectoryError)
        wrote_certs = str(certs_out)
    try:
        write_atomic(path, fetched.body, "consensus", DirectoryError)
    except BaseException:
        if wrote_certs:  # the pair or nothing
            with contextlib.suppress(OSError):
                os.unlink(wrote_certs)
        raise
    return SavedConsensus(str(path), flavour, fetched.endpoint.nickname, fetched.url, doc.valid_after,
                          doc.valid_until, doc.relay_count, check.summary(), len(fetched.body), wrote_certs)
