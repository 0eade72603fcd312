"""Throughput fingerprinting: which relay carries a target flow, from probes' throughput over time.

Source: Mittal, Khurshid, Juen, Caesar, Borisov, "Stealthy Traffic Analysis of Low-Latency Anonymous
Communication Using Throughput Fingerprinting", ACM CCS 2011 (the spec, §1).  The attacker (a malicious
server, seeing the target's throughput) measures through probe circuits the throughput each candidate
relay gives over time and correlates it with the target's; relays on the target's path correlate.

Here: ``add_probes`` puts one probe per candidate relay into a simulated network: an attacker's client
next to the relay, with a one-hop circuit to it (the relay is the probe's exit) and one long download
from ``start_s`` (a backlogged stream, what a throughput probe is), labelled ``probe``.  The probes
are part of the simulated network: they load the relays they measure, in every stage alike.
``fingerprinting`` then takes, per target circuit, the Pearson correlation (1 s windows) of the target's
cells leaving its exit with the cells each probe's client receives, and reports

* the separation (AUC) of the correlation through the target's **guard** (on its path) from that
  through **a random probed relay not on its path**, by the absolute correlation (the attacker may
  see a flow take throughput from a probe, a negative correlation, or share its congestion, a
  positive one): P(|r_on| > |r_off|), ties half (Mann-Whitney U / (n_on n_off));
* the entropy (bits) of the attacker's posterior over the guard candidates (every probed relay
  but the target's exit, which the server knows) before (the prior: uniform, or ``prior_weights``)
  and after ranking by correlation: posterior proportional to prior x f_on(r) / f_off(r), with f_on and
  f_off Gaussian kernel density estimates (``scipy.stats.gaussian_kde``) of the correlations through
  targets' guards and through candidates off their paths, fitted on all targets of the trace (an
  attacker that has trained on this network: its best case); and the share of targets whose guard
  ranks first.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import attrs
import numpy as np
from scipy import stats

from kistexp.errors import AnonymityError
from kistexp.sim import CircuitTrace, LinkConfig, Network, NodeConfig

PROBE_LABEL = "probe"
#: one download that outlasts any run (the probe stays backlogged), within the simulator's limit of
#: 2**31 - 1 cells a direction
PROBE_BYTES = 1_000_000_000_000


def add_probes(net: Network, relays: Sequence[int], *, start_s: float = 0.0, rtt_ms: float = 20.0,
               nic_rate_bytes_per_s: float = 125e6, scheduler: str = "kist",
               response_bytes: int = PROBE_BYTES) -> dict[int, int]:
    """One probe per relay of ``relays`` (see the module docstring); returns relay node -> probe circuit."""
    out: dict[int, int] = {}
    for r in dict.fromkeys(int(x) for x in relays):
        client = net.add_node(NodeConfig(role="client", scheduler=scheduler, kist_interval_ms=2,
                                         nic_rate_bytes_per_s=nic_rate_bytes_per_s), name=f"probe-{r}")
        net.add_channel(client, r, LinkConfig(rtt_ms=rtt_ms))
        c = net.add_circuit([client, r], label=PROBE_LABEL)
        net.add_transfers([c], [498], [response_bytes], [start_s])
        out[r] = c
    return out


@attrs.frozen
class Fingerprinting:
    window_s: float
    targets: int
    candidates: float  # mean guard candidates per target
    auc: float  # P(|r| through the guard > |r| through a random off-path relay)
    median_r_on: float
    median_r_off: float
    entropy_before_bits: float  # median over targets
    entropy_after_bits: float  # median over targets
    guard_top1: float  # share of targets whose guard has the highest posterior
    r_on: np.ndarray = attrs.field(repr=False, eq=False)
    r_off: np.ndarray = attrs.field(repr=False, eq=False)

    @property
    def entropy_reduction_bits(self) -> float:
        return self.entropy_before_bits - self.entropy_after_bits


def _pearson_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson's r of every row of ``a`` with every row of ``b`` (``scipy.stats.pearsonr`` broadcast)."""
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.ConstantInputWarning)  # nan, which the caller leaves out
        return stats.pearsonr(a[:, None, :], b[None, :, :], axis=-1).statistic


