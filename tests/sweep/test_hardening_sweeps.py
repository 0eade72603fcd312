"""Sweeps under hostile and broken input (issue 34, points 4, 6 and 8): class-mix files and cache entries
that are devices, FIFOs, directories, huge, corrupt or NaN-filled; grids of billions of cells; Dask
addresses that name no scheduler or a peer that never answers; property tests of the sweep loader and
the cache loader."""

from __future__ import annotations

import concurrent.futures as cf
import datetime as dt
import itertools
import json
import math
import os
import socket
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kistexp.cli import app
from kistexp.errors import SweepError
from kistexp.sweep import cache as cache_mod
from kistexp.sweep import cells as cells_mod
from kistexp.sweep import spec as spec_mod
from kistexp.sweep.cache import CellCache, check_result
from kistexp.sweep.cells import CellGrid, CellResult, expand
from kistexp.sweep.execute import DaskBackend, LocalBackend, execute
from kistexp.sweep.spec import Sweep, parse_sweep

TINY = """
name = "tiny"
duration = "4s"

[values]
KISTSchedRunInterval = [2, 10]

[traffic]
loads = [0.4]
seeds = [1]

[population]
scale = 0.005
samples = [1, 2]
"""

MIX = Path(__file__).resolve().parents[2] / "plans" / "sweeps" / "classes-hz1000.toml"


