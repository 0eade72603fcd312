"""Stage predictions for a plan: baseline and every stage on independently sampled networks.

The plan comes as the runs it makes (``kistexp.population.stageruns.StageRuns``, from
``kistexp.plan.model.Plan.stage_runs``). For each seed of the plan's ``[simulation]`` table a network
is sampled at ``population_scale`` (``kistexp.population.sampling``) and built with the same clients,
paths and traffic for every run (``kistexp.population.simnet``: common random numbers, so stages differ
only by their values). Each change
of values the plan makes (baseline -> first stage, stage -> next stage; switchback: baseline -> treatment
-> control) is **one steppable run** (``kistexp.sim.Simulation``) of the plan's duration:

    [0, warm-up)          excluded from every measurement
    [warm-up, a)          the old values
    [a, b)                each relay and client switches at its own time (kistexp.population.adoption,
                          compressed onto the window)       -> "transition:<stage>"
    [b, end)              the new values everywhere          -> the stage

plus one run with the baseline values throughout, whose [b, end) window is the baseline and whose [a, b)
window is stored as "transition:baseline", the reference for transition figures. Stages are thus always
compared over the same span of simulated time: traffic is not stationary over a run (queues build up from
an empty network), so comparing an early window with a late one would mix time into the effect (measured:
+45 % on 1 MiB downloads between the first and last window of one run at the same 10 ms).

Each run (one network x one transition) is a cell: ``PlanCell`` in, ``run_plan_cell`` (a pure function of
the cell, which carries the sampled relays and class shares) out, run on local worker processes or the
workers of a Dask scheduler through ``kistexp.population.dispatch``, the code path of ``kistexp sweep``.
Each cell builds its network from the seed, so where it runs changes no number.

In every window each catalogue metric the simulator provides is measured (``kistexp.sim.vocabulary``),
relay metrics per relay with that relay's hardware profile (``kistexp.population.costs``), and stored as
``Prediction`` rows: quantiles 0, 0.01, ..., 1 of the samples per stage, metric, relay class and network.
The summary gives, per stage, metric and relay class, the median over networks of each network's median,
and the 2.5-97.5 % range over networks (tornettools' method of comparing independently sampled networks:
with 3 networks that range is close to their min-max).

Every run also measures what an attacker gains in its stage window (docs/anonymity.md): the run records
the circuit trace of the flow circuits from shortly before that window (``kistexp.population.attacks``;
the trace only reads the model's state, so every performance figure is the same with it), and the
attack measures of ``kistexp.anonymity`` are computed over the window's whole seconds. The KS distance
of a stage's exit gaps is to the same network's baseline run (the first transition), and
``stage_differences`` pairs each stage with the baseline network by network. Throughput fingerprinting
needs probe circuits, which load the relays and so change the performance figures: they run only when
asked for (``probes``), and then in every run of the plan alike.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import socket
import time
from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path

import attrs
import numpy as np

from kistexp.anonymity import AttackFigure, add_probes, ks_distance_counts, stage_differences
from kistexp.errors import DispatchError, PopulationError
from kistexp.metrics.series import AttackValue, Prediction, PredictionRun
from kistexp.population import attacks, costs
from kistexp.population.adoption import SwitchSchedule, adoption_times, compress
from kistexp.population.classes import ClassShares, load_class_shares, load_profiles
from kistexp.population.dispatch import CellOutcome, DaskBackend, LocalBackend, check_options, execute, source_version
from kistexp.population.geoip import load_geoip
from kistexp.population.relays import load_population
from kistexp.population.sampling import sample
from kistexp.population.simnet import POSITION_NAMES, SimNetwork, TrafficModel, build_network, relay_class_label
from kistexp.population.stageruns import StageRun, StageRuns, default_warmup_s, run_windows
from kistexp.sim import RunConfig, Simulation, ensure_compiled, numbacache
from kistexp.sim.vocabulary import CLIENT_METRICS, RELAY_METRICS, node_cpu_utilization, window_samples

QUANTILES = tuple(round(q / 100, 2) for q in range(101))
# Fast mode (`kistexp simulate --fast`, sweeps' `--fast`): offered client bytes per second per network that
# keep a run near 10-15 s wall on one core; the NICs are scaled down (TrafficModel.bandwidth_scale) when the
# sampled network would ask for more. Each relay then moves fewer cells per scheduler run, which shrinks
# what a run-interval change can gain or lose (docs/validation.md, "Scaled against full NIC rates"), so the
# default is full rates: no budget.
FAST_BYTE_BUDGET = 75e6
FULL_RATES = math.inf


def rates_name(byte_budget: float) -> str:
    """"full" for relays at their consensus NIC rates, "fast" when a byte budget may scale them down."""
    return "full" if math.isinf(byte_budget) else "fast"
ALL = "all"
# fingerprinting probes a plan's runs may add per network (each is a client, a channel and a circuit)
MAX_PROBES = 256


@attrs.frozen
class StageFigure:
    stage: str
    metric: str
    relay_class: str
    median: float
    low: float  # 2.5 % over networks
    high: float  # 97.5 %
    networks: int
    # the median over networks of each network's own change (its median over the baseline's median - 1):
    # not median / baseline median - 1, as those two medians can come from different networks
    change: float | None


@attrs.frozen
class PlanPrediction:
    plan: str
    stages: tuple[str, ...]
    networks: int
    relays_per_network: tuple[int, ...]
    clients_per_network: tuple[int, ...]
    bandwidth_scale: tuple[float, ...]
    expected_utilisation: tuple[float, ...]  # offered, from the drawn paths and rates
    achieved_utilisation: tuple[float, ...]  # measured in the baseline window
    duration_s: float
    windows_s: tuple[tuple[str, float, float], ...]
    predictions: tuple[Prediction, ...] = attrs.field(repr=False)
    figures: tuple[StageFigure, ...]
    wall_s: float
    # what an attacker gains: the measures per stage and network, and each stage against the baseline
    attack_values: tuple[AttackValue, ...] = attrs.field(default=(), repr=False)
    attack_figures: tuple[AttackFigure, ...] = ()
    probes: int = 0  # fingerprinting probes per network (they load the relays: see the module docstring)
    rates: str = "full"  # "full": relays at their consensus NIC rates; "fast": NICs scaled to a byte budget
    cpu_s: float = 0.0  # CPU seconds of every run, the measures included
    attack_cpu_s: float = 0.0  # of those, computing the attack measures


def _class_labels(sn: SimNetwork) -> list[tuple[str, ...]]:
    """Per relay, the relay-class labels it is counted under (coarse to fine)."""
    out = []
    for i, cls in enumerate(sn.relay_classes):
        pos = sn.relay_positions[i]
        fine = relay_class_label(pos, cls, sn.population.relays[i].capacity)
        out.append((ALL, POSITION_NAMES[pos], f"{cls.scheduler} HZ={cls.hz}", fine))
    return out


def _relay_metrics(sn: SimNetwork, window, profiles) -> dict[str, np.ndarray]:
    """Per relay: CPU with its profile (+ circuit builds), RSS model, bandwidth, kernel queue."""
    net = sn.network
    circuits = np.zeros(len(net.nodes), dtype=np.int64)
    for path, _ in net.circuits:
        for n in path[1:]:
            circuits[n] += 1
    channels = np.zeros(len(net.nodes), dtype=np.int64)
    for a, b, _ in net.channels:
        channels[a] += 1
        channels[b] += 1
    cpu, rss, bw, kq = [], [], [], []
    kern = window.node_levels["kernel_bytes"]
    for i, node in enumerate(sn.relay_nodes):
        prof = profiles[sn.relay_classes[i].hardware]
        cpu.append(node_cpu_utilization(window, node, costs.cost_model(prof))
                   + costs.circuit_build_cpu(prof, int(circuits[node])))
        rss.append(costs.rss_bytes(int(circuits[node]), int(channels[node]),
                                   float(window.node_peaks["peak_app_bytes"][node])))
        bw.append(window.node_bytes_per_s(node))
        kq.append(float(kern[:, node].mean()) if len(kern) else float("nan"))
    return {"relay_cpu_utilization": np.array(cpu), "relay_rss_bytes": np.array(rss),
            "relay_bandwidth_bytes_per_s": np.array(bw), "relay_kernel_queue_bytes": np.array(kq)}


def achieved_utilisation(sn: SimNetwork, window) -> float:
    """Mean over relays of wire bytes (read + written) per second over twice the NIC rate."""
    scale = sn.traffic.bandwidth_scale
    return float(np.mean([window.node_bytes_per_s(n) / (2 * r.capacity * scale)
                          for n, r in zip(sn.relay_nodes, sn.population.relays, strict=True)]))


def _quantile_rows(stage: str, metric: str, relay_class: str, network: int, values: np.ndarray):
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return []
    qs = np.quantile(values, QUANTILES)
    return [Prediction(stage, metric, relay_class, network, q, float(v)) for q, v in zip(QUANTILES, qs, strict=True)]


def _window_predictions(sn: SimNetwork, window, stage: str, network: int, profiles, labels) -> list[Prediction]:
    rows = []
    samples = window_samples(window)
    for metric in CLIENT_METRICS:
        rows += _quantile_rows(stage, metric, "", network, np.asarray(samples[metric], float))
    per_relay = _relay_metrics(sn, window, profiles)
    groups: dict[str, list[int]] = {}
    for i, labs in enumerate(labels):
        for lab in labs:
            groups.setdefault(lab, []).append(i)
    for metric in RELAY_METRICS:
        for lab, idx in groups.items():
            rows += _quantile_rows(stage, metric, lab, network, per_relay[metric][idx])
    return rows


def _layout(duration_s: float, warmup_s: float) -> tuple[float, float, float]:
    if duration_s < 3 * 2.0 + warmup_s:
        raise PopulationError(f"[simulation] duration {duration_s:g} s is too short: need the warm-up "
                              f"{warmup_s:g} s plus three windows of at least 2 s")
    return run_windows(duration_s, warmup_s)


def _plan_network(pop, *, seed: int, duration_s: float, traffic: TrafficModel, shares: ClassShares,
                  scale: float, byte_budget: float) -> SimNetwork:
    """``pop`` built as every run of ``simulate_plan`` builds it: NICs scaled down when the network would
    offer more than ``byte_budget`` bytes per second."""
    geoip = load_geoip()  # the bundled table, read once per process
    sn = build_network(pop, duration_s=duration_s, seed=seed, interval_ms=10, traffic=traffic, shares=shares,
                       geoip=geoip, scale=scale)
    if sn.offered_bytes_per_s > byte_budget:
        tr = attrs.evolve(traffic, bandwidth_scale=traffic.bandwidth_scale * byte_budget / sn.offered_bytes_per_s)
        sn = build_network(pop, duration_s=duration_s, seed=seed, interval_ms=10, traffic=tr, shares=shares,
                           geoip=geoip, scale=scale)
    return sn


@attrs.frozen
class PlanCell:
    """One run of ``simulate_plan``: the network of one seed through one transition. Everything a worker
    needs travels with it (the sampled relays and the class shares; no file paths), so it gives the same
    numbers in this process, a local worker process or a Dask worker (``run_plan_cell``)."""

    index: int  # network * transitions + transition: the order of the predictions and the adoption seed
    network: int
    seed: int
    transition: StageRun
    duration_s: float
    scale: float
    traffic: TrafficModel
    byte_budget: float
    population: object = attrs.field(eq=False, repr=False)  # kistexp.population.relays.Population
    shares: ClassShares = attrs.field(eq=False, repr=False)
    model: str = ""  # model_version() of the submitting side, checked by the worker
    probes: int = 0  # fingerprinting probes (0: none, and no fingerprinting measures)


@attrs.frozen
class PlanCellResult:
    index: int
    relays: int
    clients: int
    bandwidth_scale: float
    expected_utilisation: float  # offered, from the drawn paths and rates
    achieved_utilisation: float  # measured in the run's last (stage) window
    predictions: tuple[Prediction, ...] = attrs.field(repr=False)
    wall_s: float
    cpu_s: float  # CPU time of the worker process over the cell
    host: str
    attacks: attacks.RunAttacks | None = None  # the stage window's attack measures (None: no whole second)


# what a run's numbers depend on besides its inputs (kistexp.sweep.cells.MODEL_SOURCES less the sweep)
MODEL_SOURCES = ("sim/*.py", "population/*.py", "data/*.toml", "params.py", "metrics/catalogue.py")


@lru_cache(maxsize=1)
def model_version() -> str:
    """What every Dask worker must run for ``simulate --dask`` (``dispatch.source_version``)."""
    return source_version(MODEL_SOURCES)


def run_plan_cell(cell: PlanCell) -> PlanCellResult:
    """One run (see the module docstring): build the network, start every node on the transition's old
    values, switch each node at its own time over [a, b), run to the end; predictions of the transition
    window and of the stage window."""
    if cell.model and cell.model != model_version():
        raise PopulationError(f"this worker ({socket.gethostname()}) runs another kistexp model "
                              f"({model_version()}, the plan was submitted with {cell.model}): install the "
                              "same kistexp on every worker")
    wall0, cpu0 = time.perf_counter(), time.process_time()
    duration = cell.duration_s
    _, a, b = _layout(duration, cell.traffic.warmup_s)
    pop, seed, t = cell.population, cell.seed, cell.transition
    sn = _plan_network(pop, seed=seed, duration_s=duration, traffic=cell.traffic, shares=cell.shares,
                       scale=cell.scale, byte_budget=cell.byte_budget)
    labels, profiles = _class_labels(sn), load_profiles()
    # the attack measures' span: the stage window's whole seconds, traced from a second before it
    t0, t1 = attacks.stage_trace_window(duration, cell.traffic.warmup_s)
    traced = t1 > t0
    probe_plan = attacks.plan_probes(sn, cell.probes, t0, t1, seed) if cell.probes and traced else None
    probes = add_probes(sn.network, probe_plan.relays) if probe_plan is not None else {}
    trace = attacks.trace_config(sn, t0, probes.values()) if traced else None
    # the same network, clients and traffic for every transition: stages differ only by their values
    sim = Simulation(sn.network, RunConfig(duration_s=duration, seed=seed, circuit_trace=trace))
    sn.apply(sim, range(len(sn.network.nodes)), dict(t.from_values))  # Arti clients read only Arti's
    sim.advance_to(a)
    # per-node switch times over the transition window
    is_cache = np.array(["V2Dir" in r.flags for r in pop.relays])
    clients = list(sn.client_nodes) + list(sn.perf_nodes)
    adopt = adoption_times(is_cache, len(clients), seed * 1000 + cell.index)
    when = dict(zip(sn.relay_nodes, compress(adopt.relays, adopt.span_s, a, b).tolist(), strict=True))
    when.update(zip(clients, compress(adopt.clients, adopt.span_s, a, b).tolist(), strict=True))
    SwitchSchedule.build(when, t.to_values).apply_until(sim, b, apply=sn.apply)
    sim.advance_to(b)
    sim.advance_to(duration)
    rows = _window_predictions(sn, sim.window(a, b), f"transition:{t.to_stage}", cell.network, profiles, labels)
    stage_window = sim.window(b, duration)
    rows += _window_predictions(sn, stage_window, t.to_stage, cell.network, profiles, labels)
    measured = attacks.measure_run(sim, sn, t0, t1, probes=probes, seed=seed,
                                   targets=probe_plan.targets if probe_plan is not None else None) if traced else None
    return PlanCellResult(cell.index, len(pop), len(sn.client_nodes) + len(sn.perf_nodes),
                          sn.traffic.bandwidth_scale, sn.mean_utilisation, achieved_utilisation(sn, stage_window),
                          tuple(rows), time.perf_counter() - wall0, time.process_time() - cpu0,
                          f"{socket.gethostname()}:{os.getpid()}", measured)


def plan_backend(workers: int | None = None, dask: str | None = None, dask_timeout: float = 10.0):
    """Where ``simulate_plan``'s cells run, as ``kistexp sweep`` runs its own (``kistexp.population.dispatch``):
    ``workers`` local spawned processes (default: one per CPU) or the workers of the Dask scheduler at
    ``dask``; the options are checked as the sweep checks them (``DispatchError``)."""
    check_options(workers, dask, dask_timeout)
    if dask is not None:  # `--dask ""` is an address too (refused), not a request for local workers
        return DaskBackend(dask, run_plan_cell, model=model_version, timeout_s=dask_timeout)
    return LocalBackend(workers if workers is not None else os.cpu_count() or 1, run_plan_cell)


def simulate_plan(runs: StageRuns, *, consensus: str | Path | None = None, certs: str | Path | None = None,
                  traffic: TrafficModel | None = None, shares: ClassShares | None = None,
                  byte_budget: float = FULL_RATES, backend=None, probes: int = 0,
                  progress: Callable[[float, str], None] | None = None,
                  notify: Callable[[str], None] | None = None) -> PlanPrediction:
    """Run every transition of ``runs`` (a plan's: ``Plan.stage_runs()``) on each seed's network (see the
    module docstring); ``consensus`` and ``certs`` as ``load_population`` takes them (default: the
    bundled consensus). Each network x transition is one cell (``PlanCell``, ``run_plan_cell``) run on
    ``backend`` (``plan_backend``; default: a local process per CPU, at most one per cell, closed at the
    end), so a local pool and a Dask cluster give the same numbers. ``progress`` is called with the
    fraction of runs done, never decreasing, and what finished; ``notify`` with a line about a first
    compile of the simulator (``kistexp.sim.ensure_compiled``, for cells run on this machine), which
    comes after the inputs are read, so a bad input is reported at once. A failed run stops the others
    (``DispatchError`` naming it)."""
    wall0 = time.perf_counter()
    duration = runs.duration.total_seconds()
    traffic = traffic or TrafficModel(warmup_s=default_warmup_s(duration))
    w0, a, b = _layout(duration, traffic.warmup_s)
    transitions = runs.transitions
    if len(transitions) < 2:
        raise PopulationError(f"{runs.source}: the plan changes no value: nothing to predict")
    if isinstance(probes, bool) or not isinstance(probes, int) or not 0 <= probes <= MAX_PROBES:
        raise PopulationError(f"probes: {probes!r} is not a whole number of fingerprinting probes in 0..{MAX_PROBES}")
    shares = shares or load_class_shares()
    full = load_population(consensus, certs=certs)
    total = len(runs.seeds) * len(transitions)
    own = backend is None
    if own:
        backend = LocalBackend(min(total, os.cpu_count() or 1), run_plan_cell)
    try:
        if getattr(backend, "local", True):
            took = ensure_compiled(notify)
            if took is not None:
                wall0 += took  # wall_s is the simulation's own time
                if notify is not None:
                    notify(f"compiled in {took:.0f} s (kept in {numbacache.cache_base()})")
        if progress is not None:
            progress(0.0, f"sampling {len(runs.seeds)} network{'s' if len(runs.seeds) > 1 else ''}")
        cells = [PlanCell(net_i * len(transitions) + t_i, net_i, seed, t, duration, runs.population_scale,
                          traffic, byte_budget, pop, shares, model_version(), probes)
                 for net_i, (seed, pop) in enumerate((s, sample(full, runs.population_scale, s)) for s in runs.seeds)
                 for t_i, t in enumerate(transitions)]
        finished = 0

        def started(n: int, _cached: int) -> None:
            if progress is not None:
                progress(0.0, f"{n} runs on {backend.description}")

        def seen(outcome: CellOutcome) -> None:
            nonlocal finished
            c: PlanCell = outcome.task
            what = f"network {c.network + 1}: {c.transition.from_stage} -> {c.transition.to_stage}"
            if outcome.status == "failed":
                raise DispatchError(f"{runs.source}: {what} (seed {c.seed}) failed after {outcome.attempts} "
                                    f"attempt(s): {outcome.error}")
            finished += 1
            if progress is not None:
                progress(finished / total, what)

        outcomes = execute(cells, backend, on_start=started, on_outcome=seen)
    except BaseException:
        getattr(backend, "abandon", backend.close)()  # the runs in flight are killed, not waited for
        raise
    finally:
        if own:
            backend.close()
    results: list[PlanCellResult] = [o.result for o in outcomes]  # in cell order: network, then transition
    firsts = results[::len(transitions)]
    rows = [p for r in results for p in r.predictions]
    stages = [t.to_stage for t in transitions]
    figures = summarize_predictions(rows, stages)
    values = attack_values(results, len(transitions), stages)
    return PlanPrediction(
        plan=runs.name, stages=tuple(stages), networks=len(runs.seeds),
        relays_per_network=tuple(r.relays for r in firsts), clients_per_network=tuple(r.clients for r in firsts),
        bandwidth_scale=tuple(r.bandwidth_scale for r in firsts),
        expected_utilisation=tuple(r.expected_utilisation for r in firsts),
        achieved_utilisation=tuple(r.achieved_utilisation for r in firsts),
        duration_s=duration, windows_s=(("warm-up", 0.0, w0), ("from", w0, a), ("transition", a, b),
                                        ("stage", b, duration)),
        predictions=tuple(rows), figures=tuple(figures), wall_s=time.perf_counter() - wall0,
        attack_values=tuple(values), attack_figures=tuple(stage_differences(values, stages)), probes=probes,
        rates=rates_name(byte_budget), cpu_s=sum(r.cpu_s for r in results),
        attack_cpu_s=sum(r.attacks.cpu_s for r in results if r.attacks))


def attack_values(results: list[PlanCellResult], transitions: int, stages: list[str]) -> list[AttackValue]:
    """Each run's attack measures as ``AttackValue`` rows (its stage, its network), and the KS distance of
    its exit gaps to its network's baseline run (the first transition: 0 for the baseline itself); a run
    or baseline without gaps gives no KS distance."""
    out = []
    for k, r in enumerate(results):
        net, t_i = divmod(k, transitions)
        if r.attacks is None:
            continue
        stage = stages[t_i]
        out += [AttackValue(stage, m, net, v) for m, v in r.attacks.values]
        base = results[net * transitions].attacks
        if base is not None and sum(base.exit_gaps) and sum(r.attacks.exit_gaps):
            out.append(AttackValue(stage, "attack_gap_ks_distance", net,
                                   ks_distance_counts(r.attacks.exit_gaps, base.exit_gaps)))
    return out


def summarize_predictions(rows: list[Prediction] | tuple[Prediction, ...], stages: list[str]) -> list[StageFigure]:
    """Median and 95 % range over networks of each network's median, per stage, metric and class."""
    med: dict[tuple[str, str, str], dict[int, float]] = {}
    for p in rows:
        if p.quantile == 0.5:
            med.setdefault((p.stage, p.metric, p.relay_class), {})[p.network] = p.value
    order = {s: i for i, s in enumerate(stages)}

    def rank(stage: str) -> tuple[int, int]:
        base = stage.split(":", 1)[-1]
        return order.get(base, len(order)), 0 if stage == base else -1

    out = []
    for (stage, metric, cls), per_net in sorted(med.items(), key=lambda kv: (kv[0][1], kv[0][2], rank(kv[0][0]))):
        v = np.array(list(per_net.values()))
        ref = "transition:baseline" if stage.startswith("transition:") else "baseline"
        base = med.get((ref, metric, cls))
        change = None
        if base and stage != ref:
            shared = [n for n in per_net if n in base and base[n] != 0]
            if shared:
                change = float(np.median([per_net[n] / base[n] - 1 for n in shared]))
        out.append(StageFigure(stage, metric, cls, float(np.median(v)), float(np.percentile(v, 2.5)),
                               float(np.percentile(v, 97.5)), len(v), change))
    return out


@attrs.frozen
class ValuesRun:
    """One run of a sampled network at fixed values (``simulate_values``)."""

    figures: tuple[tuple[str, str, float, float], ...]  # (metric, relay class, median, p95) per catalogue metric
    relays: int
    clients: int
    bandwidth_scale: float
    achieved_utilisation: float
    window_s: tuple[float, float]
    wall_s: float
    # (measure, value) of what an attacker gains over the window's whole seconds (``attacks.measure_run``):
    # no fingerprinting (no probes) and no gap KS distance (no baseline run in the cell)
    attacks: tuple[tuple[str, float], ...] = ()
    attack_cpu_s: float = 0.0


def simulate_values(pop, values: Mapping[str, int | float], *, load: float, loss_rate: float,
                    shares: ClassShares, seed: int, duration_s: float, scale: float,
                    byte_budget: float = FULL_RATES) -> ValuesRun:
    """A sampled network ``pop`` run for ``duration_s`` with ``values`` in every relay's and client's
    consensus from the start; measured over [warm-up, end) like a stage (one cell of a parameter sweep).

    ``seed`` draws the clients, paths, classes and traffic and seeds the run: the same seed on the same
    network gives the same traffic for any values (common random numbers). The NICs are scaled down (the
    same scale at every ``load``) when the network at load 1 would offer more than ``byte_budget``, so
    offered bytes are ``load`` times at most the budget. Figures are the median and
    95th percentile of each catalogue metric's samples, relay metrics per relay class (labels as in
    ``simulate_plan``), and the attack measures of the window (``ValuesRun.attacks``; the circuit trace
    they come from changes no other figure)."""
    wall0 = time.perf_counter()
    traffic = TrafficModel(load=load, loss_rate=loss_rate, warmup_s=default_warmup_s(duration_s))
    if duration_s < traffic.warmup_s + 2.0:
        raise PopulationError(f"duration {duration_s:g} s is too short: need the warm-up plus 2 s")
    geoip = load_geoip()

    def build(tr: TrafficModel) -> SimNetwork:
        return build_network(pop, duration_s=duration_s, seed=seed, interval_ms=10, traffic=tr, shares=shares,
                             geoip=geoip, scale=scale)

    sn = build(traffic)
    # NICs scaled so that the budget holds at load 1, whatever this cell's load: one network keeps one NIC
    # scale across a sweep's loads, so a higher load moves more bytes through the same relays. (Scaled to
    # the budget at each load, every load moved the same bytes over slower NICs, and relay CPU fell as the
    # load rose: fewer socket syscalls per cell on fuller runs.)
    at_full_load = sn.offered_bytes_per_s / traffic.load
    if at_full_load > byte_budget:
        sn = build(attrs.evolve(traffic, bandwidth_scale=byte_budget / at_full_load))
    t0, t1 = attacks.trace_window(sn.traffic.warmup_s, duration_s)
    traced = t1 > t0
    sim = Simulation(sn.network, RunConfig(duration_s=duration_s, seed=seed,
                                           circuit_trace=attacks.trace_config(sn, t0) if traced else None))
    sn.apply(sim, range(len(sn.network.nodes)), dict(values))
    sim.advance_to(sn.traffic.warmup_s)  # a window starts at a sample time or where the run stopped
    sim.advance_to(duration_s)
    window = sim.window(sn.traffic.warmup_s, duration_s)
    rows = _window_predictions(sn, window, "values", 0, load_profiles(), _class_labels(sn))
    at: dict[tuple[str, str], dict[float, float]] = {}
    for p in rows:
        if p.quantile in (0.5, 0.95):
            at.setdefault((p.metric, p.relay_class), {})[p.quantile] = p.value
    figures = tuple((m, c, q[0.5], q[0.95]) for (m, c), q in at.items())
    measured = attacks.measure_run(sim, sn, t0, t1, seed=seed) if traced else None
    return ValuesRun(figures, len(pop), len(sn.client_nodes) + len(sn.perf_nodes), sn.traffic.bandwidth_scale,
                     achieved_utilisation(sn, window), (sn.traffic.warmup_s, duration_s),
                     time.perf_counter() - wall0, measured.values if measured else (),
                     measured.cpu_s if measured else 0.0)


# --- saving predictions: whole or not at all ---------------------------------------------------------


def check_experiment_dir(path: str | Path) -> None:
    """Before minutes of simulation: the experiment at ``path`` opens, or one can be made there. Nothing
    is created (a run that fails or is stopped leaves no experiment behind)."""
    from kistexp.expdir import DB_NAME, ExperimentDir
    from kistexp.store.schema import StoreError

    path = Path(path)
    if (path / DB_NAME).exists():
        ExperimentDir.open(path).close()
        return
    if path.exists() and not path.is_dir():
        raise StoreError(f"{path}: is a file, not an experiment directory")
    existing = path
    while not existing.exists():
        existing = existing.parent if existing.parent != existing else Path(".")
    if not existing.is_dir():
        raise StoreError(f"{path}: cannot create the experiment directory: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise StoreError(f"{path}: cannot create the experiment directory: {existing} is not writable")


def prediction_run(result: PlanPrediction, population_scale: float) -> PredictionRun:
    """How ``result`` was made, as the experiment records it (the reports label fast-mode predictions)."""
    return PredictionRun(dt.datetime.now(dt.timezone.utc), result.rates, population_scale, result.relays_per_network,
                         min(result.bandwidth_scale), max(result.bandwidth_scale), result.duration_s, result.wall_s)


def save_plan_predictions(path: str | Path, plan_file: str | Path,
                          predictions: tuple[Prediction, ...] | list[Prediction],
                          attack_values: tuple[AttackValue, ...] | list[AttackValue] = (),
                          run: PredictionRun | None = None) -> None:
    """Store ``predictions``, ``attack_values`` and how they were made (``run``, see ``prediction_run``) in
    the experiment at ``path``, creating it (with a copy of ``plan_file``) if it has none. An existing
    experiment takes each in one transaction; a new one is built in a temporary directory inside ``path``
    and its database renamed into place last, so ``experiment.db`` exists only once it holds every
    prediction and attack measure (``make demo`` takes the file as the sign that predictions are made)."""
    import shutil
    import tempfile

    from kistexp.expdir import DB_NAME, PLAN_NAME, ExperimentDir
    from kistexp.metrics.store import MetricStore
    from kistexp.store.schema import StoreError

    path = Path(path)
    if (path / DB_NAME).exists():
        with ExperimentDir.open(path) as exp:
            if not exp.plan_path.exists():
                exp.save_plan(plan_file)
            store = MetricStore(exp.db)
            store.save_predictions(predictions)
            store.save_attack_values(attack_values)
            if run is not None:
                store.save_prediction_run(run)
        return
    try:
        path.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".simulate-", dir=path))
    except OSError as exc:
        raise StoreError(f"{path}: cannot create the experiment directory: {exc.strerror or exc}") from None
    try:
        with ExperimentDir.create(tmp, plan_file) as exp:
            store = MetricStore(exp.db)
            store.save_predictions(predictions)
            store.save_attack_values(attack_values)
            if run is not None:
                store.save_prediction_run(run)
        try:
            if not (path / PLAN_NAME).exists():
                os.replace(tmp / PLAN_NAME, path / PLAN_NAME)
            for suffix in ("-wal", "-shm"):  # none after a clean close (SQLite checkpoints), moved if any
                if (tmp / (DB_NAME + suffix)).exists():
                    os.replace(tmp / (DB_NAME + suffix), path / (DB_NAME + suffix))
            os.replace(tmp / DB_NAME, path / DB_NAME)
        except OSError as exc:
            raise StoreError(f"{path / DB_NAME}: cannot move the new experiment into place: "
                             f"{exc.strerror or exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
