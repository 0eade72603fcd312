"""Relay classes (operating system, kernel tick, tor version, torrc override, hardware profile) and client classes.

What a consensus parameter does to a relay depends on these (population.md §3): Linux relays run KIST,
the others KISTLite (no ``TCP_INFO``/``SIOCOUTQNSD``); the kernel tick quantises the run interval
(``kistexp.population.kernels``); the tor version decides default and clamp (``kistexp.params``); a torrc
``KISTSchedRunInterval`` wins over the consensus; the hardware profile gives per-operation CPU costs.
Clients are of a class too: the implementation they run, C tor or Arti (``kistexp.population.arti``: Arti
ignores the KIST run intervals and reads its own ``kist-enabled`` / ``kist-tcp-notsent-lowat``), which
decides which of a stage's parameters reach them.

Shares and profiles load from TOML (bundled defaults: ``kistexp/data/relay-classes.toml`` and
``kistexp/data/hardware-profiles.toml``), so operators can describe their own relays. Unknown keys,
negative costs and shares that do not sum to 1 are one-line errors naming the file and key.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path

import attrs
import numpy as np
import tomli

from kistexp import params
from kistexp.errors import PopulationError
from kistexp.population import arti
from kistexp.population.kernels import effective_interval_ms
from kistexp.safeio import read_bounded_text

DATA = Path(__file__).resolve().parent.parent / "data"
DEFAULT_CLASSES = DATA / "relay-classes.toml"
DEFAULT_PROFILES = DATA / "hardware-profiles.toml"
# the bundled files are a few KB; an operator's description of their relays is no larger than this
MAX_TOML_BYTES = 1024 * 1024
OS_NAMES = ("linux", "bsd", "windows", "macos", "other")
#: client implementations: C tor and Arti
CLIENT_CLASSES = ("tor", "arti")
#: a class file without a [clients] table describes relays only: its clients all run C tor
ALL_TOR_CLIENTS = (("tor", 1.0),)
#: the client-class draw's own random stream, so adding it left every earlier draw of a seed as it was
CLIENT_CLASS_STREAM = 0x41525449  # "ARTI"
SHARE_TOLERANCE = 1e-6
# tor versions older than kistexp.params knows (or unparseable v lines) are treated as this one
FALLBACK_VERSION = "0.4.7.10"


@attrs.frozen
class HardwareProfile:
    name: str
    description: str
    cores: int
    ghz: float
    ntor_server_us: float
    ntor_server_fast_us: float
    ed25519_verify_us: float
    microdesc_parse_us: float
    sha512_2kib_us: float
    relay_cell_crypto_us: float
    tls_record_us: float
    tls_byte_ns: float
    kist_socket_info_us: float

    def cell_cpu_us(self, cells_per_record: float = 31.0) -> float:
        """CPU per relayed cell: one crypto layer plus its share of a TLS record in and out.

        A 16 KiB TLS record holds ~31 cells of 514 bytes; each cell is read and written once."""
        tls = 2 * (self.tls_record_us / cells_per_record + 514 * self.tls_byte_ns / 1000.0)
        return self.relay_cell_crypto_us + tls


_PROFILE_KEYS = {a.name for a in attrs.fields(HardwareProfile)} - {"name"}
_FLOAT_KEYS = _PROFILE_KEYS - {"description", "cores"}


def _read_toml(path: Path) -> dict:
    if "\0" in str(path):
        raise PopulationError(f"{str(path)!r}: a file name cannot hold a NUL byte")
    try:
        os.lstat(path)
    except FileNotFoundError:
        raise PopulationError(f"{path}: file not found") from None
    except OSError:
        pass  # a name too long, a path through a file: read_bounded_text names the problem
    # bounded: /dev/zero, a FIFO or a huge file named as a class mix is refused in one line, not read
    # until memory runs out (or, for a FIFO, for ever)
    text = read_bounded_text(path, MAX_TOML_BYTES, "relay classes", PopulationError)
    try:
        return tomli.loads(text)
    except tomli.TOMLDecodeError as exc:
        raise PopulationError(f"{path}: not valid TOML: {str(exc).splitlines()[0] if str(exc) else exc}") from None
    except (RecursionError, ValueError) as exc:  # arrays nested past tomli's limit, integers of >4,300 digits
        raise PopulationError(f"{path}: not valid TOML: {str(exc).splitlines()[0][:200]}") from None


def _number(path: Path, key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PopulationError(f"{path}: {key}: expected a number, got {str(value)[:100]!r}")
    # nan would pass every comparison below (a share of nan summed to nan passed "sums to 1")
    if isinstance(value, int) and abs(value) > 1e300 or isinstance(value, float) and not math.isfinite(value):
        raise PopulationError(f"{path}: {key}: expected a finite number, got {str(value)[:20]}")
    if value < 0:
        raise PopulationError(f"{path}: {key}: must not be negative (got {value})")
    return float(value)


@lru_cache(maxsize=8)
def _load_profiles(path: Path) -> dict[str, HardwareProfile]:
    data = _read_toml(path)
    extra = set(data) - {"profile"}
    if extra:
        raise PopulationError(f"{path}: {sorted(extra)[0]}: unknown key (expected [profile.NAME] tables)")
    profiles = {}
    for name, table in (data.get("profile") or {}).items():
        if not isinstance(table, dict):
            raise PopulationError(f"{path}: profile.{name}: expected a table")
        unknown = set(table) - _PROFILE_KEYS
        if unknown:
            raise PopulationError(f"{path}: profile.{name}.{sorted(unknown)[0]}: unknown key")
        missing = _PROFILE_KEYS - set(table) - {"description"}
        if missing:
            raise PopulationError(f"{path}: profile.{name}.{sorted(missing)[0]}: missing")
        values: dict[str, object] = {k: _number(path, f"profile.{name}.{k}", table[k]) for k in _FLOAT_KEYS}
        cores = table["cores"]
        if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
            raise PopulationError(f"{path}: profile.{name}.cores: expected a positive integer, got {cores!r}")
        profiles[name] = HardwareProfile(name=name, description=str(table.get("description", "")),
                                         cores=cores, **values)  # type: ignore[arg-type]
    if not profiles:
        raise PopulationError(f"{path}: no [profile.NAME] table")
    return profiles


def load_profiles(path: str | Path | None = None) -> dict[str, HardwareProfile]:
    return dict(_load_profiles(Path(path) if path is not None else DEFAULT_PROFILES))


@attrs.frozen
class ClassShares:
    """The relay-class TOML: shares of OS, HZ per OS, hardware per OS, torrc overrides."""

    source: str
    os: tuple[tuple[str, float], ...]
    hz: Mapping[str, tuple[tuple[int, float], ...]]
    hardware: Mapping[str, tuple[tuple[str, float], ...]]
    override_share: float
    override_value: int
    clients: tuple[tuple[str, float], ...] = ALL_TOR_CLIENTS  # client implementation shares (of client processes)

    def client_share(self, name: str) -> float:
        return dict(self.clients).get(name, 0.0)


def _shares(path: Path, key: str, table: object, convert=str) -> tuple[tuple, ...]:
    if not isinstance(table, dict) or not table:
        raise PopulationError(f"{path}: {key}: expected a non-empty table of shares")
    out = []
    for name, value in table.items():
        share = _number(path, f"{key}.{name}", value)
        try:
            out.append((convert(name), share))
        except ValueError:
            raise PopulationError(f"{path}: {key}.{name}: not a valid name here") from None
    total = sum(s for _, s in out)
    if abs(total - 1.0) > SHARE_TOLERANCE:
        raise PopulationError(f"{path}: {key}: shares sum to {total:g}, not 1")
    return tuple(out)


def _hz(name: str) -> int:
    hz = int(name)
    if hz <= 0:
        raise ValueError(name)
    return hz


@lru_cache(maxsize=8)
def _load_class_shares(path: Path, profiles_path: Path) -> ClassShares:
    data = _read_toml(path)
    unknown = set(data) - {"os", "hz", "hardware", "torrc", "clients"}
    if unknown:
        raise PopulationError(f"{path}: {sorted(unknown)[0]}: unknown key")
    os_shares = _shares(path, "os", data.get("os"))
    for name, _ in os_shares:
        if name not in OS_NAMES:
            raise PopulationError(f"{path}: os.{name}: unknown operating system (known: {', '.join(OS_NAMES)})")
    profiles = _load_profiles(profiles_path)
    hz: dict[str, tuple] = {}
    hardware: dict[str, tuple] = {}
    for table_name, dest, convert in (("hz", hz, _hz), ("hardware", hardware, str)):
        table = data.get(table_name) or {}
        if not isinstance(table, dict):
            raise PopulationError(f"{path}: {table_name}: expected tables [{table_name}.OS]")
        for os_name in table:
            if os_name not in OS_NAMES:
                raise PopulationError(f"{path}: {table_name}.{os_name}: unknown operating system")
        for os_name, _ in os_shares:
            if os_name not in table:
                raise PopulationError(f"{path}: {table_name}.{os_name}: missing (the OS has a share)")
            dest[os_name] = _shares(path, f"{table_name}.{os_name}", table[os_name], convert)
    for os_name, items in hardware.items():
        for profile, _ in items:
            if profile not in profiles:
                raise PopulationError(f"{path}: hardware.{os_name}.{profile}: no such profile in {profiles_path}")
    torrc = data.get("torrc") or {}
    unknown = set(torrc) - {"override_share", "override_value"}
    if unknown:
        raise PopulationError(f"{path}: torrc.{sorted(unknown)[0]}: unknown key")
    share = _number(path, "torrc.override_share", torrc.get("override_share", 0.0))
    if share > 1:
        raise PopulationError(f"{path}: torrc.override_share: {share} is above 1")
    value = torrc.get("override_value", 10)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100:
        raise PopulationError(f"{path}: torrc.override_value: expected an integer 1..100 ms, got {value!r}")
    clients = ALL_TOR_CLIENTS
    if "clients" in data:
        clients = _shares(path, "clients", data["clients"])
        for name, _ in clients:
            if name not in CLIENT_CLASSES:
                raise PopulationError(f"{path}: clients.{name}: unknown client implementation "
                                      f"(known: {', '.join(CLIENT_CLASSES)})")
    return ClassShares(str(path), os_shares, hz, hardware, share, value, clients)


def load_class_shares(path: str | Path | None = None, profiles: str | Path | None = None) -> ClassShares:
    return _load_class_shares(Path(path) if path is not None else DEFAULT_CLASSES,
                              Path(profiles) if profiles is not None else DEFAULT_PROFILES)


def tick_shares(path: str | Path | None = None) -> dict[int, float]:
    """Share of relays per tick rate, OS shares times per-OS HZ shares of the relay-class TOML."""
    shares = load_class_shares(path)
    out: dict[int, float] = {}
    for os_name, os_share in shares.os:
        for hz, share in shares.hz[os_name]:
            out[hz] = out.get(hz, 0.0) + os_share * share
    return dict(sorted(out.items()))


@attrs.frozen
class RelayClass:
    """What decides what KISTSchedRunInterval does to one relay."""

    os: str
    hz: int
    tor_version: str
    hardware: str
    torrc_interval: int | None = None  # a torrc KISTSchedRunInterval (wins over the consensus)

    @property
    def scheduler(self) -> str:
        return "KIST" if self.os == "linux" else "KISTLite"

    def run_interval_ms(self, consensus_value: int | None) -> float:
        """The interval this relay's scheduler actually runs at for a consensus value (None: absent)."""
        try:
            version = params.TorVersion.parse(self.tor_version)
        except ValueError:
            version = params.TorVersion.parse(FALLBACK_VERSION)
        try:
            value = params.effective_value("KISTSchedRunInterval", consensus_value, version,
                                           self.torrc_interval).value
        except ValueError:  # a version before the parameter existed
            value = params.effective_value("KISTSchedRunInterval", consensus_value,
                                           params.TorVersion.parse(FALLBACK_VERSION), self.torrc_interval).value
        return effective_interval_ms(value, self.hz)

    @property
    def label(self) -> str:
        torrc = f" torrc={self.torrc_interval}" if self.torrc_interval else ""
        return f"{self.os} HZ={self.hz} {self.hardware}{torrc}"


