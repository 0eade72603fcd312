"""CPU-time estimate per node from a run's event counts.

The simulator counts what a relay does (cells received and sent, relay-crypto layers, scheduler
runs, socket-info syscalls, kernel writes); this module turns those counts into CPU seconds with a
linear cost model. Every default is an *estimate* with its source in the field's comment and in
docs/simulator.md ("Cost model"); all are overridable (``CostModel(per_syscall_ns=...)`` or
``attrs.evolve``).

Where the costs come from (kist-ewma.md §4, §6, §7.5):

* every cell received on a channel is TLS-decrypted, every cell sent TLS-encrypted (one AEAD pass
  over the 514-byte cell each way);
* every relay cell a node handles gets one AES-CTR layer per hop it adds or removes (one at a
  relay, one per hop at the origin), and a running SHA-1 digest where the cell is originated or
  recognised (the edges);
* each scheduler run costs a libevent dispatch plus its bookkeeping;
* KIST makes two syscalls per pending channel per run (getsockopt TCP_INFO + ioctl SIOCOUTQNSD,
  §7.5); KISTLite and Vanilla make none;
* each flush of an outbuf to the kernel is one write() syscall plus the kernel's per-byte copy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from kistexp import jsonout
from kistexp.errors import SimConfigError

if TYPE_CHECKING:
    from kistexp.sim.result import SimResult

CELL_BYTES = 514
"""Cell on the wire (kist-ewma.md §1)."""
CELL_PAYLOAD_BYTES = 509
"""Relay-crypto covers the 509-byte cell payload (kist-ewma.md §1)."""
WRITE_SHARE_CELLS = 32
"""Cells in one bucket-share-sized write call, 16448 B (kist-ewma.md §7.4)."""


def _non_negative(instance: object, attribute: attrs.Attribute, value: float) -> None:
    if not value >= 0:  # also rejects NaN
        raise SimConfigError(f"cost model: {attribute.name} must be >= 0, got {value!r}")


def _positive(instance: object, attribute: attrs.Attribute, value: float) -> None:
    if not value > 0:
        raise SimConfigError(f"cost model: {attribute.name} must be > 0, got {value!r}")


@attrs.frozen
class CostModel:
    """Per-operation CPU costs (all estimates, see the module docstring and docs/simulator.md).

    Throughputs are for 512-byte blocks, i.e. include the per-call set-up that a cell-sized
    operation pays.
    """

    # `openssl speed -evp aes-128-ctr -bytes 512` (OpenSSL 3.0, AES-NI) on the project's 2-core
    # test machine: 7.1 GB/s. Published AES-NI figures for 0.5-16 KiB blocks are 4-8 GB/s.
    aes_ctr_bytes_per_s: float = attrs.field(default=7.1e9, validator=_positive)
    # `openssl speed -evp sha1 -bytes 512`, same machine (SHA-NI): 1.3 GB/s. Published figures
    # without SHA extensions are 0.6-1 GB/s.
    sha1_bytes_per_s: float = attrs.field(default=1.3e9, validator=_positive)
    # TLS 1.3 link cipher (AES-256-GCM): `openssl speed -evp aes-256-gcm -bytes 512`, same
    # machine: 1.06 GB/s (small records pay GCM's per-call set-up).
    tls_aead_bytes_per_s: float = attrs.field(default=1.06e9, validator=_positive)
    # Non-crypto handling of one cell (parse, circuit lookup, queue append, EWMA pick, copy into
    # the outbuf). Estimate; consistent with the loopback measurement in real-tor.md, where each
    # tor process used at most ~35 % of a core at ~30 MB/s (~58,000 cells/s), i.e. <= ~6 us per
    # cell all-in.
    per_cell_handling_ns: float = attrs.field(default=1000.0, validator=_non_negative)
    # One scheduler run: libevent timer dispatch (an epoll_wait return) plus loop set-up.
    # Estimate: a null syscall measured 0.17 us on the test machine, libevent bookkeeping and
    # heap work a few times that.
    per_scheduler_run_ns: float = attrs.field(default=2000.0, validator=_non_negative)
    # One socket-info syscall. "Tor's Been KIST" (Jansen & Traudt 2017) reports ~1.08 us per
    # pending socket per run for the pair (kist-ewma.md §7.5); a C loop on the test machine
    # measured 0.63 us (TCP_INFO) + 0.34 us (SIOCOUTQNSD) = 0.97 us on loopback.
    per_syscall_ns: float = attrs.field(default=540.0, validator=_non_negative)
    # One write() of an outbuf to a TCP socket: fixed part. C loop on the test machine, loopback:
    # 1.09 us for 514 B, 1.85 us for 4112 B -> ~0.98 us fixed + ~0.2 ns per byte.
    per_write_ns: float = attrs.field(default=980.0, validator=_non_negative)
    per_write_byte_ns: float = attrs.field(default=0.21, validator=_non_negative)

    def cell_crypto_ns(self, *, layers: float, digests: float) -> float:
        """Relay-crypto time for one cell: `layers` AES-CTR passes plus `digests` SHA-1 updates."""
        aes = layers * CELL_PAYLOAD_BYTES / self.aes_ctr_bytes_per_s * 1e9
        sha = digests * CELL_PAYLOAD_BYTES / self.sha1_bytes_per_s * 1e9
        return aes + sha

    @property
    def tls_cell_ns(self) -> float:
        """TLS AEAD time for one 514-byte cell (one direction)."""
        return CELL_BYTES / self.tls_aead_bytes_per_s * 1e9

    @property
    def relay_cell_receive_ns(self) -> float:
        """A relay's work on a received cell before it is queued: TLS read, one AES layer, handling."""
        return self.tls_cell_ns + self.cell_crypto_ns(layers=1, digests=0) + self.per_cell_handling_ns

    @property
    def cell_send_ns(self) -> float:
        """Work on a sent cell inside the scheduler's pass: TLS write and its share of a write() call.

        A write call moves at most 32 cells on a rate-limited connection (kist-ewma.md §7.4).
        """
        return self.tls_cell_ns + CELL_BYTES * self.per_write_byte_ns + self.per_write_ns / WRITE_SHARE_CELLS