def _one_line_error(fn, *args, **kwargs) -> str:
    with pytest.raises(SweepError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert message and "\n" not in message
    return message


def _cli(*argv: str):
    return CliRunner().invoke(app, list(argv))


def _cli_error(*argv: str) -> str:
    result = _cli(*argv)
    assert isinstance(result.exception, SweepError), result.output
    assert "\n" not in str(result.exception)
    return str(result.exception)


def _with_mix(path: str) -> str:
    return TINY + f'\n[class_mixes]\nodd = "{path}"\n'


def _result(key: str, **changes) -> CellResult:
    """A cell result as the simulator makes one (catalogue metrics, finite figures)."""
    figures = (("client_ttfb_s", "", 0.12, 0.33), ("relay_cpu_utilization", "all", 0.004, 0.009),
               ("relay_cpu_utilization", "KIST HZ=250", 0.005, 0.010))
    return attrs.evolve(CellResult(key, figures, 30, 124, 0.52, 0.29, 0.55, "host:1"), **changes)


# --- class mixes: bounded reads -------------------------------------------------------------------


@pytest.fixture(scope="module")
def odd_files(tmp_path_factory) -> dict[str, Path]:
    """A FIFO, a directory, a sparse file of 3 GB and a /proc file, each named as a class mix."""
    tmp = tmp_path_factory.mktemp("odd")
    fifo = tmp / "fifo.toml"
    os.mkfifo(fifo)
    (tmp / "dir.toml").mkdir()
    huge = tmp / "huge.toml"
    with open(huge, "wb") as f:
        f.truncate(3 * 2**30)
    (tmp / "zero.toml").symlink_to("/dev/zero")
    return {"/dev/zero": Path("/dev/zero"), "link to /dev/zero": tmp / "zero.toml", "FIFO": fifo,
            "directory": tmp / "dir.toml", "huge": huge, "/proc": Path("/proc/self/status")}


@pytest.mark.parametrize("kind, words", [
    ("/dev/zero", "found a character device"), ("link to /dev/zero", "found a character device"),
    ("FIFO", "found a FIFO"), ("directory", "found a directory"), ("huge", "larger than the 1048576-byte limit"),
    ("/proc", "kernel file"),
])
def test_a_class_mix_that_is_no_regular_file_is_refused_at_once(odd_files, kind, words):
    t0 = time.monotonic()
    message = _one_line_error(parse_sweep, _with_mix(str(odd_files[kind])), "s.toml")
    assert time.monotonic() - t0 < 5
    assert message.startswith("s.toml:") and "class_mixes.odd" in message and str(odd_files[kind]) in message
    assert words in message


def test_a_class_mix_with_nan_shares_or_huge_numbers_is_refused(tmp_path):
    text = MIX.read_text()
    for old, new, words in (("linux = 0.93", "linux = nan", "os.linux: expected a finite number"),
                            ("bsd = 0.05", "bsd = inf", "os.bsd: expected a finite number"),
                            ("linux = 0.93", "linux = " + "9" * 400, "os.linux: expected a finite number"),
                            ("[os]", "x = " + "[" * 1000 + "]" * 1000 + "\n[os]", "not valid TOML")):
        path = tmp_path / f"mix-{len(new)}-{new[:4]}.toml"
        path.write_text(text.replace(old, new))
        message = _one_line_error(parse_sweep, _with_mix(str(path)), "s.toml")
        assert str(path) in message and words in message, message


def test_a_class_mix_name_with_a_nul_byte_is_refused():
    assert "NUL byte" in _one_line_error(parse_sweep, TINY + '\n[class_mixes]\nodd = "a\\u0000b"\n', "s.toml")


def test_more_class_mixes_than_the_limit_are_refused_before_any_is_read(monkeypatch):
    monkeypatch.setattr(spec_mod, "MAX_CLASS_MIXES", 3)
    mixes = "".join(f'm{i} = "/dev/zero"\n' for i in range(4))
    assert "has 4 mixes, more than the limit of 3" in _one_line_error(
        parse_sweep, TINY + "\n[class_mixes]\n" + mixes, "s.toml")


# --- the sweep file: what the TOML reader itself raises -----------------------------------------------


@pytest.mark.parametrize("text, words", [
    (TINY + "\nx = " + "[" * 1000 + "]" * 1000, "not valid TOML"),
    (TINY.replace("seeds = [1]", "seeds = [" + "9" * 5000 + "]"), "not valid TOML"),
    (TINY.replace("scale = 0.005", 'scale = 0.005\nconsensus = "' + "a" * 5000 + '"'), "population.consensus"),
    (TINY.replace("scale = 0.005", 'scale = 0.005\nconsensus = "a\\u0000b"'), "population.consensus"),
])
def test_sweep_files_that_broke_the_loader_are_one_line_errors(text, words):
    assert words in _one_line_error(parse_sweep, text, "s.toml")


# --- grids: counted from the axes, refused above the limit, built lazily ------------------------------


def _big_grid_text() -> str:
    """2,000,000,000 cells: 10 x 10,000 values x 10 loads x 2,000 seeds."""
    return (TINY.replace("KISTSchedRunInterval = [2, 10]",
                         f"KISTSchedRunInterval = {list(range(2, 12))}\n"
                         f"CircuitPriorityHalflifeMsec = {list(range(1, 10_001))}")
            .replace("loads = [0.4]", f"loads = {[round(0.05 + 0.09 * i, 2) for i in range(10)]}")
            .replace("seeds = [1]", f"seeds = {list(range(2000))}").replace("samples = [1, 2]", "samples = [1]"))


def test_a_two_billion_cell_grid_is_refused_before_memory_grows(tmp_path):
    text = _big_grid_text()
    tracemalloc.start()
    try:
        message = _one_line_error(parse_sweep, text, "big.toml")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50 * 2**20  # the parsed TOML, not 100,000 value sets (let alone 2e9 cells)
    assert ("big.toml: the grid has 2,000,000,000 cells = 100,000 value sets (10 KISTSchedRunInterval x 10,000 "
            "CircuitPriorityHalflifeMsec) x 10 loads x 1 loss rates x 1 class mixes x 2,000 seeds x 1 samples, "
            "more than the limit of 100,000 even with --yes") in message
    # the same through the command, with --yes
    path = tmp_path / "big.toml"
    path.write_text(text)
    assert "2,000,000,000 cells" in _cli_error("sweep", str(path), "--yes", "--cache", str(tmp_path / "c"))


def test_the_cell_limit_counts_every_axis(monkeypatch):
    monkeypatch.setattr(spec_mod, "MAX_CELLS", 7)
    assert parse_sweep(TINY.replace("seeds = [1]", "seeds = [1, 2, 3]").replace("samples = [1, 2]", "samples = [1]"),
                       "s.toml").n_cells == 6
    message = _one_line_error(parse_sweep, TINY.replace("seeds = [1]", "seeds = [1, 2]"), "s.toml")
    assert "8 cells = 2 value sets (2 KISTSchedRunInterval) x 1 loads x 1 loss rates x 1 class mixes x 2 seeds " \
           "x 2 samples, more than the limit of 7" in message
    listed = TINY.replace("[values]\nKISTSchedRunInterval = [2, 10]",
                          "[[value_sets]]\nKISTSchedRunInterval = 2\n[[value_sets]]\nKISTSchedRunInterval = 3\n"
                          "[[value_sets]]\nKISTSchedRunInterval = 4\n[[value_sets]]\nKISTSchedRunInterval = 5\n")
    assert "8 cells = 4 value sets x 1 loads" in _one_line_error(parse_sweep, listed, "s.toml")


def _fake_grid(sweep: Sweep) -> CellGrid:
    mixes = tuple((name, f"shares-{name}", f"digest-{name}") for name, _ in sweep.class_mixes)
    return CellGrid(sweep, tuple(f"net-{s}" for s in sweep.samples), mixes, "consensus", "geoip", "model")


def test_the_grid_is_lazy_countable_and_indexable_in_grid_order():
    s = parse_sweep(TINY.replace("loads = [0.4]", "loads = [0.3, 0.6]").replace("seeds = [1]", "seeds = [1, 2, 3]"))
    grid = _fake_grid(s)
    assert len(grid) == s.n_cells == 24
    tasks = list(grid)
    assert [t.index for t in tasks] == list(range(24))
    # the network varies fastest, then the seed, load and values (the order of the nested loops before)
    assert [(dict(t.values)["KISTSchedRunInterval"], t.load, t.seed, t.sample_seed) for t in tasks[:7]] == [
        (2, 0.3, 1, 1), (2, 0.3, 1, 2), (2, 0.3, 2, 1), (2, 0.3, 2, 2), (2, 0.3, 3, 1), (2, 0.3, 3, 2),
        (2, 0.6, 1, 1)]
    assert grid[23] == tasks[23] and grid[-1] == tasks[-1] and grid[3:5] == tasks[3:5]
    assert len({t.key for t in tasks}) == 24
    with pytest.raises(IndexError):
        grid[24]


def test_a_grid_at_the_cell_limit_holds_one_task_at_a_time():
    s = parse_sweep(TINY.replace("seeds = [1]", f"seeds = {list(range(5000))}")
                    .replace("KISTSchedRunInterval = [2, 10]", "KISTSchedRunInterval = [2, 3, 4, 5, 10]"))
    grid = _fake_grid(s)
    assert len(grid) == 50_000
    tracemalloc.start()
    try:
        task = next(itertools.islice(iter(grid), 20_000, None))  # the 20,001st, the others built and dropped
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert task.index == 20_000 and peak < 2**20


def test_too_many_sampled_relays_are_refused_before_sampling(monkeypatch):
    monkeypatch.setattr(cells_mod, "MAX_SAMPLED_RELAYS", 100)

    def never(*_a, **_k):
        raise AssertionError("sampled although over the limit")

    monkeypatch.setattr("kistexp.population.sampling.sample", never)
    s = parse_sweep(TINY.replace("samples = [1, 2]", "samples = [1, 2, 3, 4]"), "s.toml")
    message = _one_line_error(expand, s)
    assert message.startswith("s.toml: 4 samples x about 30 relays each") and "more than the limit of 100" in message


# --- Dask addresses ---------------------------------------------------------------------------------


@pytest.mark.parametrize("address, words", [
    ("foo://127.0.0.1:1", "unknown address scheme 'foo' (known: inproc, tcp, tls"),
    ("", "the scheduler address is empty"),
    ("tcp://", "no host in the address"),
])
def test_a_dask_address_that_names_no_scheduler_is_refused_at_once(address, words):
    t0 = time.monotonic()
    assert words in _one_line_error(DaskBackend, address, timeout_s=5)
    assert time.monotonic() - t0 < 2


@pytest.fixture
def silent_peer():
    """A TCP server on loopback that accepts connections and never says a word."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_a_silent_peer_fails_within_the_timeout(silent_peer):
    t0 = time.monotonic()
    message = _one_line_error(DaskBackend, f"tcp://127.0.0.1:{silent_peer}", timeout_s=1)
    assert time.monotonic() - t0 < 4  # the timeout plus the grace of a call left behind
    assert message == f"--dask tcp://127.0.0.1:{silent_peer}: no Dask scheduler answered within 1 s"


def test_a_dask_address_with_control_characters_is_shown_escaped():
    message = _one_line_error(DaskBackend, "foo://\x1b[31mred", timeout_s=1)
    assert "\x1b" not in message and "\\x1b" in message


@pytest.mark.parametrize("argv, words", [
    (["--dask", ""], "the scheduler address is empty"),
    (["--dask", "tcp://127.0.0.1:1", "--dask-timeout", "nan"], "--dask-timeout nan: must be a number of seconds"),
    (["--dask", "tcp://127.0.0.1:1", "--dask-timeout", "inf"], "--dask-timeout inf: must be a number of seconds"),
    (["--dask", "tcp://127.0.0.1:1", "--dask-timeout", "3601"], "in (0, 3600]"),
    (["--workers", "100000"], "--workers 100000: at most"),
])
def test_sweep_options_out_of_bounds_are_one_line_errors(tmp_path, argv, words):
    path = tmp_path / "s.toml"
    path.write_text(TINY)
    assert words in _cli_error("sweep", str(path), "--cache", str(tmp_path / "c"), "--no-plots", *argv)


def test_local_workers_are_bounded_by_the_cpus(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert LocalBackend(8).workers == 8
    assert "--workers 9: at most 8 (4 per CPU of this machine)" in _one_line_error(LocalBackend, 9)


# --- the cache: corrupt, NaN-filled, wrong-typed and odd entries are recomputed -------------------------


KEY = "ab" + "0" * 62


def _entry(cache: CellCache, key: str = KEY) -> Path:
    path = cache._path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _doc(**changes) -> dict:
    return {**attrs.asdict(_result(KEY)), **changes}


def _write_doc(path: Path, doc) -> None:
    path.write_text(json.dumps(doc))


CORRUPTIONS = {
    "truncated": lambda p: p.write_text(json.dumps(_doc())[:100]),
    "empty": lambda p: p.write_text(""),
    "garbage bytes": lambda p: p.write_bytes(bytes(range(256)) * 8),
    "a JSON list": lambda p: _write_doc(p, [1, 2, 3]),
    "a field missing": lambda p: _write_doc(p, {k: v for k, v in _doc().items() if k != "relays"}),
    "an unknown field": lambda p: _write_doc(p, _doc(extra=1)),
    "figures as a table": lambda p: _write_doc(p, _doc(figures={"abcd": 1})),
    "a figure of three": lambda p: _write_doc(p, _doc(figures=[["client_ttfb_s", "", 0.1]])),
    "a figure as text": lambda p: _write_doc(p, _doc(figures=[["client_ttfb_s", "", "0.1", 0.2]])),
    "no figures": lambda p: _write_doc(p, _doc(figures=[])),
    "an unknown metric": lambda p: _write_doc(p, _doc(figures=[["no_such_metric", "", 0.1, 0.2]])),
    "a figure twice": lambda p: _write_doc(p, _doc(figures=[["client_ttfb_s", "", 0.1, 0.2]] * 2)),
    "NaN figures": lambda p: p.write_text(json.dumps(_doc(figures=[["client_ttfb_s", "", math.nan, 0.2]]))),
    "infinite figures": lambda p: p.write_text(json.dumps(_doc(figures=[["client_ttfb_s", "", 0.1, math.inf]]))),
    "NaN utilisation": lambda p: p.write_text(json.dumps(_doc(achieved_utilisation=math.nan))),
    "relays as text": lambda p: _write_doc(p, _doc(relays="30")),
    "relays as a boolean": lambda p: _write_doc(p, _doc(relays=True)),
    "a huge integer": lambda p: p.write_text(json.dumps(_doc()).replace('"relays": 30', '"relays": ' + "9" * 400)),
    "more digits than int() takes": lambda p: p.write_text(json.dumps(_doc()).replace('"relays": 30',
                                                                                        '"relays": ' + "9" * 5000)),
    "zero bandwidth scale": lambda p: _write_doc(p, _doc(bandwidth_scale=0)),
    "a host with escapes": lambda p: _write_doc(p, _doc(host="\x1b]0;x\x07")),
    "another cell's key": lambda p: _write_doc(p, _doc(key="cd" + "0" * 62)),
    "nested past the parser's depth": lambda p: p.write_text("[" * 100_000 + "]" * 100_000),
    "a link to /dev/zero": lambda p: p.symlink_to("/dev/zero"),
    "a link to a good entry": lambda p: (_write_doc(p.with_name("elsewhere"), _doc()), p.symlink_to("elsewhere")),
    "a FIFO": lambda p: os.mkfifo(p),
    "a directory": lambda p: (p.mkdir(), (p / "x").write_text("x")),
}


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_an_unusable_cache_entry_is_not_trusted(tmp_path, kind):
    cache = CellCache(tmp_path / "c")
    path = _entry(cache)
    CORRUPTIONS[kind](path)
    t0 = time.monotonic()
    assert cache.get(KEY) is None
    assert time.monotonic() - t0 < 2
    assert cache.rejected == 1 and len(cache.notices) == 1
    notice = cache.notices[0]
    assert notice.startswith(f"{path}: unusable cache entry (") and notice.endswith("its cell runs again")
    assert "\n" not in notice and "\x1b" not in notice


def test_a_huge_cache_entry_is_refused_without_reading_it(tmp_path):
    cache = CellCache(tmp_path / "c")
    path = _entry(cache)
    with open(path, "wb") as f:
        f.truncate(3 * 2**30)  # sparse: 3 GB that would take memory and minutes to read and parse
    assert cache.get(KEY) is None
    assert "larger than the 8388608-byte limit" in cache.notices[0]


def test_the_entry_size_limit_is_exact(tmp_path, monkeypatch):
    cache = CellCache(tmp_path / "c")
    cache.put(_result(KEY))
    size = cache._path(KEY).stat().st_size
    monkeypatch.setattr(cache_mod, "MAX_ENTRY_BYTES", size)
    assert cache.get(KEY) == _result(KEY)
    monkeypatch.setattr(cache_mod, "MAX_ENTRY_BYTES", size - 1)
    assert cache.get(KEY) is None and f"larger than the {size - 1}-byte limit" in cache.notices[0]


def test_a_file_in_place_of_a_cache_directory_is_a_notice_not_an_abort(tmp_path):
    cache = CellCache(tmp_path / "c")
    cache._path(KEY).parent.write_text("x")
    assert cache.get(KEY) is None and cache.rejected == 0
    cache.put(_result(KEY))
    assert "a file is in the place of a cache directory" in cache.notices[0]


def test_a_good_entry_round_trips_and_an_absent_one_is_no_notice(tmp_path):
    cache = CellCache(tmp_path / "c")
    assert cache.get(KEY) is None and cache.rejected == 0 and not cache.notices
    cache.put(_result(KEY))
    assert cache.get(KEY) == _result(KEY) and cache.rejected == 0


class _ImmediateBackend:
    """Runs a cell in this process as it is submitted (``concurrent.futures`` interface of the backends)."""

    workers = 2
    isolate_after_crash = False
    description = "in-process"

    def __init__(self, fn) -> None:
        self.fn = fn
        self.ran: list[int] = []

    def submit(self, task) -> cf.Future:
        self.ran.append(task.index)
        future: cf.Future = cf.Future()
        future.set_result(self.fn(task))
        return future

    def crashed(self, exc: BaseException) -> bool:
        return False

    def after_crash(self) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.mark.parametrize("kind", ["truncated", "NaN figures", "a figure of three", "a link to /dev/zero",
                                  "a FIFO", "a directory"])
def test_an_unusable_entry_is_recomputed_and_replaced(tmp_path, kind):
    grid = _fake_grid(parse_sweep(TINY))
    cache = CellCache(tmp_path / "c")
    for task in grid:
        cache.put(_result(task.key))
    victim = grid[1]
    path = cache._path(victim.key)
    path.unlink()
    CORRUPTIONS[kind](path)
    backend = _ImmediateBackend(lambda task: _result(task.key))
    started = []
    outcomes = execute(grid, backend, cache, on_start=lambda total, cached: started.append((total, cached)))
    assert started == [(4, 3)] and backend.ran == [1]
    assert [o.status for o in outcomes] == ["cached", "ok", "cached", "cached"]
    assert outcomes[1].result == _result(victim.key)
    if kind == "a directory":  # a rename cannot replace it: the result is used, not cached, and said so
        assert path.is_dir() and "the result is not cached" in cache.notices[-1]
    else:
        assert not path.is_symlink() and cache.get(victim.key) == _result(victim.key)


@pytest.mark.parametrize("bad, words", [
    (lambda task: _result(task.key, figures=(("client_ttfb_s", "", math.nan, 0.2),)), "figures[0] median is nan"),
    (lambda task: _result(task.key, relays=0), "relays 0 is outside"),
    (lambda task: "not a result", "is str, not a cell result"),
    (lambda task: _result("ef" + "0" * 62), "filed under another cell's key"),
])
def test_a_worker_result_that_would_be_an_unusable_entry_fails_the_cell_uncached(tmp_path, bad, words):
    grid = _fake_grid(parse_sweep(TINY))
    cache = CellCache(tmp_path / "c")
    outcomes = execute(grid[:1], _ImmediateBackend(bad), cache)
    assert outcomes[0].status == "failed" and words in outcomes[0].error
    assert not list((tmp_path / "c").glob("*/*.json"))


def test_the_cli_names_unusable_entries_and_counts_them(tmp_path, monkeypatch):
    """The command prints each notice on stderr (a few, then a count) and --json counts them."""
    import kistexp.sweep as sweep_pkg

    grid = _fake_grid(parse_sweep(TINY))
    monkeypatch.setattr(sweep_pkg, "expand", lambda s: _fake_grid(s))
    backend = _ImmediateBackend(lambda task: _result(task.key))
    monkeypatch.setattr(sys.modules["kistexp.sweep.execute"], "LocalBackend", lambda workers: backend)
    cache = CellCache(tmp_path / "c")
    for task in grid:
        _entry(cache, task.key).write_text("{")
    path = tmp_path / "s.toml"
    path.write_text(TINY)
    result = CliRunner().invoke(app, ["sweep", str(path), "--cache", str(tmp_path / "c"), "--out",
                                      str(tmp_path / "out"), "--no-plots", "--json"])
    assert result.exit_code == 0, result.output
    assert sorted(backend.ran) == [0, 1, 2, 3]
    assert json.loads(result.stdout)["cache_rejected"] == 4
    assert result.stderr.count("unusable cache entry (not JSON") == 4


# --- property tests ---------------------------------------------------------------------------------


def _toml_string(text: str) -> str:
    out = []
    for c in text:
        out.append(f"\\u{ord(c):04x}" if c in '"\\' or ord(c) < 0x20 or ord(c) == 0x7F else c)
    return '"' + "".join(out) + '"'


def _toml_key(key: str) -> str:
    return key if key and all(c.isascii() and (c.isalnum() or c in "_-") for c in key) else _toml_string(key)


def _toml(value) -> str:
    """``value`` as an inline TOML value (tables inline, so any nesting is one line)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return "{" + ", ".join(f"{_toml_key(k)} = {_toml(v)}" for k, v in value.items()) + "}"


@pytest.fixture(scope="module")
def path_pool(odd_files) -> list[str]:
    return ["bundled", str(MIX), "nope.toml", "", "/", "a" * 5000, "/etc/passwd",
            *(str(p) for p in odd_files.values())]


_KEYS = ["name", "description", "duration", "values", "value_sets", "traffic", "population", "class_mixes",
         "recommend", "loads", "loss_rates", "seeds", "scale", "samples", "consensus", "parameter", "baseline",
         "max_rise_percent", "relay_class", "metric", "KISTSchedRunInterval", "CircuitPriorityHalflifeMsec",
         "hz1000", "x"]
_scalars = st.one_of(
    st.integers(-(2**64), 2**64), st.sampled_from([0, 1, 2, 10, 2**31, -1, 10**400, 9999]),
    st.floats(), st.sampled_from([0.0, 0.4, 0.5, 1.0, 1e308]), st.booleans(), st.text(max_size=12),
    st.sampled_from(["4s", "12s", "1h", "0s", "-3d", "bundled", "all", "KIST HZ=250", "relay_cpu_utilization"]),
    st.datetimes(timezones=st.just(dt.timezone.utc)), st.dates())
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(_KEYS), inner, max_size=4)), max_leaves=12)


