"""Where the simulator's compiled kernel spends its time: a per-function profile from ``perf``.

numba's JIT code has no symbols ``perf`` can see, and its debug-info build runs an order of
magnitude slower, so the profile would not be of the code that runs. This script instead:

1. runs one case of ``bench/sim_bench.py`` under ``perf record -e cpu-clock`` in a child that
   compiles the kernel into a fresh numba cache directory (about 100 s: a library loaded from the
   cache keeps no object code), then writes each compiled library's object code and its load
   address (from a strong symbol of that library: weak ones resolve to whichever copy was loaded
   first);
2. maps every sampled instruction address to the function of the library it lies in (``nm``
   gives each function's offset and size in the object) and prints the share of samples per
   function; ``--annotate NAME`` also prints that function's hottest instructions (``objdump``).

A software clock samples a few instructions after the one that stalled: a hot instruction is
usually just after a load that missed the cache.

Case ``p`` is the population benchmark's: a 2,000-relay sample of the bundled consensus at full NIC
rates (``bench/population_bench.py``), whose shares docs/simulator.md ("Where the time goes") lists.
``--python`` instead times, without ``perf``, what a stepped run (a rollout, ``kistexp simulate``) does in
Python around the compiled loop on that network: building it, the steps, a window, a new consensus for
every relay, the result.

    .venv/bin/python bench/sim_profile.py [--case a|b|c|p] [--duration S] [--top N] [--annotate kist_run]
    .venv/bin/python bench/sim_profile.py --python [--duration S]
"""

from __future__ import annotations

import argparse
import bisect
import collections
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _demangle(symbol: str) -> str:
    """numba's Itanium-style names: ``_ZN7kistexp3sim4kist8kist_runB4v313...`` -> kistexp.sim.kist.kist_run."""
    parts, rest = [], symbol[3:] if symbol.startswith("_ZN") else symbol
    while rest[:1].isdigit():
        n = re.match(r"\d+", rest).group()
        parts.append(rest[len(n): len(n) + int(n)])
        rest = rest[len(n) + int(n):]
    return ".".join(parts) or symbol


def _text_symbols(obj: Path) -> list[tuple[int, int, str, str]]:
    out = subprocess.run(["nm", "-S", "--defined-only", str(obj)], capture_output=True, text=True,
                         check=True).stdout
    syms = []
    for line in out.splitlines():
        p = line.split()
        if len(p) == 4 and p[2] in "tTwW" and int(p[1], 16) > 0:
            syms.append((int(p[0], 16), int(p[1], 16), p[3], p[2]))
    return syms


def population_case(duration_s: float, scale: float = 2000 / 6075):
    """The network and run of ``bench/population_bench.py``'s full-rate case: a sample of the bundled
    consensus, NICs at their capacity estimates (``TrafficModel.bandwidth_scale`` 1), load 0.4."""
    from kistexp.population.relays import load_population
    from kistexp.population.sampling import sample
    from kistexp.population.simnet import TrafficModel, build_network
    from kistexp.sim import RunConfig

    pop = sample(load_population(), scale, 1) if scale < 1 else load_population()
    sn = build_network(pop, duration_s=duration_s, seed=1, interval_ms=2, scale=scale,
                       traffic=TrafficModel(load=0.4, warmup_s=min(10.0, duration_s / 6)))
    return sn.network, RunConfig(duration_s=duration_s, seed=1, memory_limit_bytes=12 * 1024**3)


def python_side(duration_s: float) -> None:
    """CPU time (``time.process_time``) of the Python around the compiled loop, case ``p``."""
    import time

    from kistexp.localnet import machine
    from kistexp.sim import Simulation, warm_up

    warm_up()
    c = time.process_time()
    net, rc = population_case(duration_s)
    build = time.process_time() - c
    c = time.process_time()
    sim = Simulation(net, rc)
    init = time.process_time() - c
    half = duration_s / 2
    c = time.process_time()
    sim.advance_to(half)
    first = time.process_time() - c
    c = time.process_time()
    sim.advance_to(half + 1e-6)  # a step with (nearly) nothing to run: the cost of a call
    empty = time.process_time() - c
    c = time.process_time()
    sim.window(0.0, half)
    window = time.process_time() - c
    relays = [i for i, n in enumerate(net.nodes) if n.role != "client"]
    c = time.process_time()
    sim.apply(relays, {"KISTSchedRunInterval": 10})
    apply = time.process_time() - c
    c = time.process_time()
    sim.advance_to(duration_s)
    second = time.process_time() - c
    c = time.process_time()
    sim.result()
    result = time.process_time() - c
    print(f"case (p) on {machine.cpu_model()}, {duration_s:g} simulated s, core-seconds: network built {build:.2f}, "
          f"Simulation() {init:.2f}, advance_to 0-{half:g} s {first:.2f}, an empty advance_to {empty * 1e3:.2f} ms, "
          f"window {window:.3f}, apply to {len(relays)} relays {apply:.3f}, advance_to {half:g}-{duration_s:g} s "
          f"{second:.2f}, result() {result:.3f}")


