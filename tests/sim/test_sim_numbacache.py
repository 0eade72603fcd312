"""The compiled simulator's cache: keyed by the sources, safe for processes compiling and loading at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kistexp.sim import numbacache

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
from kistexp.sim import Network, NodeConfig, RunConfig, Transfer, run
net = Network()
a, b = net.add_node(NodeConfig(role="client")), net.add_node(NodeConfig(role="exit"))
net.add_transfer(Transfer(net.add_circuit([a, b]), 498, 1_000_000, 0.0))
res = run(net, RunConfig(duration_s=1.0))
print("RESULT", res.cells_scheduled, res.events, float(res.transfer_ttlb_s[0]))
"""


def _start(cache: Path) -> subprocess.Popen:
    env = dict(os.environ, KISTEXP_NUMBA_CACHE=str(cache), NUMBA_DEBUG_CACHE="1", PYTHONPATH=str(ROOT))
    env.pop("NUMBA_CACHE_DIR", None)
    return subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_the_cache_directory_is_keyed_by_the_sources(tmp_path, monkeypatch):
    monkeypatch.setenv("KISTEXP_NUMBA_CACHE", str(tmp_path))
    path = numbacache.use_keyed_cache()
    assert path == tmp_path / numbacache.sources_digest() and path.is_dir()
    assert os.environ["NUMBA_CACHE_DIR"] == str(path)
    import numba

    assert numba.config.CACHE_DIR == str(path)


@pytest.mark.slow
def test_two_processes_compiling_at_once_then_a_third_loads_their_cache(tmp_path):
    procs = [_start(tmp_path), _start(tmp_path)]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    results = [[ln for ln in out.splitlines() if ln.startswith("RESULT")] for out in outs]
    assert results[0] == results[1] and len(results[0]) == 1
    (keyed,) = list(tmp_path.iterdir())
    assert keyed.name == numbacache.sources_digest()
    assert list(keyed.rglob("*.nbi")) and list(keyed.rglob("*.nbc"))
    third = _start(tmp_path)
    out = third.communicate(timeout=900)[0]
    assert third.returncode == 0, out
    assert [ln for ln in out.splitlines() if ln.startswith("RESULT")] == results[0]
    assert "data loaded" in out and "data saved" not in out  # nothing recompiled, nothing dropped
