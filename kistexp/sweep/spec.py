"""The sweep file (docs/sweeps.md): which values, loads, loss rates, class mixes, seeds and sampled networks.

Loaded with tomli into frozen attrs and checked like a plan (``kistexp.plan.loader``'s located errors:
``FILE:LINE: KEY: problem``): unknown keys, empty axes, values outside tor's bounds (``kistexp.params``),
loads, loss rates and scales outside their ranges.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable
from pathlib import Path

import attrs
import tomli

from kistexp import params
from kistexp.errors import PlanError, PopulationError, SweepError
from kistexp.plan.tomlschema import Source, Table, type_name
from kistexp.safeio import read_bounded_text

MAX_SWEEP_BYTES = 256 * 1024
MAX_AXIS = 10_000
# a larger grid is refused unless the user confirms (--yes): it is hours of a cluster
CONFIRM_CELLS = 10_000
# a larger grid is refused even with --yes, before any of it is built: the axes multiply, so a few
# 10,000-value axes name billions of cells, and the submitting process holds every cell's task and result
# (about 260 KB each once the results are tabulated: 26 GB at this limit). 100,000 small cells are about
# 15 min of a 320-core cluster, 14 h of a 2-core laptop.
MAX_CELLS = 100_000
# each class mix is a file to read and parse before anything runs
MAX_CLASS_MIXES = 100
BUNDLED_MIX = "bundled"  # the class mix of kistexp/data/relay-classes.toml

ValueSet = tuple[tuple[str, int], ...]


@attrs.frozen
class Recommend:
    """"lowest ``parameter`` value whose ``metric`` rise over ``baseline`` stays under ``max_rise_percent``
    for relays of ``relay_class``"."""

    parameter: str
    relay_class: str
    max_rise_percent: float
    baseline: int
    metric: str = "relay_cpu_utilization"


@attrs.frozen
class Sweep:
    path: str
    name: str
    description: str
    duration_s: float
    parameters: tuple[str, ...]  # names, in file order
    value_sets: tuple[ValueSet, ...]
    loads: tuple[float, ...]
    loss_rates: tuple[float, ...]
    seeds: tuple[int, ...]
    scale: float
    samples: tuple[int, ...]  # one sampled network per sample seed
    consensus: str | None  # None: the population's default consensus
    class_mixes: tuple[tuple[str, str | None], ...]  # (name, relay-class TOML path or None = bundled)
    recommend: tuple[Recommend, ...]
    # NICs scaled down to the fast-mode byte budget (`kistexp sweep --fast`); default: full NIC rates
    fast: bool = False

    @property
    def n_cells(self) -> int:
        return (len(self.value_sets) * len(self.loads) * len(self.loss_rates) * len(self.class_mixes)
                * len(self.seeds) * len(self.samples))


def _error(src: Source, key: str, problem: str) -> SweepError:
    exc = src.error(key, problem)
    return SweepError(str(exc))