def _pick(rng: np.random.Generator, items: tuple[tuple, ...], n: int) -> list:
    names = [name for name, _ in items]
    p = np.array([s for _, s in items], dtype=np.float64)
    return [names[i] for i in rng.choice(len(names), size=n, p=p / p.sum())]


def assign_classes(versions: list[str], shares: ClassShares | None = None, seed: int | None = 0) -> list[RelayClass]:
    """A class per relay (given its tor version), drawn by the shares with a seeded generator."""
    shares = shares or load_class_shares()
    rng = np.random.default_rng(seed)
    n = len(versions)
    oses = _pick(rng, shares.os, n)
    out = []
    override = rng.random(n) < shares.override_share
    for i, os_name in enumerate(oses):
        hz = _pick(rng, shares.hz[os_name], 1)[0]
        hw = _pick(rng, shares.hardware[os_name], 1)[0]
        out.append(RelayClass(os_name, int(hz), versions[i] or FALLBACK_VERSION, hw,
                              shares.override_value if override[i] else None))
    return out


def assign_client_classes(n: int, shares: ClassShares | None = None, seed: int | None = 0) -> list[str]:
    """An implementation per client process (``CLIENT_CLASSES``), drawn by the ``[clients]`` shares from a
    stream of its own (``seed`` and ``CLIENT_CLASS_STREAM``): the network's other draws do not move."""
    shares = shares or load_class_shares()
    if n <= 0:
        return []
    if len(shares.clients) == 1:
        return [shares.clients[0][0]] * n
    entropy = None if seed is None else [int(seed), CLIENT_CLASS_STREAM]
    return _pick(np.random.default_rng(np.random.SeedSequence(entropy)), shares.clients, n)


