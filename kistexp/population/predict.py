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

In every window each catalogue metric the simulator provides is measured (``kistexp.sim.vocabulary``),
relay metrics per relay with that relay's hardware profile (``kistexp.population.costs``), and stored as
``Prediction`` rows: quantiles 0, 0.01, ..., 1 of the samples per stage, metric, relay class and network.
The summary gives, per stage, metric and relay class, the median over networks of each network's median,
and the 2.5-97.5 % range over networks (tornettools' method of comparing independently sampled networks:
with 3 networks that range is close to their min-max).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs
import numpy as np

from kistexp.errors import PopulationError
from kistexp.metrics.series import Prediction
from kistexp.population import costs
from kistexp.population.adoption import SwitchSchedule, adoption_times, compress
from kistexp.population.classes import ClassShares, load_class_shares, load_profiles
from kistexp.population.geoip import load_geoip
from kistexp.population.relays import load_population
from kistexp.population.sampling import sample
from kistexp.population.simnet import POSITION_NAMES, SimNetwork, TrafficModel, build_network, relay_class_label
from kistexp.population.stageruns import StageRuns
from kistexp.sim import RunConfig, Simulation, ensure_compiled, numbacache
from kistexp.sim.vocabulary import CLIENT_METRICS, RELAY_METRICS, node_cpu_utilization, window_samples

QUANTILES = tuple(round(q / 100, 2) for q in range(101))
# offered client bytes per second per network that keep a run near 10-15 s wall on one core; the NICs
# are scaled down (TrafficModel.bandwidth_scale) when the sampled network would ask for more
DEFAULT_BYTE_BUDGET = 75e6
ALL = "all"


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
    r = (duration_s - warmup_s) / 3
    return warmup_s, warmup_s + r, warmup_s + 2 * r


def simulate_plan(runs: StageRuns, *, consensus: str | Path | None = None, certs: str | Path | None = None,
                  traffic: TrafficModel | None = None, shares: ClassShares | None = None,
                  byte_budget: float = DEFAULT_BYTE_BUDGET,
                  progress: Callable[[float, str], None] | None = None,
                  notify: Callable[[str], None] | None = None) -> PlanPrediction:
    """Run every transition of ``runs`` (a plan's: ``Plan.stage_runs()``) on each seed's network (see the
    module docstring); ``consensus`` and ``certs`` as ``load_population`` takes them (default: the
    bundled consensus). ``progress`` is
    called with the fraction done, never decreasing, and what runs; ``notify`` with a line about a first
    compile of the simulator (``kistexp.sim.ensure_compiled``), which comes after the inputs are read, so
    a bad input is reported at once."""
    wall0 = time.perf_counter()
    duration = runs.duration.total_seconds()
    traffic = traffic or TrafficModel(warmup_s=min(10.0, duration / 6))
    w0, a, b = _layout(duration, traffic.warmup_s)
    transitions = runs.transitions
    if len(transitions) < 2:
        raise PopulationError(f"{runs.source}: the plan changes no value: nothing to predict")
    shares = shares or load_class_shares()
    profiles = load_profiles()
    geoip = load_geoip()
    full = load_population(consensus, certs=certs)
    took = ensure_compiled(notify)
    if took is not None:
        wall0 += took  # wall_s is the simulation's own time
        if notify is not None:
            notify(f"compiled in {took:.0f} s (kept in {numbacache.cache_base()})")
    rows: list[Prediction] = []
    relays_n, clients_n, scales, utils, achieved = [], [], [], [], []
    total = len(runs.seeds) * len(transitions)
    done = 0
    for net_i, seed in enumerate(runs.seeds):
        if progress is not None:
            progress(done / total, f"network {net_i + 1}: sampling and building")
        pop = sample(full, runs.population_scale, seed)
        sn = build_network(pop, duration_s=duration, seed=seed, interval_ms=10, traffic=traffic,
                           shares=shares, geoip=geoip, scale=runs.population_scale)
        if sn.offered_bytes_per_s > byte_budget:
            tr = attrs.evolve(traffic, bandwidth_scale=traffic.bandwidth_scale * byte_budget
                              / sn.offered_bytes_per_s)
            sn = build_network(pop, duration_s=duration, seed=seed, interval_ms=10, traffic=tr,
                               shares=shares, geoip=geoip, scale=runs.population_scale)
        relays_n.append(len(pop))
        scales.append(sn.traffic.bandwidth_scale)
        clients_n.append(len(sn.client_nodes) + len(sn.perf_nodes))
        utils.append(sn.mean_utilisation)
        labels = _class_labels(sn)
        # the same network, clients and traffic for every transition: stages differ only by their values
        for t in transitions:
            sim = Simulation(sn.network, RunConfig(duration_s=duration, seed=seed))
            everyone = list(range(len(sn.network.nodes)))
            sim.apply(everyone, dict(t.from_values))
            what = f"network {net_i + 1}: {t.from_stage} -> {t.to_stage}"

            def step(frac: float, _done=done, _what=what) -> None:
                if progress is not None:
                    progress((_done + frac) / total, _what)

            sim.advance_to(a, progress=lambda f: step(f * a / duration))
            # per-node switch times over the transition window
            is_cache = np.array(["V2Dir" in r.flags for r in pop.relays])
            clients = list(sn.client_nodes) + list(sn.perf_nodes)
            adopt = adoption_times(is_cache, len(clients), seed * 1000 + done)
            when = dict(zip(sn.relay_nodes, compress(adopt.relays, adopt.span_s, a, b).tolist(), strict=True))
            when.update(zip(clients, compress(adopt.clients, adopt.span_s, a, b).tolist(), strict=True))
            SwitchSchedule.build(when, t.to_values).apply_until(sim, b)
            sim.advance_to(b)
            step(b / duration)
            sim.advance_to(duration, progress=lambda f: step((b + f * (duration - b)) / duration))
            rows += _window_predictions(sn, sim.window(a, b), f"transition:{t.to_stage}", net_i, profiles, labels)
            stage_window = sim.window(b, duration)
            rows += _window_predictions(sn, stage_window, t.to_stage, net_i, profiles, labels)
            if t is transitions[0]:
                achieved.append(achieved_utilisation(sn, stage_window))
            done += 1
            if progress is not None:  # the run's end (not step(): its _done is the run's start)
                progress(done / total, what)
    stages = [t.to_stage for t in transitions]
    figures = summarize_predictions(rows, stages)
    return PlanPrediction(
        plan=runs.name, stages=tuple(stages), networks=len(runs.seeds), relays_per_network=tuple(relays_n),
        clients_per_network=tuple(clients_n), bandwidth_scale=tuple(scales), expected_utilisation=tuple(utils),
        achieved_utilisation=tuple(achieved),
        duration_s=duration, windows_s=(("warm-up", 0.0, w0), ("from", w0, a), ("transition", a, b),
                                        ("stage", b, duration)),
        predictions=tuple(rows), figures=tuple(figures), wall_s=time.perf_counter() - wall0)


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


