"""The directory client: fetching and checking what directory authorities serve on their DirPorts.

``client`` is the client (``DirectoryClient``) and ``authorities_status``; ``transport`` bounds each
request in time and size and retries it; ``decode`` decodes a body under the decompression guard. The
names importers use are re-exported here (``from kistexp.directory import DirectoryClient``). The
report of ``kistexp authorities status`` (votes, consensus values, tor's tally) is
``kistexp.dirauth.tally``'s: the authorities' model, which does no HTTP.
"""

from kistexp.directory.client import (
    CONSENSUS_PATHS,
    MAX_AUTHORITIES,
    MAX_TIMEOUT_S,
    DirectoryClient,
    Endpoint,
    Fetched,
    authorities_status,
    check_flavour,
    parse_authority_spec,
)
from kistexp.directory.decode import ACCEPT_ENCODINGS, BOMB_CHECK_AFTER_BYTES, BOMB_MAX_RATIO, detect_compression
from kistexp.directory.transport import MAX_HEADER_BYTES, MAX_HEADERS, MAX_RETRIES, Limits

__all__ = [
    "ACCEPT_ENCODINGS",
    "BOMB_CHECK_AFTER_BYTES",
    "BOMB_MAX_RATIO",
    "CONSENSUS_PATHS",
    "MAX_AUTHORITIES",
    "MAX_HEADERS",
    "MAX_HEADER_BYTES",
    "MAX_RETRIES",
    "MAX_TIMEOUT_S",
    "DirectoryClient",
    "Endpoint",
    "Fetched",
    "Limits",
    "authorities_status",
    "check_flavour",
    "detect_compression",
    "parse_authority_spec",
]