def _base() -> dict:
    return {"name": "tiny", "duration": "4s", "values": {"KISTSchedRunInterval": [2, 10]},
            "traffic": {"loads": [0.4], "seeds": [1]}, "population": {"scale": 0.005, "samples": [1, 2]},
            "recommend": [{"parameter": "KISTSchedRunInterval", "max_rise_percent": 5, "baseline": 10}]}


def _check_loads(text: str) -> None:
    try:
        sweep = parse_sweep(text, "fuzz.toml")
    except SweepError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert isinstance(sweep, Sweep) and 1 <= sweep.n_cells <= spec_mod.MAX_CELLS
    assert all(math.isfinite(x) for x in (*sweep.loads, *sweep.loss_rates, sweep.scale, sweep.duration_s))


# where a value goes: mostly the keys a sweep has (so many documents load), sometimes any key anywhere
_PLACES = [(None, "name"), (None, "description"), (None, "duration"), ("values", "KISTSchedRunInterval"),
           ("values", "CircuitPriorityHalflifeMsec"), ("traffic", "loads"), ("traffic", "loss_rates"),
           ("traffic", "seeds"), ("population", "scale"), ("population", "samples"), ("population", "consensus"),
           ("class_mixes", "bundled"), ("class_mixes", "hz1000"), ("recommend", "parameter"),
           ("recommend", "baseline"), ("recommend", "max_rise_percent"), ("recommend", "relay_class"),
           ("recommend", "metric")]