def simulate_values(pop, values: Mapping[str, int | float], *, load: float, loss_rate: float,
                    shares: ClassShares, seed: int, duration_s: float, scale: float,
                    byte_budget: float = DEFAULT_BYTE_BUDGET) -> ValuesRun:
    """A sampled network ``pop`` run for ``duration_s`` with ``values`` in every relay's and client's
    consensus from the start; measured over [warm-up, end) like a stage (one cell of a parameter sweep).

    ``seed`` draws the clients, paths, classes and traffic and seeds the run: the same seed on the same
    network gives the same traffic for any values (common random numbers). The NICs are scaled down (the
    same scale at every ``load``) when the network at load 1 would offer more than ``byte_budget``, so
    offered bytes are ``load`` times at most the budget. Figures are the median and
    95th percentile of each catalogue metric's samples, relay metrics per relay class (labels as in
    ``simulate_plan``)."""
    wall0 = time.perf_counter()
    traffic = TrafficModel(load=load, loss_rate=loss_rate, warmup_s=min(10.0, duration_s / 6))
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
    sim = Simulation(sn.network, RunConfig(duration_s=duration_s, seed=seed))
    sim.apply(list(range(len(sn.network.nodes))), dict(values))
    sim.advance_to(sn.traffic.warmup_s)  # a window starts at a sample time or where the run stopped
    sim.advance_to(duration_s)
    window = sim.window(sn.traffic.warmup_s, duration_s)
    rows = _window_predictions(sn, window, "values", 0, load_profiles(), _class_labels(sn))
    at: dict[tuple[str, str], dict[float, float]] = {}
    for p in rows:
        if p.quantile in (0.5, 0.95):
            at.setdefault((p.metric, p.relay_class), {})[p.quantile] = p.value
    figures = tuple((m, c, q[0.5], q[0.95]) for (m, c), q in at.items())
    return ValuesRun(figures, len(pop), len(sn.client_nodes) + len(sn.perf_nodes), sn.traffic.bandwidth_scale,
                     achieved_utilisation(sn, window), (sn.traffic.warmup_s, duration_s),
                     time.perf_counter() - wall0)


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


def save_plan_predictions(path: str | Path, plan_file: str | Path,
                          predictions: tuple[Prediction, ...] | list[Prediction]) -> None:
    """Store ``predictions`` in the experiment at ``path``, creating it (with a copy of ``plan_file``) if it
    has none. An existing experiment takes them in one transaction; a new one is built in a temporary
    directory inside ``path`` and its database renamed into place last, so ``experiment.db`` exists only
    once it holds every prediction (``make demo`` takes the file as the sign that predictions are made)."""
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
            MetricStore(exp.db).save_predictions(predictions)
        return
    try:
        path.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".simulate-", dir=path))
    except OSError as exc:
        raise StoreError(f"{path}: cannot create the experiment directory: {exc.strerror or exc}") from None
    try:
        with ExperimentDir.create(tmp, plan_file) as exp:
            MetricStore(exp.db).save_predictions(predictions)
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
