"""Cells of a sweep: one population run each, named by a content hash of everything that decides its numbers.

A cell's key is the SHA-256 of its inputs: the model version (the sources of ``kistexp.sim``,
``kistexp.population``, this module and the bundled class and hardware data, plus numba's version), the
consensus and GeoIP files' contents, the population scale and sample seed, the values, load, loss rate,
class mix (its parsed shares), simulation seed and duration. Equal keys mean equal numbers (runs are
deterministic per seed), so a finished cell is never run twice and a changed model never reuses a result.

Workers get everything they need in the task (the sampled network and the class shares travel with it),
so a remote Dask worker needs only kistexp installed and tor's GeoIP file.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from functools import lru_cache
from importlib import metadata
from pathlib import Path

import attrs

from kistexp.sweep.spec import Sweep, ValueSet

_PKG = Path(__file__).resolve().parent.parent
# what the numbers of a cell depend on, besides its inputs
MODEL_SOURCES = ("sim/*.py", "population/*.py", "sweep/cells.py", "data/*.toml", "params.py",
                 "metrics/catalogue.py")


@lru_cache(maxsize=1)
def model_version() -> str:
    """SHA-256 (16 hex digits) of the model's sources and numba's version."""
    digest = hashlib.sha256()
    for pattern in MODEL_SOURCES:
        for path in sorted(_PKG.glob(pattern)):
            digest.update(str(path.relative_to(_PKG)).encode())
            digest.update(path.read_bytes())
    digest.update(metadata.version("numba").encode())
    return digest.hexdigest()[:16]


@lru_cache(maxsize=16)
def file_digest(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@attrs.frozen
class CellTask:
    """What a worker needs to run one cell (picklable; no file paths)."""

    key: str
    index: int  # position in the sweep's grid
    network: int  # index of the sampled network (its sample seed is samples[network])
    sample_seed: int
    values: ValueSet
    load: float
    loss_rate: float
    class_mix: str
    seed: int
    duration_s: float
    scale: float
    population: object = attrs.field(eq=False, repr=False)  # kistexp.population.relays.Population
    shares: object = attrs.field(eq=False, repr=False)  # kistexp.population.classes.ClassShares
    model: str = ""  # model_version() of the submitting side, checked by the worker


@attrs.frozen
class CellResult:
    key: str
    figures: tuple[tuple[str, str, float, float], ...]  # (metric, relay class, median, p95)
    relays: int
    clients: int
    bandwidth_scale: float
    achieved_utilisation: float
    wall_s: float
    host: str


def _shares_digest(shares) -> str:
    return hashlib.sha256(repr(attrs.astuple(shares)).encode()).hexdigest()


def cell_key(*, model: str, consensus: str, geoip: str, scale: float, sample_seed: int, values: ValueSet,
             load: float, loss_rate: float, shares_digest: str, seed: int, duration_s: float) -> str:
    doc = {"model": model, "consensus": consensus, "geoip": geoip, "scale": scale, "sample_seed": sample_seed,
           "values": sorted([list(v) for v in values]), "load": load, "loss_rate": loss_rate,
           "shares": shares_digest, "seed": seed, "duration_s": duration_s}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def expand(sweep: Sweep) -> list[CellTask]:
    """Every cell of the grid, networks sampled here once (the sampling is cheap and seeded)."""
    from kistexp.dirauth.dirformat import MAX_DOCUMENT_BYTES
    from kistexp.population.bundled import BUNDLED_CONSENSUS, BUNDLED_GEOIP, bundled_digest
    from kistexp.population.classes import load_class_shares
    from kistexp.population.geoip import MAX_GEOIP_BYTES
    from kistexp.population.relays import load_population
    from kistexp.population.sampling import sample

    full = load_population(sweep.consensus)
    # digests of the content (the bundled files': decompressed, so equal to their originals')
    consensus = (file_digest(sweep.consensus) if sweep.consensus
                 else bundled_digest(BUNDLED_CONSENSUS, MAX_DOCUMENT_BYTES))
    geoip = bundled_digest(BUNDLED_GEOIP, MAX_GEOIP_BYTES)  # the cells' GeoIP table (load_geoip's default)
    model = model_version()
    networks = [sample(full, sweep.scale, s) for s in sweep.samples]
    mixes = [(name, load_class_shares(path)) for name, path in sweep.class_mixes]
    tasks = []
    for values in sweep.value_sets:
        for load in sweep.loads:
            for loss in sweep.loss_rates:
                for mix, shares in mixes:
                    for seed in sweep.seeds:
                        for net_i, sample_seed in enumerate(sweep.samples):
                            key = cell_key(model=model, consensus=consensus, geoip=geoip, scale=sweep.scale,
                                           sample_seed=sample_seed, values=values, load=load, loss_rate=loss,
                                           shares_digest=_shares_digest(shares), seed=seed,
                                           duration_s=sweep.duration_s)
                            tasks.append(CellTask(key, len(tasks), net_i, sample_seed, values, load, loss, mix,
                                                  seed, sweep.duration_s, sweep.scale, networks[net_i], shares,
                                                  model))
    return tasks


def run_cell(task: CellTask) -> CellResult:
    """Run one cell (in a worker process): ``kistexp.population.predict.simulate_values``."""
    from kistexp.errors import SweepError
    from kistexp.population.predict import simulate_values

    if task.model and task.model != model_version():
        raise SweepError(f"this worker ({socket.gethostname()}) runs another kistexp model ({model_version()}, "
                         f"the sweep was submitted with {task.model}): install the same kistexp on every worker")
    # the simulation seed and the network's sample seed together draw the clients and traffic
    seed = (task.seed * 1_000_003 + task.sample_seed) % 2**31
    run = simulate_values(task.population, dict(task.values), load=task.load, loss_rate=task.loss_rate,
                          shares=task.shares, seed=seed, duration_s=task.duration_s, scale=task.scale)
    return CellResult(task.key, run.figures, run.relays, run.clients, run.bandwidth_scale,
                      run.achieved_utilisation, run.wall_s, f"{socket.gethostname()}:{os.getpid()}")