def _checked_value(src: Source, key: str, name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _error(src, key, f"expected an integer value of {name}, got {type_name(value)}")
    bounds = params.get(name).current  # type: ignore[union-attr]
    if not bounds.minimum <= value <= bounds.maximum:
        raise _error(src, key, f"{value} is outside tor's bounds {bounds.minimum}..{bounds.maximum} for {name} "
                               f"(tor would run {bounds.clamp(value)})")
    return value


def _param_name(src: Source, key: str, name: str) -> str:
    if params.get(name) is None:
        close = params.suggest(name)
        hint = f" (did you mean {close}?)" if close else " (see kistexp params)"
        raise _error(src, key, f"unknown consensus parameter {name!r}{hint}")
    return name


def _numbers(t: Table, name: str, low: float, high: float, what: str, *, high_open: bool = True,
             default: list | None = None) -> tuple[float, ...]:
    items = t.array(name, required=default is None, limit=MAX_AXIS) if t.has(name) or default is None \
        else default
    if not items:
        raise _error(t.src, t.key(name), "is empty: the grid would have no cells")
    out = []
    for i, v in enumerate(items):
        key = f"{t.key(name)}[{i}]"
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _error(t.src, key, f"expected a number, got {type_name(v)}")
        if not (low < v < high if high_open else low <= v <= high) and not (v == low == 0):
            interval = f"({low:g}, {high:g})" if high_open else f"[{low:g}, {high:g}]"
            raise _error(t.src, key, f"{v} is outside {interval}: {what}")
        out.append(float(v))
    if len(set(out)) != len(out):
        raise _error(t.src, t.key(name), "lists a value twice")
    return tuple(out)


def _integers(t: Table, name: str, default: list[int] | None = None) -> tuple[int, ...]:
    items = t.array(name, required=default is None, limit=MAX_AXIS) if t.has(name) or default is None \
        else default
    if not items:
        raise _error(t.src, t.key(name), "is empty: the grid would have no cells")
    for i, v in enumerate(items):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**32:
            raise _error(t.src, f"{t.key(name)}[{i}]", f"expected a seed (integer 0..2^32-1), got {v!r}")
    if len(set(items)) != len(items):
        raise _error(t.src, t.key(name), "lists a seed twice")
    return tuple(items)


def _value_sets(root: Table) -> tuple[tuple[str, ...], str, int, Callable[[], tuple[ValueSet, ...]]]:
    """The swept names, a grid's axis sizes in words ("" for a list), the number of value sets and a
    function building them: a grid's combinations are built only once the whole grid is known to be within MAX_CELLS."""
    src = root.src
    if root.has("values") == root.has("value_sets"):
        raise _error(src, "values", "give either [values] (a grid: every combination) or [[value_sets]] "
                                    "(a list), not " + ("both" if root.has("values") else "neither"))
    if root.has("values"):
        grid = root.table("values")
        assert grid is not None
        if not grid.data:
            raise _error(src, "values", "is empty: the grid would have no cells")
        names, axes = [], []
        for name in grid.data:
            key = grid.key(str(name))
            names.append(_param_name(src, key, str(name)))
            items = grid.array(str(name), limit=MAX_AXIS)
            if not items:
                raise _error(src, key, "is empty: the grid would have no cells")
            axes.append([_checked_value(src, f"{key}[{i}]", name, v) for i, v in enumerate(items)])
            if len(set(axes[-1])) != len(axes[-1]):
                raise _error(src, key, "lists a value twice")
        count = math.prod(len(a) for a in axes)
        sizes = " x ".join(f"{len(a):,} {n}" for n, a in zip(names, axes, strict=True))
        return (tuple(names), sizes, count,
                lambda: tuple(tuple(zip(names, combo, strict=True)) for combo in itertools.product(*axes)))
    items = root.array("value_sets", limit=MAX_AXIS)
    if not items:
        raise _error(src, "value_sets", "is empty: the grid would have no cells")
    names = []
    sets = []
    for i, item in enumerate(items):
        t = Table(src, item, f"value_sets[{i}]")
        if not t.data:
            raise _error(src, t.path, "is empty: give at least one parameter value")
        vs = []
        for name, v in t.data.items():
            key = t.key(str(name))
            _param_name(src, key, str(name))
            vs.append((str(name), _checked_value(src, key, str(name), v)))
            if name not in names:
                names.append(str(name))
        sets.append(tuple(vs))
    for i, vs in enumerate(sets):
        if {n for n, _ in vs} != set(names):
            missing = sorted(set(names) - {n for n, _ in vs})
            raise _error(src, f"value_sets[{i}]", f"no value for {', '.join(missing)} (every set names the same "
                                                  "parameters)")
    canon = [tuple(sorted(vs)) for vs in sets]
    if len(set(canon)) != len(canon):
        raise _error(src, "value_sets", "lists a value set twice")
    listed = tuple(tuple((n, dict(vs)[n]) for n in names) for vs in sets)
    return tuple(names), "", len(listed), lambda: listed


def _class_mixes(root: Table, base: Path) -> tuple[tuple[str, str | None], ...]:
    if not root.has("class_mixes"):
        return ((BUNDLED_MIX, None),)
    t = _mix_table(root)
    out: list[tuple[str, str | None]] = []
    for name in t.data:
        text = t.string(str(name))
        if text == BUNDLED_MIX:
            out.append((str(name), None))
            continue
        if "\0" in text:
            raise _error(root.src, t.key(str(name)), f"{text!r}: a file name cannot hold a NUL byte")
        path = Path(text) if Path(text).is_absolute() else base / text
        from kistexp.population.classes import load_class_shares

        try:
            load_class_shares(path)  # read bounded (kistexp.safeio): a device, FIFO or huge file is refused
        except PopulationError as exc:
            raise _error(root.src, t.key(str(name)), str(exc)) from None
        out.append((str(name), str(path)))
    return tuple(out)


def _mix_table(root: Table) -> Table:
    t = root.table("class_mixes")
    assert t is not None
    if not t.data:
        raise _error(root.src, "class_mixes", "is empty: the grid would have no cells")
    if len(t.data) > MAX_CLASS_MIXES:
        raise _error(root.src, "class_mixes", f"has {len(t.data)} mixes, more than the limit of {MAX_CLASS_MIXES}")
    return t


def _check_size(path: str, sizes: dict[str, int], grid: str) -> None:
    """Refuse a grid of more than MAX_CELLS cells, counted from its axes before any of it is built;
    ``grid`` spells out the [values] grid's own axes."""
    total = math.prod(sizes.values())
    if total > MAX_CELLS:
        axes = " x ".join(f"{n:,} {k}" + (f" ({grid})" if k == "value sets" and grid else "")
                          for k, n in sizes.items())
        raise SweepError(f"{path}: the grid has {total:,} cells = {axes}, more than the limit of {MAX_CELLS:,} "
                         "even with --yes; split it into several sweeps")


def _recommend(root: Table, names: tuple[str, ...], value_sets: tuple[ValueSet, ...]) -> tuple[Recommend, ...]:
    from kistexp.metrics import catalogue

    out = []
    for i, item in enumerate(root.array("recommend", required=False, limit=100)):
        t = Table(root.src, item, f"recommend[{i}]")
        t.check_keys(("parameter", "relay_class", "max_rise_percent", "baseline", "metric"))
        default_param = names[0] if len(names) == 1 else None
        parameter = t.string("parameter", required=default_param is None, default=default_param or "")
        if parameter not in names:
            raise _error(root.src, t.key("parameter"), f"{parameter!r} is not swept (swept: {', '.join(names)})")
        metric = t.string("metric", required=False, default="relay_cpu_utilization")
        if catalogue.get(metric) is None:
            raise _error(root.src, t.key("metric"), f"{metric!r} is not a metric of the catalogue")
        relay_class = t.string("relay_class", required=False, default="all")
        if not relay_class:
            raise _error(root.src, t.key("relay_class"), "is empty (use \"all\" for every relay)")
        rise = t.number("max_rise_percent")
        if not 0 <= rise <= 10_000:
            raise _error(root.src, t.key("max_rise_percent"), f"{rise:g} is outside 0..10000 (percent)")
        default = params.get(parameter).current.default  # type: ignore[union-attr]
        baseline = t.integer("baseline", 0, 2**31 - 1, required=False, default=default)
        swept = {dict(vs)[parameter] for vs in value_sets}
        if baseline not in swept:
            raise _error(root.src, t.key("baseline") if t.has("baseline") else t.path,
                         f"the baseline {parameter}={baseline} is not among the swept values "
                         f"({', '.join(str(v) for v in sorted(swept))}): rises are measured against it")
        out.append(Recommend(parameter, relay_class, rise, baseline, metric))
    return tuple(out)


_TOP_KEYS = ("name", "description", "duration", "values", "value_sets", "traffic", "population", "class_mixes",
             "recommend")


def parse_sweep(text: str, path: str = "<sweep>") -> Sweep:
    src = Source(path, text)
    try:
        data = tomli.loads(text)
    except tomli.TOMLDecodeError as exc:
        message = str(exc).splitlines()[0] if str(exc) else "invalid TOML"
        raise SweepError(f"{path}: not valid TOML: {message}") from None
    except (RecursionError, ValueError) as exc:
        # tomli raises these for arrays nested past its limit and for integers of more than 4,300 digits
        # (int()'s limit); neither is a TOMLDecodeError
        message = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise SweepError(f"{path}: not valid TOML: {message}") from None
    try:
        root = Table(src, data, "")
        root.check_keys(_TOP_KEYS)
        name = root.string("name")
        if not name.strip():
            raise _error(src, "name", "is empty")
        # the name is the output directory under sweeps/: one plain path component, never a way out of it
        if name in (".", "..") or any(c in name for c in "/\\\0"):
            raise _error(src, "name", f"{name!r} is not a directory name (no /, \\, NUL, '.' or '..'): it names "
                         "the sweep's output directory under sweeps/")
        duration = root.duration("duration").total_seconds()
        if not 3 <= duration <= 3600:
            raise _error(src, "duration", f"{duration:g} s is outside 3 s .. 1 h of simulated time per cell")
        names, detail, n_sets, build_sets = _value_sets(root)
        traffic = root.table("traffic", required=False) or Table(src, {}, "traffic")
        traffic.check_keys(("loads", "loss_rates", "seeds"))
        loads = _numbers(traffic, "loads", 0.0, 1.0, "a target mean relay utilisation", default=[0.4])
        if 0.0 in loads:
            raise _error(src, "traffic.loads", "0 is not a load: a mean relay utilisation in (0, 1)")
        losses = _numbers(traffic, "loss_rates", 0.0, 0.5, "a packet-loss rate in [0, 0.5)", default=[0.0])
        seeds = _integers(traffic, "seeds", default=[1])
        pop = root.table("population", required=False) or Table(src, {}, "population")
        pop.check_keys(("scale", "samples", "consensus"))
        scale = pop.number("scale", required=False, default=0.01)
        if not 0 < scale <= 1:
            raise _error(src, "population.scale", f"{scale:g} is outside (0, 1]: the share of relays kept")
        samples = _integers(pop, "samples", default=[1])
        n_mixes = len(_mix_table(root).data) if root.has("class_mixes") else 1
        _check_size(path, {"value sets": n_sets, "loads": len(loads), "loss rates": len(losses),
                           "class mixes": n_mixes, "seeds": len(seeds), "samples": len(samples)}, detail)
        value_sets = build_sets()
        base = Path(path).resolve().parent if path != "<sweep>" else Path.cwd()
        consensus = None
        if pop.has("consensus"):
            c = Path(pop.string("consensus"))
            c = c if c.is_absolute() else base / c
            try:
                found = "\0" not in str(c) and c.is_file()
            except OSError as exc:  # a name too long for the file system, a path through a file
                raise _error(src, "population.consensus", f"cannot use {str(c)[:200]!r}: "
                                                          f"{exc.strerror or exc}") from None
            if not found:
                raise _error(src, "population.consensus", f"{c}: no such file")
            consensus = str(c)
        mixes = _class_mixes(root, base)
        recommend = _recommend(root, names, value_sets)
        return Sweep(path=path, name=name, description=root.string("description", required=False),
                     duration_s=duration, parameters=names, value_sets=value_sets, loads=loads,
                     loss_rates=losses, seeds=seeds, scale=scale, samples=samples, consensus=consensus,
                     class_mixes=mixes, recommend=recommend)
    except PlanError as exc:
        raise SweepError(str(exc)) from None


def load_sweep(path: str | os.PathLike[str]) -> Sweep:
    """Read and check a sweep file; a one-line SweepError names the file, line and key."""
    text = read_bounded_text(path, MAX_SWEEP_BYTES, "sweep", SweepError)
    return parse_sweep(text, os.fsdecode(path))