def fingerprinting(trace: CircuitTrace, probes: Mapping[int, int], *, targets: Sequence[int] | None = None,
                   window_s: float = 1.0, seed: int = 0,
                   prior_weights: Mapping[int, float] | None = None) -> Fingerprinting:
    """The measure of the module docstring for ``targets`` (circuit ids; by default every traced circuit
    that is not a probe and whose guard is probed), with ``probes`` as ``add_probes`` returned them."""
    relays = np.array(sorted(probes), np.int64)
    probe_rows = np.array([trace.index(probes[int(r)]) for r in relays], np.int64)
    if targets is None:
        probe_set = set(int(probes[int(r)]) for r in relays)
        targets = [int(c) for c, p in zip(trace.circuits, trace.paths, strict=True)
                   if int(c) not in probe_set and len(p) >= 3 and p[1] in probes]
    rows = np.array([trace.index(int(c)) for c in targets], np.int64)
    target_tp = trace.rebinned("exit_out_down", window_s)[rows].astype(np.float64)
    probe_tp = trace.rebinned("client_in_down", window_s)[probe_rows].astype(np.float64)
    if target_tp.shape[1] < 3:
        raise AnonymityError(f"throughput fingerprinting: the trace spans {trace.duration_s:g} s, fewer than "
                             f"3 windows of {window_s:g} s")
    steady = np.ptp(probe_tp, axis=1) == 0  # a probe whose throughput never moved measures nothing
    relays, probe_tp = relays[~steady], probe_tp[~steady]
    probes = {int(x): probes[int(x)] for x in relays}
    r = _pearson_matrix(target_tp, probe_tp)  # [target, probed relay]
    rng = np.random.default_rng(seed)
    kept = []  # (target, candidates mask, the guard's column)
    r_on, r_off, off_all = [], [], []
    for t, row in enumerate(rows):
        path = trace.paths[row]
        if path[1] not in probes or not np.isfinite(r[t]).all():
            continue  # no (working) probe at its guard, or a target without varying throughput
        off = (relays != path[-1]) & ~np.isin(relays, path)
        if not off.any():
            continue
        on = int(np.nonzero(relays == path[1])[0][0])
        kept.append((t, relays != path[-1], on))
        r_on.append(float(r[t, on]))
        r_off.append(float(r[t, rng.choice(np.nonzero(off)[0])]))
        off_all.extend(r[t, off])
    n = len(kept)
    if n < 5:
        raise AnonymityError(f"throughput fingerprinting: {n} targets with a probed guard and varying "
                             "throughput; at least 5 are needed")
    auc = float(stats.mannwhitneyu(np.abs(r_on), np.abs(r_off)).statistic / (n * n))
    try:
        f_on, f_off = stats.gaussian_kde(np.array(r_on)), stats.gaussian_kde(np.array(off_all))
    except (np.linalg.LinAlgError, ValueError) as e:
        raise AnonymityError(f"throughput fingerprinting: the correlations cannot be smoothed ({e})") from e
    rows_kept = np.array([t for t, _, _ in kept])
    lr = (f_on(r[rows_kept].ravel()) / np.maximum(f_off(r[rows_kept].ravel()), 1e-300)).reshape(n, -1)
    before, after, top1 = [], [], []
    for k, (_, cand, on) in enumerate(kept):
        prior = np.ones(int(cand.sum())) if prior_weights is None else \
            np.array([prior_weights.get(int(x), 0.0) for x in relays[cand]], np.float64)
        post = prior * lr[k, cand]
        before.append(stats.entropy(prior, base=2))
        after.append(stats.entropy(post, base=2) if post.sum() > 0 else 0.0)
        top1.append(relays[cand][int(np.argmax(post))] == relays[on])
    return Fingerprinting(window_s, n, float(np.mean([c.sum() for _, c, _ in kept])), auc,
                          float(np.median(r_on)), float(np.median(r_off)), float(np.median(before)),
                          float(np.median(after)), float(np.mean(top1)), np.array(r_on), np.array(r_off))
