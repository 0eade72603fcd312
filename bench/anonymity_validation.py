"""Validation of the anonymity measures (issue 37): KIST against Vanilla, and a deliberately leaky control.

For each sampled network (``--networks``, the bundled consensus at ``--scale``) and seed (``--seeds``),
one network is built (``kistexp.population.simnet``, every relay and client on KIST at ``--interval-ms``)
with ``--targets`` fingerprinting targets (circuits with transfers in the measured span) and one probe
(``kistexp.anonymity.add_probes``) at each target's guard, filled up to ``--targets`` probes with other
guards.  Three runs of it, each with the circuit trace on (``RunConfig.circuit_trace``), measured over
``[warm-up, duration)``:

* **baseline**: KIST;
* **Vanilla**: the same network, clients, paths, traffic and probes, every node on Vanilla (Jansen et al.,
  ACM ToPS 2018: KIST "does not significantly affect the outcome of well-known latency, throughput and
  traffic correlation attacks": expected, no significant change);
* **leaky control**: ``kistexp.anonymity.isolate_circuits`` of the baseline: one circuit per channel and
  no other traffic on the relays (each circuit on private copies of its relays, same links, same
  traffic), probes at the targets' private guards: it must move the measures, or a measure is blind.

A fourth run, **A/A**, is the baseline again with another run seed (the same network, traffic and values;
only the EWMA ticks' random phases differ): what chance alone moves, the noise floor of every row (the KS
distance of the gaps above all, which is never below 0).

Printed: the paired differences (run minus baseline) over networks x seeds with 95 % t intervals, which
way each figure moves when the attack gets easier and whether the control moves it that way, the CPU
model, and the cost of the measures: recording the trace (the first unit's baseline, traced and untraced,
three alternating runs each) and computing them, relative to the simulations they are computed from
(target < 10 %), plus what the probes add to the simulation. With ``--doc`` (``bench/validation.py --anonymity``)
the table also goes into docs/validation.md, section "Anonymity", between its markers.

    .venv/bin/python bench/anonymity_validation.py [--networks 3] [--seeds 3] [--scale 0.02] [--duration 40]
                                                   [--segment 6] [--targets 16] [--load 0.4] [--interval-ms 10]
"""

from __future__ import annotations

import argparse
import math
import subprocess
import time

import attrs
import numpy as np

from kistexp.anonymity import (
    DEFAULT_FPRS,
    FprResolutionError,
    add_probes,
    attack_measures,
    isolate_circuits,
    paired_differences,
    resolvable_fprs,
    scalars,
)
from kistexp.metrics import catalogue
from kistexp.population.geoip import load_geoip
from kistexp.population.relays import load_population
from kistexp.population.sampling import sample
from kistexp.population.simnet import TrafficModel, build_network
from kistexp.sim import CircuitTraceConfig, RunConfig, Simulation, warm_up

BYTE_BUDGET = 75e6  # as kistexp simulate --fast: NICs scaled down above this offered load (--fast only)


def cpu_model() -> str:
    out = subprocess.run(["grep", "-m1", "model name", "/proc/cpuinfo"], capture_output=True, text=True).stdout
    return out.split(":", 1)[-1].strip() or "unknown"


def build(pop, seed: int, args, scheduler: str):
    geoip = load_geoip()
    traffic = TrafficModel(load=args.load, warmup_s=args.warmup)
    kw = dict(duration_s=args.duration, seed=seed, interval_ms=args.interval_ms, geoip=geoip, scheduler=scheduler)
    sn = build_network(pop, traffic=traffic, **kw)
    if args.fast and sn.offered_bytes_per_s > BYTE_BUDGET:
        traffic = attrs.evolve(traffic, bandwidth_scale=BYTE_BUDGET / sn.offered_bytes_per_s)
        sn = build_network(pop, traffic=traffic, **kw)
    return sn


def pick_targets(sn, args, rng) -> list[int]:
    """Circuits (not interactive) with a transfer starting in the measured span."""
    circ, _, _, start = sn.network.transfer_arrays()
    busy = set(circ[(start >= args.warmup) & (start < args.duration - 2)].tolist())
    pool = [c for c in sorted(busy) if sn.network.circuits[c][1] != "interactive"]
    return sorted(rng.choice(pool, size=min(args.targets, len(pool)), replace=False).tolist())


def probe_relays(sn, targets: list[int], k: int, rng) -> list[int]:
    """The targets' guards, then other guards at random up to ``k``."""
    guards = list(dict.fromkeys(sn.network.circuits[c][0][1] for c in targets))
    others = sorted({p[1] for p, _ in sn.network.circuits} - set(guards))
    rng.shuffle(others)
    return guards + others[:max(0, k - len(guards))]


