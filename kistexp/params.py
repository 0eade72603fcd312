"""Catalogue of Tor consensus parameters relevant to kistexp experiments.

Each entry records the default, the bounds tor clamps a consensus value to, the unit,
a one-line meaning, and the tor versions the bounds hold for. Sources: tor's code as
summarised in kist-ewma.md §14 (scheduling, EWMA, flow/congestion control, conflux,
circuit build timeout) and dirspec-params.md §1-§4 (voting-related parameters), plus
torspec's param-spec for the few parameters those do not cover.

tor reads a parameter with ``networkstatus_get_param(ns, name, default, min, max)``:
absent -> default; below min -> raised to min; above max -> lowered to max (each with a
warning). Bounds are per call site, so they can change between tor versions
(KISTSchedRunInterval did in 0.4.8.2-alpha, bug 40808).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

import attrs

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)


# --- tor versions -----------------------------------------------------------------

_VERSION_RE = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:\.(\d+))?(?:-([A-Za-z0-9.-]+))?\Z")


@attrs.frozen(order=True)
class TorVersion:
    """A tor version such as 0.4.8.2-alpha; ordering ignores the status tag."""

    major: int
    minor: int
    micro: int
    patch: int = 0
    status: str = attrs.field(default="", eq=False, order=False)

    @classmethod
    def parse(cls, text: str) -> TorVersion:
        m = _VERSION_RE.match(text.strip())
        if not m:
            raise ValueError(f"{text!r} is not a tor version (expected e.g. 0.4.8.2 or 0.4.8.2-alpha)")
        major, minor, micro, patch, status = m.groups()
        return cls(int(major), int(minor), int(micro), int(patch or 0), status or "")

    def __str__(self) -> str:
        base = f"{self.major}.{self.minor}.{self.micro}.{self.patch}"
        return f"{base}-{self.status}" if self.status else base


LOWEST_VERSION = TorVersion(0, 0, 0, 0)
HIGHEST_VERSION = TorVersion(99, 99, 99, 99)


@attrs.frozen
class VersionRange:
    """Inclusive range of tor versions [low, high]."""

    low: TorVersion = LOWEST_VERSION
    high: TorVersion = HIGHEST_VERSION

    def overlaps(self, other: VersionRange) -> bool:
        return self.low <= other.high and other.low <= self.high

    def contains(self, version: TorVersion) -> bool:
        return self.low <= version <= self.high

    def __str__(self) -> str:
        if self.low == LOWEST_VERSION and self.high == HIGHEST_VERSION:
            return "all versions"
        if self.high == HIGHEST_VERSION:
            return f">= {self.low}"
        if self.low == LOWEST_VERSION:
            return f"<= {self.high}"
        return f"{self.low} .. {self.high}"


def parse_version_range(spec: str) -> VersionRange:
    """Parse ``">=0.4.8.2, <0.4.10"`` (comma-separated >=, >, <=, <, == clauses).

    ``<X`` is made inclusive as the version just below X (patch - 1 or the previous
    micro's highest patch), which is exact for tor's four-number versions.
    """
    low, high = LOWEST_VERSION, HIGHEST_VERSION
    clauses = [c.strip() for c in spec.split(",") if c.strip()]
    if not clauses:
        raise ValueError("empty tor version range")
    for clause in clauses:
        m = re.match(r"^(>=|<=|==|>|<|=)?\s*(\S+)\Z", clause)
        if not m:
            raise ValueError(f"{clause!r} is not a version clause (use e.g. >=0.4.8.2)")
        op, ver = m.group(1) or "==", TorVersion.parse(m.group(2))
        if op in (">=",):
            low = max(low, ver)
        elif op == ">":
            low = max(low, _next_version(ver))
        elif op == "<=":
            high = min(high, ver)
        elif op == "<":
            high = min(high, _previous_version(ver))
        else:
            low, high = max(low, ver), min(high, ver)
    if low > high:
        raise ValueError(f"tor version range {spec!r} is empty")
    return VersionRange(low, high)


def _next_version(v: TorVersion) -> TorVersion:
    return TorVersion(v.major, v.minor, v.micro, v.patch + 1)


def _previous_version(v: TorVersion) -> TorVersion:
    if v.patch > 0:
        return TorVersion(v.major, v.minor, v.micro, v.patch - 1)
    if v.micro > 0:
        return TorVersion(v.major, v.minor, v.micro - 1, 99999)
    if v.minor > 0:
        return TorVersion(v.major, v.minor - 1, 99999, 99999)
    return TorVersion(max(v.major - 1, 0), 99999, 99999, 99999)


# --- parameters -----------------------------------------------------------------------


@attrs.frozen
class Bounds:
    """Default and clamp bounds that hold for a range of tor versions."""

    default: int
    minimum: int
    maximum: int
    versions: VersionRange = VersionRange()
    note: str = ""  # e.g. "0 = do not use KIST"

    def clamp(self, value: int) -> int:
        return min(max(value, self.minimum), self.maximum)


@attrs.frozen
class ConsensusParam:
    """One consensus parameter as tor reads it."""

    name: str
    unit: str
    meaning: str
    bounds: tuple[Bounds, ...]
    read_by: str = "relays and clients"  # who calls networkstatus_get_param for it
    torrc_override: str = ""  # how a torrc option overrides the consensus value
    source: str = "kist-ewma.md §14"
    category: str = "scheduling"

    def bounds_for(self, version: TorVersion) -> Bounds | None:
        for b in self.bounds:
            if b.versions.contains(version):
                return b
        return None

    def bounds_in(self, versions: VersionRange) -> tuple[Bounds, ...]:
        """Every bounds entry that applies somewhere in ``versions``."""
        return tuple(b for b in self.bounds if b.versions.overlaps(versions))

    @property
    def current(self) -> Bounds:
        """The bounds of the newest tor versions."""
        return max(self.bounds, key=lambda b: b.versions.high)


def _p(name: str, default: int, minimum: int, maximum: int, unit: str, meaning: str, **kw) -> ConsensusParam:
    note = kw.pop("note", "")
    return ConsensusParam(name, unit, meaning, (Bounds(default, minimum, maximum, note=note),), **kw)


_V0482 = TorVersion(0, 4, 8, 2)
_V0481 = TorVersion(0, 4, 8, 1)
_V0320 = TorVersion(0, 3, 2, 0)

_KIST_MEANING = "how often the KIST/KISTLite cell scheduler runs"
#: who reads the Arti-only parameters: Arti clients; no C tor version calls networkstatus_get_param for them
ARTI_ONLY = "Arti clients only (C tor never reads it)"
ARTI_SOURCE = ("arti crates/tor-netdir/src/params.rs (NetParameters kist_enabled, kist_tcp_notsent_lowat), "
               "crates/tor-chanmgr/src/mgr/state.rs, crates/tor-proto/src/channel/reactor.rs")

CATALOGUE: tuple[ConsensusParam, ...] = (
    # -- KIST scheduler (kist-ewma.md §5.1, dirspec-params.md §4)
    ConsensusParam(
        "KISTSchedRunInterval", "ms", f"{_KIST_MEANING} on relays and bridges",
        (
            Bounds(10, 0, 100, VersionRange(_V0320, _V0481), "0 = do not use KIST (falls to KISTLite)"),
            Bounds(2, 2, 100, VersionRange(_V0482, HIGHEST_VERSION), "0 and 1 are raised to 2 (bug 40808)"),
        ),
        read_by="relays and bridges (server mode); clients too before 0.4.8.2",
        torrc_override="torrc KISTSchedRunInterval: any non-zero value (1..100 ms) wins; the consensus is "
        "then never consulted",
        source="kist-ewma.md §5.1; scheduler_kist.c kist_scheduler_run_interval",
    ),
    ConsensusParam(
        "KISTSchedRunIntervalClient", "ms", f"{_KIST_MEANING} on clients and onion services without ORPort",
        (Bounds(2, 2, 100, VersionRange(_V0482, HIGHEST_VERSION)),),
        read_by="clients (0.4.8.2-alpha and later)",
        torrc_override="torrc KISTSchedRunInterval: any non-zero value wins",
        source="kist-ewma.md §5.1; bug 40808",
    ),
    # -- EWMA circuit priority (kist-ewma.md §11.2)
    _p("CircuitPriorityHalflifeMsec", 30000, 1, INT32_MAX, "ms", "EWMA half-life of circuit cell counts",
       torrc_override="torrc CircuitPriorityHalflife (seconds) wins when >= -1e-5 (default -1 = use consensus)",
       source="kist-ewma.md §11.2"),
    _p("CircuitPriorityTickSecs", 10, 1, 600, "s", "EWMA rescaling tick length",
       source="kist-ewma.md §11.2 (absent from param-spec)"),
    # -- flow control and queues (kist-ewma.md §13, §14)
    _p("circwindow", 1000, 100, 1000, "cells", "initial circuit package window (legacy SENDME)",
       category="flow control"),
    _p("sendme_emit_min_version", 1, 0, 255, "version", "minimum SENDME version to send", category="flow control"),
    _p("sendme_accept_min_version", 0, 0, 255, "version", "minimum SENDME version to accept",
       category="flow control"),
    _p("cellq_high", 256, 1, 1000, "cells", "circuit queue length at which edge streams stop reading",
       category="flow control"),
    _p("cellq_low", 10, 1, 1000, "cells", "circuit queue length at which blocked edge streams resume",
       category="flow control"),
    _p("orconn_high", 32768, 509, INT32_MAX, "bytes", "OR outbuf high watermark (Vanilla/KISTLite budget)"),
    _p("orconn_low", 16384, 509, INT32_MAX, "bytes", "OR outbuf level below which a channel wants writes"),
    _p("circ_max_cell_queue_size", 2500, 50, INT32_MAX, "cells",
       "hard per-circuit queue cap (inbound); the circuit is closed beyond it", category="flow control"),
    _p("circ_max_cell_queue_size_out", 2500, 50, INT32_MAX, "cells",
       "hard per-circuit queue cap (outbound)", category="flow control",
       note="default = circ_max_cell_queue_size"),
    _p("perconnbwrate", 1073741824, 1, INT32_MAX, "bytes/s", "relay per-client-connection token bucket rate",
       note="default = torrc BandwidthRate (1 GB)", read_by="relays"),
    _p("perconnbwburst", 1073741824, 1, INT32_MAX, "bytes", "relay per-client-connection token bucket burst",
       note="default = torrc BandwidthBurst (1 GB)", read_by="relays"),
    # -- congestion control (kist-ewma.md §13.2, §14; 0.4.8.2+ defaults)
    _p("cc_alg", 2, 0, 3, "enum", "congestion control algorithm: 0 fixed SENDME, 2 Vegas (1 and 3 become 2)",
       category="congestion control"),
    _p("cc_sendme_inc", 31, 1, 254, "cells", "DATA cells per SENDME on congestion-controlled circuits",
       category="congestion control"),
    _p("cc_cwnd_init", 124, 31, 10000, "cells", "initial congestion window", category="congestion control"),
    _p("cc_cwnd_min", 124, 31, 1000, "cells", "floor for the congestion window", category="congestion control"),
    _p("cc_cwnd_max", INT32_MAX, 500, INT32_MAX, "cells", "cap on the congestion window",
       category="congestion control"),
    _p("cc_cwnd_inc", 1, 1, 1000, "cells", "steady-state congestion window step", category="congestion control"),
    _p("cc_cwnd_inc_pct_ss", 100, 1, 500, "%", "slow-start increment as a percentage of cc_sendme_inc",
       category="congestion control"),
    _p("cc_cwnd_inc_rate", 31, 1, 250, "-", "steady-state updates happen every cwnd/(rate*sendme_inc) SENDMEs",
       category="congestion control"),
    _p("cc_ss_max", 5000, 500, INT32_MAX, "cells", "hard cwnd cap that ends slow start",
       category="congestion control"),
    _p("cc_sscap_exit", 600, 100, INT32_MAX, "cells", "limited slow-start cap, exit circuits",
       category="congestion control"),
    _p("cc_sscap_onion", 475, 100, INT32_MAX, "cells", "limited slow-start cap, onion circuits",
       category="congestion control"),
    _p("cc_sscap_sbws", 400, 100, INT32_MAX, "cells", "limited slow-start cap, bandwidth-scanner circuits",
       category="congestion control"),
    _p("cc_vegas_alpha_exit", 186, 0, 1000, "cells", "Vegas: grow below this queue use (exit)",
       category="congestion control"),
    _p("cc_vegas_alpha_onion", 186, 0, 1000, "cells", "Vegas: grow below this queue use (onion)",
       category="congestion control"),
    _p("cc_vegas_alpha_sbws", 93, 0, 1000, "cells", "Vegas: grow below this queue use (sbws)",
       category="congestion control"),
    _p("cc_vegas_beta_exit", 248, 0, 1000, "cells", "Vegas: shrink above this queue use (exit)",
       category="congestion control"),
    _p("cc_vegas_beta_onion", 372, 0, 1000, "cells", "Vegas: shrink above this queue use (onion)",
       category="congestion control"),
    _p("cc_vegas_beta_sbws", 155, 0, 1000, "cells", "Vegas: shrink above this queue use (sbws)",
       category="congestion control"),
    _p("cc_vegas_gamma_exit", 186, 0, 1000, "cells", "Vegas: slow-start exit threshold (exit)",
       category="congestion control"),
    _p("cc_vegas_gamma_onion", 248, 0, 1000, "cells", "Vegas: slow-start exit threshold (onion)",
       category="congestion control"),
    _p("cc_vegas_gamma_sbws", 124, 0, 1000, "cells", "Vegas: slow-start exit threshold (sbws)",
       category="congestion control"),
    _p("cc_vegas_delta_exit", 310, 0, INT32_MAX, "cells", "Vegas: hard drop to bdp + delta (exit)",
       category="congestion control"),
    _p("cc_vegas_delta_onion", 434, 0, INT32_MAX, "cells", "Vegas: hard drop to bdp + delta (onion)",
       category="congestion control"),
    _p("cc_vegas_delta_sbws", 248, 0, INT32_MAX, "cells", "Vegas: hard drop to bdp + delta (sbws)",
       category="congestion control"),
    _p("cc_cwnd_full_gap", 4, 0, 32767, "sendme_inc", "slack for declaring the cwnd full",
       category="congestion control"),
    _p("cc_cwnd_full_minpct", 25, 0, 100, "%", "below this share in flight the cwnd is not full",
       category="congestion control"),
    _p("cc_cwnd_full_per_cwnd", 1, 0, 1, "bool", "reset the cwnd-full flag once per cwnd (1) or per update (0)",
       category="congestion control"),
    _p("cc_bwe_min", 5, 2, 20, "SENDMEs", "minimum SENDMEs before BDP estimates", category="congestion control"),
    _p("cc_ewma_cwnd_pct", 50, 1, 255, "%", "N-EWMA length as a percentage of the update rate",
       category="congestion control"),
    _p("cc_ewma_max", 10, 2, INT32_MAX, "SENDMEs", "cap on the N-EWMA length", category="congestion control"),
    _p("cc_ewma_ss", 2, 2, INT32_MAX, "SENDMEs", "N-EWMA length in slow start", category="congestion control"),
    _p("cc_rtt_reset_pct", 100, 0, 100, "%", "min_rtt reset mix when cwnd hits the floor",
       category="congestion control"),
    _p("cc_xoff_client", 500, 1, 10000, "cells", "client edge outbuf level that triggers XOFF",
       category="congestion control"),
    _p("cc_xoff_exit", 500, 1, 10000, "cells", "exit edge outbuf level that triggers XOFF",
       category="congestion control"),
    _p("cc_xon_rate", 500, 1, 5000, "cells", "XON rate granularity", category="congestion control"),
    _p("cc_xon_change_pct", 25, 1, 99, "%", "drain-rate change that triggers an advisory XON",
       category="congestion control"),
    _p("cc_xon_ewma_cnt", 2, 2, 100, "samples", "drain-rate EWMA length", category="congestion control"),
    # -- conflux
    _p("cfx_enabled", 1, 0, 1, "bool", "conflux (multi-leg circuits) enabled", category="conflux"),
    _p("cfx_low_exit_threshold", 6000, 0, 10000, "1/10000", "exit-fraction threshold for using conflux",
       category="conflux"),
    # -- circuit build timeout (path-spec §2.4.5)
    _p("cbtdisabled", 0, 0, 1, "bool", "disable circuit-build-time learning", category="circuit build timeout",
       read_by="clients"),
    _p("cbtnummodes", 10, 1, 20, "modes", "modes averaged for the Pareto Xm", category="circuit build timeout",
       read_by="clients"),
    _p("cbtrecentcount", 20, 3, 1000, "circuits", "window for the timeout-rate check",
       category="circuit build timeout", read_by="clients"),
    _p("cbtmaxtimeouts", 18, 3, 10000, "circuits", "timeouts in the window that reset learning",
       category="circuit build timeout", read_by="clients"),
    _p("cbtmincircs", 100, 1, 10000, "circuits", "build times needed before computing a timeout",
       category="circuit build timeout", read_by="clients"),
    _p("cbtquantile", 80, 10, 99, "%", "quantile used as the timeout", category="circuit build timeout",
       read_by="clients"),
    _p("cbtclosequantile", 99, 10, 99, "%", "quantile for actually closing circuits",
       category="circuit build timeout", read_by="clients", note="minimum is max(10, cbtquantile)"),
    _p("cbttestfreq", 10, 1, INT32_MAX, "s", "test-circuit frequency while learning",
       category="circuit build timeout", read_by="clients"),
    _p("cbtmintimeout", 10, 10, INT32_MAX, "ms", "minimum circuit build timeout",
       category="circuit build timeout", read_by="clients"),
    _p("cbtinitialtimeout", 60000, 10, INT32_MAX, "ms", "timeout before enough build times are known",
       category="circuit build timeout", read_by="clients", note="minimum is cbtmintimeout"),
    _p("cbtlearntimeout", 180, 10, 60000, "s", "idle-circuit lifetime while learning",
       category="circuit build timeout", read_by="clients"),
    _p("cbtmaxopencircs", 10, 0, 14, "circuits", "maximum unused open circuits while learning",
       category="circuit build timeout", read_by="clients"),
    # -- voting and directory (dirspec-params.md §1.2, §1.3, §3; param-spec §3, §5)
    _p("AuthDirMaxServersPerAddr", 2, 0, INT32_MAX, "relays",
       "relays per IP address an authority lists; appended to the vote by every authority that sets "
       "ConsensusParams", category="voting", read_by="authorities", source="dirspec-params.md §1.2"),
    _p("AuthDirNumSRVAgreements", 6, 1, INT32_MAX, "votes",
       "agreeing votes needed for a fresh shared-random value", category="voting", read_by="authorities",
       note="default floor(2N/3) of the N authorities (6 of 9)", source="dirspec-params.md §1.3; param-spec §3"),
    _p("bwweightscale", 10000, 1, INT32_MAX, "-", "value bandwidth-weights are divided by", category="voting",
       source="param-spec §3"),
    _p("try-diff-for-consensus-newer-than", 72, 0, 8192, "hours",
       "how old a held consensus may be for a client to ask for a diff", category="directory",
       source="dirspec-params.md §3; param-spec §5"),
    _p("max-consensus-age-to-cache-for-diff", 72, 0, 8192, "hours",
       "consensus history relays keep to serve diffs", category="directory", source="param-spec §5",
       read_by="relays"),
    _p("UseOptimisticData", 1, 0, 1, "bool", "clients may send data before RELAY_CONNECTED",
       category="network", source="param-spec §1", read_by="clients"),
    _p("NumNTorsPerTAP", 10, 1, 100000, "handshakes", "ntor handshakes per TAP handshake when balancing",
       category="network", source="param-spec §2", read_by="relays"),
    _p("ExtendByEd25519ID", 0, 0, 1, "bool", "clients include Ed25519 identities in EXTEND2",
       category="network", source="param-spec §1", read_by="clients"),
    # -- Arti's own KIST (kistexp/population/arti.py holds what Arti does with them). Arti reads
    # them into tor-units BoundedInt32 values and clamps an out-of-range value to the bound; C tor
    # reads neither, and Arti reads neither KISTSchedRunInterval nor KISTSchedRunIntervalClient.
    _p("kist-enabled", 0, 0, 1, "enum", "Arti's KIST on its channels: 0 off, 1 TCP_NOTSENT_LOWAT on each "
       "channel's socket (Linux only)", category="arti", read_by=ARTI_ONLY,
       note="Arti's bounds (BoundedInt32<0, 1>); C tor ignores it", source=ARTI_SOURCE),
    _p("kist-tcp-notsent-lowat", 1, 1, INT32_MAX, "bytes", "the TCP_NOTSENT_LOWAT Arti sets on each channel's "
       "socket while kist-enabled=1 (kist-enabled=0 sets 4294967295, the kernel's no-limit value)",
       category="arti", read_by=ARTI_ONLY,
       note="Arti's bounds (BoundedInt32<1, INT32_MAX>); C tor ignores it", source=ARTI_SOURCE),
)

_BY_NAME = {p.name: p for p in CATALOGUE}


def get(name: str) -> ConsensusParam | None:
    """The catalogue entry for ``name`` (case-sensitive, as tor matches keywords)."""
    return _BY_NAME.get(name)


def names() -> tuple[str, ...]:
    return tuple(_BY_NAME)


def suggest(name: str, candidates: Iterable[str] | None = None) -> str | None:
    """The closest known parameter name, for did-you-mean messages (case-insensitive)."""
    pool = list(candidates if candidates is not None else _BY_NAME)
    lowered = {c.lower(): c for c in pool}
    if name.lower() in lowered:
        return lowered[name.lower()]
    close = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[close[0]] if close else None


@attrs.frozen
class ClampResult:
    """What a tor of a given version does with a consensus value."""

    value: int  # the value tor runs with
    clamped: bool
    bounds: Bounds


def effective_value(name: str, consensus_value: int | None, version: TorVersion,
                    torrc_value: int | None = None) -> ClampResult:
    """The value a tor of ``version`` runs with (dirspec-params.md §4).

    ``consensus_value`` None means the key is absent (default applies). A torrc override
    is honoured for the parameters whose entry names one (KIST: any non-zero value wins).
    """
    param = _BY_NAME[name]
    bounds = param.bounds_for(version)
    if bounds is None:
        raise ValueError(f"{name} is not read by tor {version}")
    if torrc_value and param.torrc_override:
        return ClampResult(torrc_value, False, bounds)
    if consensus_value is None:
        return ClampResult(bounds.default, False, bounds)
    value = bounds.clamp(consensus_value)
    return ClampResult(value, value != consensus_value, bounds)