def client_class_reads(client_class: str, name: str) -> bool:
    """Whether a client of ``client_class`` takes consensus parameter ``name`` from the consensus at all.

    C tor: every parameter of kistexp's catalogue except Arti's own (tor's relay and client code are one
    program; which role and version reads which is ``kistexp.params``' rule). Arti: the names its
    ``NetParameters`` reads and uses (``kistexp.population.arti``), never the KIST run intervals."""
    if client_class == "arti":
        return arti.acts_on(name)
    if client_class == "tor":
        entry = params.get(name)
        return entry is not None and entry.read_by != params.ARTI_ONLY
    raise PopulationError(f"unknown client implementation {client_class!r} (known: {', '.join(CLIENT_CLASSES)})")


@attrs.frozen
class ClientReach:
    """Which client implementations a stage's parameters reach, and the share of clients that makes."""

    parameters: tuple[str, ...]
    reached: tuple[tuple[str, float], ...]  # (class, its share of clients) for classes reading any parameter
    missed: tuple[tuple[str, float], ...]  # classes that read none of them
    share: float  # of client processes: the reached classes' shares summed


def client_reach(names: Iterable[str], shares: ClassShares | None = None) -> ClientReach:
    """The client classes that take at least one of ``names`` from the consensus: a KISTSchedRunInterval
    stage misses Arti clients, a kist-enabled stage reaches only them."""
    shares = shares or load_class_shares()
    names = tuple(names)
    reached, missed = [], []
    for cls, share in shares.clients:
        (reached if any(client_class_reads(cls, n) for n in names) else missed).append((cls, share))
    return ClientReach(names, tuple(reached), tuple(missed), sum(s for _, s in reached))