def simulate(net, args, seed: int, traced: bool = True):
    """Run ``net`` for ``args.duration`` s; its trace of ``[warm-up, duration)`` (cells recorded from a second
    before the warm-up ends) and the CPU seconds the run took."""
    rc = RunConfig(duration_s=args.duration, seed=seed,
                   circuit_trace=CircuitTraceConfig(start_s=args.warmup) if traced else None)
    t0 = time.process_time()
    sim = Simulation(net, rc)
    sim.advance_to(args.duration)
    cpu = time.process_time() - t0
    return (sim.circuit_trace(args.warmup, args.duration) if traced else None), cpu


def measure(trace, regions, probes, targets, args, seed):
    """The measures at every FPR of ``args.fprs`` the trace resolves (the finest ones it cannot are
    dropped for the whole table, and said)."""
    t0 = time.process_time()
    while True:
        try:
            m = attack_measures(trace, regions=regions, probes=probes, targets=targets, segment_s=args.segment,
                                fprs=args.fprs, seed=seed)
            break
        except FprResolutionError as e:
            print(f"  {e}: left out", flush=True)
            args.fprs = tuple(sorted(args.fprs, reverse=True)[:-1])
    return m, time.process_time() - t0


def leakier(name: str) -> int:
    """+1 when a higher value means the attack does better (the catalogue's direction); a TPR at an
    uncatalogued rate like the others."""
    m = catalogue.attack_measure(name)
    return m.leakier if m is not None else +1


def fmt(v: float) -> str:
    if not math.isfinite(v):
        return "n/a"
    return f"{v:+.3f}" if v == 0 or abs(v) >= 0.001 else f"{v:+.1e}"


def cell(d) -> str:
    return f"{fmt(d.mean_difference)} [{fmt(d.low)}, {fmt(d.high)}]{' *' if d.significant else ''}"


def overhead(net, args, seed: int, repeats: int = 3) -> tuple[float, float]:
    """CPU seconds of ``net`` untraced and traced, the least of ``repeats`` alternating runs each (the
    machine is shared: the least is the run least disturbed)."""
    plain, traced = [], []
    for _ in range(repeats):
        plain.append(simulate(net, args, seed, traced=False)[1])
        traced.append(simulate(net, args, seed)[1])
    return min(plain), min(traced)


