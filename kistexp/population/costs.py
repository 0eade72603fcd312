"""What a relay's hardware profile makes of the simulator's counts: CPU, memory (population.md §6).

* CPU: the simulator's cost model (``kistexp.sim.costmodel.CostModel``) with the profile's per-operation
  costs: TLS per cell = 514 B x ``tls_byte_ns`` + a 31-cell record's share of ``tls_record_us``; one relay
  crypto layer = ``relay_cell_crypto_us`` (AES-CTR and the running digest); a KIST socket-info pair =
  ``kist_socket_info_us`` (two syscalls). Plus circuit creation, which the measured windows do not contain
  (circuits are built before the warm-up ends): each circuit through the relay is rebuilt every
  ``CIRCUIT_LIFETIME_S`` (MaxCircuitDirtiness, 10 minutes), one ntor server handshake each.
* RAM: process baseline + per circuit + per channel + the peak bytes queued in tor (population.md §6:
  46-70 MB baseline, ~3.3 KB per relayed circuit, 6-10 KB per channel idle, 528 B per queued cell).
"""

from __future__ import annotations

import attrs

from kistexp.population.classes import HardwareProfile
from kistexp.sim.costmodel import CELL_BYTES, CELL_PAYLOAD_BYTES, DEFAULT_COST_MODEL, CostModel

CELLS_PER_TLS_RECORD = 31  # a 16 KiB record holds 31 cells of 514 B
CIRCUIT_LIFETIME_S = 600.0
BASELINE_RSS_BYTES = 58e6  # middle of 46-70 MB
CIRCUIT_BYTES = 3_300
CHANNEL_BYTES = 8_000


def cost_model(profile: HardwareProfile) -> CostModel:
    tls_cell_ns = CELL_BYTES * profile.tls_byte_ns + profile.tls_record_us * 1000 / CELLS_PER_TLS_RECORD
    return attrs.evolve(
        DEFAULT_COST_MODEL,
        tls_aead_bytes_per_s=CELL_BYTES / (tls_cell_ns * 1e-9),
        aes_ctr_bytes_per_s=CELL_PAYLOAD_BYTES / (profile.relay_cell_crypto_us * 1e-6),
        per_syscall_ns=profile.kist_socket_info_us * 1000 / 2,
    )


def circuit_build_cpu(profile: HardwareProfile, circuits: int) -> float:
    """Share of a core spent on ntor handshakes for ``circuits`` kept circuits (fast field arithmetic off)."""
    return circuits / CIRCUIT_LIFETIME_S * profile.ntor_server_us * 1e-6


def rss_bytes(circuits: int, channels: int, peak_queued_bytes: float) -> float:
    return BASELINE_RSS_BYTES + circuits * CIRCUIT_BYTES + channels * CHANNEL_BYTES + peak_queued_bytes
