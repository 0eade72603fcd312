"""Relays of a real consensus (ns or microdesc flavour) as the population's value objects.

Parsed with kistexp's own document code (``kistexp.dirauth.documents.load_network_status``); the fields
are those of population.md §1.1. The microdesc flavour carries no ``p`` line (the summary lives in the
microdescriptor, which a consensus file does not include): there a relay with the Exit flag is taken to
accept ports 80 and 443 (what the flag requires, §1.3) and every other relay to reject all ports.

Capacity: a consensus gives only the weight B (kB/s, sbws-scaled). tornettools takes capacity from the
descriptors' observed bandwidth (§2.2). From a consensus alone we assume capacity = B x
``CAPACITY_PER_WEIGHT`` bytes/s, floored at tornettools' minimum BandwidthRate of 102,400 B/s (§2.6).
Factor 1000 (B in kB/s taken at face value): the shared consensus' ΣB = 94.1 GB/s = 753 Gbit/s, the order
of the advertised bandwidth Tor Metrics shows for 2022; refine with descriptors (population.md §8).

The default consensus is the one bundled with the package (``kistexp.population.bundled``: 2022-11-19 10:00,
checked against its authorities' certificates each time it is read); a path given by the user wins and is
checked against key certificates when they are given (``certs``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path

import attrs
import numpy as np

from kistexp.dirauth.authorities import AUTHORITY_SETS
from kistexp.dirauth.dirformat import MAX_DOCUMENT_BYTES
from kistexp.dirauth.documents import parse_key_certificates, parse_network_status, verify_signatures
from kistexp.dirauth.keys import KeyCertificate
from kistexp.dirauth.netstatus import NetworkStatus
from kistexp.errors import DocumentError, PopulationError
from kistexp.population.bundled import (
    BUNDLED_CERTS,
    BUNDLED_CONSENSUS,
    BUNDLED_CONSENSUS_AUTHORITIES,
    bundled_label,
    maybe_xz,
    read_bundled,
)
from kistexp.population.bwweights import BandwidthWeights, compute_weights, from_footer
from kistexp.population.policy import REJECT_ALL, PolicySummary, parse_policy_summary
from kistexp.safeio import read_bounded

#: ``None`` names the bundled consensus (kistexp/data/consensus-2022-11-19-10-00-00.xz).
DEFAULT_CONSENSUS = None
MAX_CERTS_BYTES = 1024 * 1024  # tor's cached-certs: about 21 KB for nine authorities
CAPACITY_PER_WEIGHT = 1000.0  # bytes/s of capacity per kB/s of consensus weight (assumption, see above)
MIN_CAPACITY = 102_400  # bytes/s, tornettools' floor for BandwidthRate

_MICRODESC_EXIT = PolicySummary(True, ((80, 80), (443, 443)))


@attrs.frozen
class Relay:
    nickname: str
    fingerprint: str  # upper hex identity
    address: str  # IPv4
    ipv6: str  # first "a" line address without brackets/port, "" if none
    flags: frozenset[str]
    bandwidth: int  # consensus weight B, kB/s
    unmeasured: bool
    version: str  # e.g. "0.4.7.10" ("" if the v line is missing or not "Tor ...")
    policy: PolicySummary
    capacity: float  # bytes/s, see module docstring

    @property
    def position_class(self) -> str:
        """D, G, E or M (population.md §1.4): BadExit relays are not exits."""
        exit_ok = "Exit" in self.flags and "BadExit" not in self.flags
        if "Guard" in self.flags:
            return "D" if exit_ok else "G"
        return "E" if exit_ok else "M"

    @property
    def subnet16(self) -> int:
        a, b, _, _ = (int(x) for x in self.address.split("."))
        return (a << 8) | b

    @property
    def subnet6_32(self) -> int:
        """The IPv6 /32 (tor's EnforceDistinctSubnets for IPv6), -1 without IPv6."""
        if not self.ipv6:
            return -1
        return int(ipaddress.IPv6Address(self.ipv6)) >> 96


def _version(v_line: str) -> str:
    name, _, rest = v_line.partition(" ")
    return rest.strip() if name == "Tor" else ""


def _ipv6(or_addresses: Sequence[str]) -> str:
    for a in or_addresses:
        if a.startswith("["):
            return a[1:a.index("]")]
    return ""


def capacity_estimate(bandwidth: int) -> float:
    return max(float(MIN_CAPACITY), bandwidth * CAPACITY_PER_WEIGHT)


@attrs.frozen(eq=False)
class Population:
    """A set of relays with the bandwidth weights clients use for them."""

    source: str
    relays: tuple[Relay, ...]
    weights: BandwidthWeights
    params: tuple[tuple[str, int], ...] = ()

    def __len__(self) -> int:
        return len(self.relays)

    # column views for vectorised path selection (built once)
    @cached_property
    def bandwidth(self) -> np.ndarray:
        return np.array([r.bandwidth for r in self.relays], dtype=np.float64)

    @cached_property
    def classes(self) -> np.ndarray:
        return np.array([r.position_class for r in self.relays])

    @cached_property
    def subnet16(self) -> np.ndarray:
        return np.array([r.subnet16 for r in self.relays], dtype=np.int64)

    @cached_property
    def subnet6(self) -> np.ndarray:
        return np.array([r.subnet6_32 for r in self.relays], dtype=np.int64)

    def has_flag(self, flag: str) -> np.ndarray:
        return np.array([flag in r.flags for r in self.relays], dtype=bool)

    def class_totals(self) -> dict[str, int]:
        totals = {c: 0 for c in ("G", "M", "E", "D")}
        for r in self.relays:
            totals[r.position_class] += r.bandwidth
        return totals

    def with_relays(self, relays: Sequence[Relay], source: str) -> Population:
        """A new population of ``relays`` with recomputed bandwidth weights (§1.4: a rescaled
        population must recompute them)."""
        sub = Population(source, tuple(relays), self.weights, self.params)
        return attrs.evolve(sub, weights=compute_weights(sub.class_totals(), self.weights.scale))


def population_from_status(doc: NetworkStatus) -> Population:
    if not doc.is_consensus:
        raise PopulationError(f"{doc.source}: is a vote, not a consensus")
    if doc.relay_count == 0:
        raise PopulationError(f"{doc.source}: consensus lists no relays")
    weights = from_footer(doc.bandwidth_weights, doc.source, doc.params_dict.get("bwweightscale", 10000))
    relays = []
    for rs in doc.routers:
        flags = frozenset(rs.flags)
        if doc.flavor == "ns":
            if not rs.exit_policy:
                raise PopulationError(f"{doc.source}: relay {rs.nickname} ({rs.identity}) has no p line")
            policy = parse_policy_summary(rs.exit_policy, f"{doc.source}: relay {rs.nickname} p line")
        else:
            policy = _MICRODESC_EXIT if "Exit" in flags else REJECT_ALL
        bw = rs.bandwidth if rs.bandwidth is not None else 0
        relays.append(Relay(
            nickname=rs.nickname, fingerprint=rs.identity, address=rs.address, ipv6=_ipv6(rs.or_addresses),
            flags=flags, bandwidth=bw, unmeasured=rs.unmeasured, version=_version(rs.version), policy=policy,
            capacity=capacity_estimate(bw),
        ))
    return Population(doc.source, tuple(relays), weights, doc.params)


def _read_consensus(path: str | Path | None) -> NetworkStatus:
    if path is None:
        data = read_bundled(BUNDLED_CONSENSUS, MAX_DOCUMENT_BYTES, "consensus", PopulationError)
        source = bundled_label(BUNDLED_CONSENSUS)
    else:
        source = str(path)
        raw = read_bounded(path, MAX_DOCUMENT_BYTES, "consensus", PopulationError)
        data = maybe_xz(raw, MAX_DOCUMENT_BYTES, source, "consensus", PopulationError)
    try:
        return parse_network_status(data, source)
    except DocumentError as exc:
        raise PopulationError(str(exc)) from None


def _read_certificates(path: str | Path | None) -> tuple[KeyCertificate, ...]:
    if path is None:
        data = read_bundled(BUNDLED_CERTS, MAX_CERTS_BYTES, "key certificates", PopulationError)
        source = bundled_label(BUNDLED_CERTS)
    else:
        source = str(path)
        raw = read_bounded(path, MAX_CERTS_BYTES, "key certificates", PopulationError)
        data = maybe_xz(raw, MAX_CERTS_BYTES, source, "key certificates", PopulationError)
    try:
        return parse_key_certificates(data, source)
    except DocumentError as exc:
        raise PopulationError(str(exc)) from None


def verify_consensus(doc: NetworkStatus, certs: Sequence[KeyCertificate], sets: Sequence[str]) -> None:
    """Accept ``doc`` if more than half of one pinned authority set (``AUTHORITY_SETS``) signed it with keys
    certified by ``certs`` at its valid-after; else one line naming the file and the count."""
    checks = []
    for name in sets:
        idents = [a.v3ident for a in AUTHORITY_SETS[name]]
        check = verify_signatures(doc, certs, n_authorities=len(idents), authorities=idents)
        if check.ok:
            return
        checks.append(check)
    best = max(checks, key=lambda c: c.valid)
    raise PopulationError(f"{doc.source}: consensus rejected (forged, altered or signed by other authorities): "
                          f"{best.summary()}")


def load_population(path: str | Path | None = None, *, certs: str | Path | None = None) -> Population:
    """Read a consensus: ``path`` (ns or microdesc, plain or xz), else the bundled 2022-11-19 ns consensus.

    With ``certs`` (e.g. tor's cached-certs) the consensus must carry valid signatures of more than half of
    a pinned authority set (``AUTHORITY_SETS``). Without, the bundled consensus is checked against its bundled
    certificates, and a user's file is parsed (a truncated or malformed one is refused) but not verified."""
    doc = _read_consensus(path)
    if certs is not None:
        verify_consensus(doc, _read_certificates(certs), list(AUTHORITY_SETS))
    elif path is None:
        verify_consensus(doc, _read_certificates(None), [BUNDLED_CONSENSUS_AUTHORITIES])
    return population_from_status(doc)