SECTION_BEGIN, SECTION_END = "<!-- anonymity:begin -->", "<!-- anonymity:end -->"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--networks", type=int, default=3)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--scale", type=float, default=0.02)
    ap.add_argument("--duration", type=float, default=40.0)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--segment", type=float, default=6.0, help="flow-correlation segment (s)")
    ap.add_argument("--targets", type=int, default=16)
    ap.add_argument("--load", type=float, default=0.4)
    ap.add_argument("--interval-ms", type=int, default=10)
    ap.add_argument("--fast", action="store_true", help="NICs scaled down to 75 MB/s per network, as "
                    "kistexp simulate --fast (default: full NIC rates, as kistexp simulate)")
    ap.add_argument("--doc", action="store_true", help="also write the table into docs/validation.md")
    args = ap.parse_args(argv)
    args.fprs = DEFAULT_FPRS
    wall0 = time.perf_counter()
    warm_up()
    warm_up(keep_raw_delays=True)  # the kernel that records (traced runs), compiled before anything is timed
    full = load_population()
    runs = ("Vanilla", "A/A", "control")
    base_u, other_u = [], {r: [] for r in runs}
    sim_cpu = meas_cpu = 0.0
    flows = []
    cost = {}
    for n in range(1, args.networks + 1):
        pop = sample(full, args.scale, seed=n)
        for s in range(1, args.seeds + 1):
            seed = 1000 * n + s
            rng = np.random.default_rng(seed)
            sn_k = build(pop, seed, args, "kist")
            sn_v = build(pop, seed, args, "vanilla")
            targets = pick_targets(sn_k, args, rng)
            relays = probe_relays(sn_k, targets, args.targets, rng)
            if n == 1 and s == 1:  # the probes' own cost: this network without them
                cost["no probes"] = min(simulate(sn_k.network, args, s, traced=False)[1] for _ in range(3))
            probes = add_probes(sn_k.network, relays, start_s=0.0)
            if add_probes(sn_v.network, relays, start_s=0.0) != probes:
                raise AssertionError("the two schedulers' networks must be built alike")
            iso = isolate_circuits(sn_k.network)
            ctl_probes = add_probes(iso.network, [iso.relay_copies(c)[0] for c in targets], start_s=0.0)
            all_clients = (*sn_k.client_nodes, *sn_k.perf_nodes)
            regions = dict(zip(all_clients, sn_k.client_countries, strict=True))
            # baseline; Vanilla; the baseline again with another run seed (A/A: same network, traffic and
            # values, other EWMA tick phases); the leaky control
            out = []
            for net, pr, run_seed in ((sn_k.network, probes, s), (sn_v.network, probes, s),
                                      (sn_k.network, probes, s + 100), (iso.network, ctl_probes, s)):
                trace, cpu = simulate(net, args, run_seed)
                sim_cpu += cpu
                m, mc = measure(trace, regions, pr, targets, args, seed)
                meas_cpu += mc
                out.append(m)
            mk = out[0]
            flows.append((mk.flow.n_flows, mk.flow.n_false_pairs))
            base_u.append(scalars(mk))
            for r, m in zip(runs, out[1:], strict=True):
                other_u[r].append(scalars(m, mk))
            if n == 1 and s == 1:
                cost["untraced"], cost["traced"] = overhead(sn_k.network, args, s)
            print(f"  network {n} seed {s}: {len(sn_k.population)} relays, {len(sn_k.network.circuits)} circuits "
                  f"({len(probes)} probes), flows {mk.flow.n_flows:,} (false pairs {mk.flow.n_false_pairs:,}), "
                  f"fingerprinting targets {mk.fingerprint.targets if mk.fingerprint else 0}, NICs "
                  f"x{sn_k.traffic.bandwidth_scale:.3f}", flush=True)
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    diffs = {r: {d.measure: d for d in paired_differences(base_u, other_u[r])} for r in runs}
    say("")
    say(f"CPU: {cpu_model()}")
    say(f"units: {args.networks} networks x {args.seeds} seeds; scale {args.scale} of the bundled consensus; "
          f"{args.duration:g} s simulated, measured over [{args.warmup:g}, {args.duration:g}) s; KIST at "
          f"{args.interval_ms} ms; load {args.load}; {'NICs scaled to 75 MB/s' if args.fast else 'full NIC rates'}; "
          f"flow segments {args.segment:g} s; {args.targets} probes")
    n_flows = min(f for f, _ in flows)
    n_false = min(f for _, f in flows)
    say(f"flows per unit >= {n_flows:,}, false pairs >= {n_false:,}: resolvable FPRs "
          f"{', '.join(f'{a:g}' for a in resolvable_fprs(n_flows, n_false))}")
    say("")
    say("| measure | leakier | baseline (KIST) | Vanilla - KIST [95 % CI] | A/A: KIST - KIST [95 % CI] | "
          "leaky control - KIST [95 % CI] | control |")
    say("|---|---|---|---|---|---|---|")
    for name in diffs["Vanilla"]:
        c = diffs["control"][name]
        way = leakier(name)
        moved = "moves, leakier" if c.significant and c.mean_difference * way > 0 else \
            "moves, less leaky" if c.significant else "blind"
        base = np.nanmean([u.get(name, math.nan) for u in base_u])
        say(f"| {name} | {'up' if way > 0 else 'down'} | {base:.3g} | {cell(diffs['Vanilla'][name])} | "
              f"{cell(diffs['A/A'][name])} | {cell(c)} | {moved} |")
    say("(* the 95 % interval excludes 0; the KS distance of a baseline to itself is 0, so its A/A row is the"
          " noise floor)")
    say("")
    share = meas_cpu / sim_cpu
    trace_cost = cost["traced"] / cost["untraced"] - 1
    say(f"cost: computing the measures {meas_cpu:.1f} CPU-s for {sim_cpu:.1f} CPU-s of traced simulation "
          f"({100 * share:.1f} %); recording the trace {100 * trace_cost:+.1f} % CPU of the run (least of 3 "
          f"alternating runs each, first unit); the probes add "
          f"{100 * (cost['untraced'] / cost['no probes'] - 1):+.1f} %"
          " to the simulation")
    say(f"wall time {time.perf_counter() - wall0:.0f} s")

    if args.doc:
        import validation_rates

        text = "\n".join([SECTION_BEGIN, "## Anonymity: KIST against Vanilla, and a leaky control", "",
                          f"Written by `bench/validation.py --anonymity` (bench/anonymity_validation.py) on "
                          f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; the method, sources and limits "
                          "are in "
                          "[anonymity.md](anonymity.md). Stage minus baseline per network and seed, mean [95 % t "
                          "interval]; the KIST papers (Jansen et al.) expect no significant change from KIST against "
                          "Vanilla, and the leaky control (one circuit per channel, nothing else on the relays) must "
                          "move a measure, or the measure is blind in this model.", "", *lines, SECTION_END])
        validation_rates.write(validation_rates.ROOT / "docs" / "validation.md", text,
                               begin=SECTION_BEGIN, end=SECTION_END)
        print("wrote docs/validation.md")

if __name__ == "__main__":
    main()
