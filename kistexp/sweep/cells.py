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
from collections.abc import Iterator, Sequence
from functools import lru_cache

import attrs

from kistexp.population.dispatch import source_version
from kistexp.sweep.spec import Sweep, ValueSet

# what the numbers of a cell depend on, besides its inputs
MODEL_SOURCES = ("sim/*.py", "population/*.py", "sweep/cells.py", "data/*.toml", "params.py",
                 "metrics/catalogue.py")


@lru_cache(maxsize=1)
def model_version() -> str:
    """SHA-256 (16 hex digits) of the model's sources and numba's version."""
    return source_version(MODEL_SOURCES)


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
    fast: bool = False  # NICs scaled to the fast-mode byte budget (kistexp.population.predict.FAST_BYTE_BUDGET)


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
    # (attack measure, value) over the cell's window (kistexp.population.attacks.measure_run): what an
    # attacker gains at these values, without fingerprinting (no probes) or the gap KS distance (no baseline)
    attacks: tuple[tuple[str, float], ...] = ()


def _shares_digest(shares) -> str:
    return hashlib.sha256(repr(attrs.astuple(shares)).encode()).hexdigest()


def cell_key(*, model: str, consensus: str, geoip: str, scale: float, sample_seed: int, values: ValueSet,
             load: float, loss_rate: float, shares_digest: str, seed: int, duration_s: float,
             fast: bool = False) -> str:
    doc = {"model": model, "consensus": consensus, "geoip": geoip, "scale": scale, "sample_seed": sample_seed,
           "values": sorted([list(v) for v in values]), "load": load, "loss_rate": loss_rate,
           "shares": shares_digest, "seed": seed, "duration_s": duration_s}
    if fast:  # full-rate keys stay as they were; a fast cell is another cell
        doc["rates"] = "fast"
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


# Every sampled network is held (and sent with each of its cells) while the sweep runs. A sampled relay
# costs about 600 bytes and 0.1-0.7 ms to draw, so this bounds the sampling before the first cell to
# about 600 MB and 2-12 min: 164 networks at scale 1 of the bundled consensus' 6,088 relays.
MAX_SAMPLED_RELAYS = 1_000_000


@attrs.frozen(eq=False)
class CellGrid(Sequence):
    """Every cell of a sweep, in grid order (values, load, loss rate, class mix, seed, network: the last
    varies fastest), each task built when it is asked for: counting, indexing or iterating the grid never
    holds more than one task, so memory before the first cell does not grow with the grid."""

    sweep: Sweep = attrs.field(repr=False)
    networks: tuple = attrs.field(repr=False)  # one sampled kistexp.population.relays.Population per sample seed
    mixes: tuple = attrs.field(repr=False)  # (name, ClassShares, digest of the shares) per class mix
    consensus: str  # digests of the consensus and GeoIP contents
    geoip: str
    model: str

    def __len__(self) -> int:
        return self.sweep.n_cells

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        s = self.sweep
        rest, net_i = divmod(index, len(s.samples))
        rest, seed_i = divmod(rest, len(s.seeds))
        rest, mix_i = divmod(rest, len(self.mixes))
        rest, loss_i = divmod(rest, len(s.loss_rates))
        values_i, load_i = divmod(rest, len(s.loads))
        values, load, loss, seed = s.value_sets[values_i], s.loads[load_i], s.loss_rates[loss_i], s.seeds[seed_i]
        mix, shares, digest = self.mixes[mix_i]
        sample_seed = s.samples[net_i]
        key = cell_key(model=self.model, consensus=self.consensus, geoip=self.geoip, scale=s.scale,
                       sample_seed=sample_seed, values=values, load=load, loss_rate=loss, shares_digest=digest,
                       seed=seed, duration_s=s.duration_s, fast=s.fast)
        return CellTask(key, index, net_i, sample_seed, values, load, loss, mix, seed, s.duration_s, s.scale,
                        self.networks[net_i], shares, self.model, s.fast)

    def __iter__(self) -> Iterator[CellTask]:
        return (self[i] for i in range(len(self)))


def expand(sweep: Sweep) -> CellGrid:
    """Every cell of the grid (built lazily, ``CellGrid``); the networks are sampled here once (the
    sampling is cheap and seeded), after checking how many relays that is (``MAX_SAMPLED_RELAYS``)."""
    from kistexp.dirauth.dirformat import MAX_DOCUMENT_BYTES
    from kistexp.errors import SweepError
    from kistexp.population.bundled import BUNDLED_CONSENSUS, BUNDLED_GEOIP, bundled_digest
    from kistexp.population.classes import load_class_shares
    from kistexp.population.geoip import MAX_GEOIP_BYTES
    from kistexp.population.relays import load_population
    from kistexp.population.sampling import eligible, sample

    full = load_population(sweep.consensus)
    per_network = round(len(eligible(full)) * sweep.scale)  # sample()'s count, give or take one per class
    if per_network * len(sweep.samples) > MAX_SAMPLED_RELAYS:
        raise SweepError(f"{sweep.path}: {len(sweep.samples):,} samples x about {per_network:,} relays each "
                         f"(scale {sweep.scale:g} of {len(full):,} relays) = {per_network * len(sweep.samples):,} "
                         f"sampled relays, more than the limit of {MAX_SAMPLED_RELAYS:,}: fewer samples or a "
                         "smaller scale")
    # digests of the content (the bundled files': decompressed, so equal to their originals')
    consensus = (file_digest(sweep.consensus) if sweep.consensus
                 else bundled_digest(BUNDLED_CONSENSUS, MAX_DOCUMENT_BYTES))
    geoip = bundled_digest(BUNDLED_GEOIP, MAX_GEOIP_BYTES)  # the cells' GeoIP table (load_geoip's default)
    networks = tuple(sample(full, sweep.scale, s) for s in sweep.samples)
    mixes = []
    for name, path in sweep.class_mixes:
        shares = load_class_shares(path)
        mixes.append((name, shares, _shares_digest(shares)))
    return CellGrid(sweep, networks, tuple(mixes), consensus, geoip, model_version())


def run_cell(task: CellTask) -> CellResult:
    """Run one cell (in a worker process): ``kistexp.population.predict.simulate_values``."""
    from kistexp.errors import SweepError
    from kistexp.population.predict import FAST_BYTE_BUDGET, FULL_RATES, simulate_values

    if task.model and task.model != model_version():
        raise SweepError(f"this worker ({socket.gethostname()}) runs another kistexp model ({model_version()}, "
                         f"the sweep was submitted with {task.model}): install the same kistexp on every worker")
    # the simulation seed and the network's sample seed together draw the clients and traffic
    seed = (task.seed * 1_000_003 + task.sample_seed) % 2**31
    run = simulate_values(task.population, dict(task.values), load=task.load, loss_rate=task.loss_rate,
                          shares=task.shares, seed=seed, duration_s=task.duration_s, scale=task.scale,
                          byte_budget=FAST_BYTE_BUDGET if task.fast else FULL_RATES)
    return CellResult(task.key, run.figures, run.relays, run.clients, run.bandwidth_scale,
                      run.achieved_utilisation, run.wall_s, f"{socket.gethostname()}:{os.getpid()}", run.attacks)