_ints = st.lists(st.integers(-1, 2**33), min_size=0, max_size=4)
_fractions = st.lists(st.floats(-0.1, 1.1), min_size=0, max_size=4)
_TYPED = {"name": st.text(max_size=12), "description": st.text(max_size=30),
          "duration": st.sampled_from(["4s", "12s", "2s", "1h", "2h", "0s", "-3d", "4"]),
          "KISTSchedRunInterval": st.lists(st.integers(1, 105), min_size=1, max_size=4),
          "CircuitPriorityHalflifeMsec": _ints, "loads": _fractions, "loss_rates": _fractions, "seeds": _ints,
          "scale": st.floats(-0.1, 1.1) | st.integers(-1, 2), "samples": _ints,
          "parameter": st.sampled_from(["KISTSchedRunInterval", "CircuitPriorityHalflifeMsec", "x"]),
          "baseline": st.integers(-1, 105), "max_rise_percent": st.floats() | st.integers(-1, 20_000),
          "relay_class": st.text(max_size=12) | st.just("KIST HZ=250"),
          "metric": st.sampled_from(["relay_cpu_utilization", "client_ttfb_s", "nope"])}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_toml_values_in_a_sweep_give_a_sweep_or_one_line(data, path_pool):
    doc = _base()
    if data.draw(st.booleans()):
        del doc["recommend"]  # a rule ties the values to its baseline: without one, more documents load
    for _ in range(data.draw(st.integers(1, 3))):
        if data.draw(st.integers(0, 4)):
            table, key = data.draw(st.sampled_from(_PLACES))
        else:
            table = data.draw(st.sampled_from([None, "values", "traffic", "population", "class_mixes", "recommend"]))
            key = data.draw(st.sampled_from(_KEYS))
        if key in ("consensus", "bundled", "hz1000"):
            typed = st.sampled_from(path_pool)
        else:
            typed = _TYPED.get(key, _values)
        value = data.draw(typed if data.draw(st.integers(0, 3)) else _values | st.sampled_from(path_pool))
        if table is None:
            doc[key] = value
        elif table == "recommend":
            doc.setdefault("recommend", [{}])[0][key] = value
        elif isinstance(doc.get(table), dict):
            doc[table][key] = value
        else:
            doc[table] = {key: value}
    _check_loads("\n".join(f"{_toml_key(k)} = {_toml(v)}" for k, v in doc.items()))


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('[]{}=",.\n 0129aexz#\'-_:+nifT')), max_size=200))
def test_any_text_after_a_sweep_gives_a_sweep_or_one_line(tail):
    _check_loads(TINY + tail)