def child(case: str, duration_s: float, outdir: Path) -> None:
    """Compile afresh, run the case, write every library's object code and load address."""
    sys.path.insert(0, str(HERE))
    import sim_bench
    from numba.core.registry import CPUDispatcher

    from kistexp.sim import RunConfig, run, warm_up
    from kistexp.sim.numbacache import COMPILED_MODULES

    warm_up()
    if case == "p":
        net, rc = population_case(duration_s)
    else:
        net = sim_bench.CASES[case]("kist", duration_s)
        rc = RunConfig(duration_s=duration_s, seed=7, sample_interval_s=1.0)
    res = run(net, rc)
    libs, n = [], 0
    for name in COMPILED_MODULES:
        module = importlib.import_module(f"kistexp.sim.{name}")
        for attr, value in vars(module).items():
            if not isinstance(value, CPUDispatcher):
                continue
            for cres in value.overloads.values():
                lib = cres.library
                try:
                    code = lib._get_compiled_object()
                except RuntimeError:
                    continue  # loaded from a cache: no object code kept
                path = outdir / f"lib{n}.o"
                n += 1
                path.write_bytes(code)
                syms = _text_symbols(path)
                base = None
                for off, _size, sym, kind in syms:
                    if kind == "T":
                        addr = lib.get_pointer_to_function(sym)
                        if addr:
                            base = addr - off
                            break
                if base is not None:
                    libs.append({"lib": f"{name}.{attr}", "path": str(path), "base": base, "syms": syms})
    (outdir / "libs.json").write_text(json.dumps(libs))
    print(json.dumps({"cells": res.cells_scheduled, "events": res.events, "kernel_wall_s": res.wall_s}))


def report(outdir: Path, top: int, annotate: str | None) -> None:
    libs = json.loads((outdir / "libs.json").read_text())
    ranges = sorted((lib["base"] + off, lib["base"] + off + size, _demangle(sym), lib["path"], off, lib["base"])
                    for lib in libs for off, size, sym, _ in lib["syms"])
    starts = [r[0] for r in ranges]
    script = subprocess.run(["perf", "script", "-i", str(outdir / "perf.data"), "-F", "ip,dso"],
                            capture_output=True, text=True).stdout
    per_fn: collections.Counter = collections.Counter()
    per_ins: collections.Counter = collections.Counter()
    total = 0
    for line in script.splitlines():
        if "perf-" not in line:  # JIT code: perf's anonymous executable memory
            continue
        ip = int(line.split()[0], 16)
        total += 1
        i = bisect.bisect_right(starts, ip) - 1
        if i >= 0 and ip < ranges[i][1]:
            r = ranges[i]
            per_fn[r[2]] += 1
            per_ins[(r[2], r[3], r[4], ip - r[5])] += 1
    if not total:
        raise SystemExit("no samples in JIT code (is perf allowed? kernel.perf_event_paranoid)")
    print(f"{total:,} samples in compiled code; share per function:")
    for fn, n in per_fn.most_common(top):
        print(f"  {n / total * 100:5.1f} %  {fn}")
    if annotate:
        hits = {k: v for k, v in per_ins.items() if k[0].endswith("." + annotate) or k[0] == annotate}
        if not hits:
            raise SystemExit(f"--annotate {annotate}: no samples in a function of that name")
        fn_total = sum(hits.values())
        (name, path, start, _), _ = max(hits.items(), key=lambda kv: kv[1])
        size = next(s for lib in libs if lib["path"] == path for off, s, _, _ in lib["syms"] if off == start)
        dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--start-address={start}",
                              f"--stop-address={start + size}", path], capture_output=True, text=True).stdout
        at = {k[3]: v for k, v in hits.items() if k[1] == path and k[2] == start}
        lines = []
        for line in dis.splitlines():
            m = re.match(r"\s*([0-9a-f]+):\s*(.*)", line)
            if m:
                lines.append((int(m.group(1), 16), m.group(2)))
        hot = [i for i in sorted(range(len(lines)), key=lambda i: -at.get(lines[i][0], 0))[:top]
               if at.get(lines[i][0])]
        shown = sorted({j for i in hot for j in range(max(0, i - 6), i + 1)})
        print(f"\n{name}: hottest instructions ({fn_total:,} samples; each with the 6 before it)")
        for n, j in enumerate(shown):
            if n and j != shown[n - 1] + 1:
                print("  ...")
            a, text = lines[j]
            print(f"  {at.get(a, 0) / fn_total * 100:5.1f} %  +{a - start:5x}  {text[:90]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="a", choices=("a", "b", "c", "p"))
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--annotate", help="a function's name, e.g. kist_run or on_arrival")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--python", action="store_true", help="time the Python around the compiled loop (case p)")
    args = ap.parse_args()
    if args.python:
        python_side(args.duration)
        return
    if args.child:
        child(args.case, args.duration, Path(args.child))
        return
    for tool in ("perf", "nm", "objdump"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found (Debian: apt-get install linux-perf binutils)")
    with tempfile.TemporaryDirectory(prefix="kistexp-profile-") as tmp:
        out = Path(tmp)
        env = dict(os.environ, KISTEXP_NUMBA_CACHE=str(out / "numba"), OPENBLAS_NUM_THREADS="1")
        rec = subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-F", "4000", "-o", str(out / "perf.data"),
                              "--", sys.executable, __file__, "--case", args.case, "--duration",
                              str(args.duration), "--child", str(out)], env=env, capture_output=True, text=True)
        if rec.returncode != 0:
            raise SystemExit(f"perf record failed: {(rec.stderr.strip().splitlines() or ['?'])[-1]}")
        figures = json.loads(rec.stdout.strip().splitlines()[-1])
        print(f"case ({args.case}), {args.duration:g} s simulated: {figures['cells']:,} cells, "
              f"{figures['events']:,} events, kernel {figures['kernel_wall_s']:.2f} s under perf")
        report(out, args.top, args.annotate)


if __name__ == "__main__":
    main()