DEFAULT_COST_MODEL = CostModel()


@attrs.frozen
class NodeWork:
    """What one node did in a run: the inputs of the cost model.

    ``crypto_layers`` counts AES-CTR passes over cell payloads (one per relay cell at a relay, one
    per hop at the circuit's origin); ``digests`` counts SHA-1 digest updates (cells originated or
    recognised at an edge).
    """

    node: str
    cells_received: int
    cells_sent: int
    crypto_layers: int
    digests: int
    scheduler_runs: int
    socket_info_syscalls: int
    kernel_writes: int
    bytes_written: int


@jsonout.shape(omit=("duration_s",),
               derived={"cpu_s": lambda e: e.total_s, "cpu_core_fraction": lambda e: e.core_fraction},
               order=("node", "cpu_s", "cpu_core_fraction"))
@attrs.frozen
class NodeCpuEstimate:
    """Estimated CPU seconds of one node over a run, split by cause."""

    node: str
    duration_s: float
    tls_s: float
    relay_crypto_s: float
    cell_handling_s: float
    scheduler_s: float
    syscalls_s: float
    writes_s: float

    @property
    def total_s(self) -> float:
        return (
            self.tls_s + self.relay_crypto_s + self.cell_handling_s + self.scheduler_s
            + self.syscalls_s + self.writes_s
        )

    @property
    def core_fraction(self) -> float:
        """Share of one core the node needs (CPU seconds per simulated second)."""
        return self.total_s / self.duration_s if self.duration_s > 0 else 0.0


def estimate_node_cpu(
    work: NodeWork, duration_s: float, model: CostModel = DEFAULT_COST_MODEL
) -> NodeCpuEstimate:
    """Apply `model` to one node's counts over a run of `duration_s` simulated seconds."""
    if not duration_s >= 0:
        raise SimConfigError(f"cost model: duration_s must be >= 0, got {duration_s!r}")
    ns = 1e-9
    cells = work.cells_received + work.cells_sent
    return NodeCpuEstimate(
        node=work.node,
        duration_s=duration_s,
        tls_s=cells * model.tls_cell_ns * ns,
        relay_crypto_s=model.cell_crypto_ns(layers=work.crypto_layers, digests=work.digests) * ns,
        cell_handling_s=work.cells_received * model.per_cell_handling_ns * ns,
        scheduler_s=work.scheduler_runs * model.per_scheduler_run_ns * ns,
        syscalls_s=work.socket_info_syscalls * model.per_syscall_ns * ns,
        writes_s=(work.kernel_writes * model.per_write_ns + work.bytes_written * model.per_write_byte_ns)
        * ns,
    )


def result_node_cpu(result: SimResult, node: int | str, model: CostModel = DEFAULT_COST_MODEL) -> NodeCpuEstimate:
    """Apply `model` to one node of a finished run (its counters, over the run's duration)."""
    counts = result.node_counts(node)
    fields = [f.name for f in attrs.fields(NodeWork) if f.name != "node"]
    work = NodeWork(node=result.node_names[result.node_index(node)], **{k: counts[k] for k in fields})
    return estimate_node_cpu(work, result.duration_s, model)