_json = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20),
              st.sampled_from(["client_ttfb_s", "relay_cpu_utilization", "all", "", KEY])),
    lambda inner: st.one_of(st.lists(inner, max_size=5),
                            st.dictionaries(st.sampled_from([*attrs.asdict(_result(KEY)), "x"]), inner, max_size=9)),
    max_leaves=30)


def _check_cached(cache: CellCache) -> None:
    got = cache.get(KEY)
    if got is None:
        assert cache.rejected == 1 and "\n" not in cache.notices[0]
        return
    assert isinstance(got, CellResult) and got.key == KEY and got.figures
    assert all(math.isfinite(m) and math.isfinite(p) for _, _, m, p in got.figures)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=_json | st.fixed_dictionaries({}, optional={k: _json for k in attrs.asdict(_result(KEY))}))
def test_any_json_as_a_cache_entry_is_a_checked_result_or_recomputed(tmp_path, doc):
    cache = CellCache(tmp_path / "c")
    _entry(cache).write_text(json.dumps(doc))
    _check_cached(cache)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(list(attrs.asdict(_result(KEY)))), value=_json)
def test_one_field_of_a_good_entry_replaced_is_checked(tmp_path, field, value):
    cache = CellCache(tmp_path / "c")
    _entry(cache).write_text(json.dumps(_doc(**{field: value})))
    _check_cached(cache)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 2000), noise=st.binary(max_size=50))
def test_any_bytes_as_a_cache_entry_are_a_checked_result_or_recomputed(tmp_path, cut, noise):
    cache = CellCache(tmp_path / "c")
    _entry(cache).write_bytes(json.dumps(_doc()).encode()[:cut] + noise)
    _check_cached(cache)


def test_check_result_returns_the_result_it_was_given():
    # (every real cell of tests/sweep/test_sweep.py passes the same check on its way into the cache)
    assert check_result(attrs.asdict(_result(KEY)), KEY) == _result(KEY)
