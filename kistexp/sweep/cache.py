"""Finished cells on disk, one JSON file per cell key (``<root>/<key[:2]>/<key>.json``).

Only the submitting process writes (results come back through the executor), each file under a temporary
name renamed into place, so an interrupted sweep leaves complete files only and a re-run skips them.
Failed cells are not stored: a re-run tries them again.

An entry is used only once it has been read and checked as a stranger's input (``check_result``): a
regular file (not a link, FIFO, device or directory) of at most ``MAX_ENTRY_BYTES``, JSON holding exactly
a ``CellResult``'s fields with their types, finite numbers within their ranges, catalogue metrics and the
key the entry is filed under. Anything else (a file cut short by a full disk, garbage bytes, a hand edit,
NaN figures, ``/dev/zero`` linked into place, a directory of that name) is not trusted: the cell runs
again, a notice names the file and the fault, and the fresh result replaces the entry.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import tempfile
from pathlib import Path

import attrs

from kistexp.errors import SweepError
from kistexp.safeio import read_bounded
from kistexp.sweep.cells import CellResult

# A cell's entry is about 10 KB (109 figures at scale 0.005); the figures grow with the relay classes of
# a network, at most a few per relay, so even a full-scale network of custom classes stays near 3 MB.
MAX_ENTRY_BYTES = 8 * 1024 * 1024
# notices kept for the user; the count goes on beyond them
MAX_NOTICES = 20
# host names are printed in cells.csv and --json: kept short and free of control characters
MAX_TEXT = 1000

_FIELDS = tuple(a.name for a in attrs.fields(CellResult))


def default_cache_dir() -> Path:
    if os.environ.get("KISTEXP_SWEEP_CACHE"):
        return Path(os.environ["KISTEXP_SWEEP_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kistexp" / "sweep"


def _finite(value: object, name: str, low: float, high: float, *, low_open: bool = False) -> float | str:
    """``value`` as a float within [low, high] (or (low, high]), else what is wrong with it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{name} is {type(value).__name__}, not a number"
    try:
        number = float(value)
    except OverflowError:  # an integer of hundreds of digits
        return f"{name} is too large"
    if not math.isfinite(number):
        return f"{name} is {number}"
    if not (low < number if low_open else low <= number) or number > high:
        return f"{name} {number:g} is outside {'(' if low_open else '['}{low:g}, {high:g}]"
    return number


def _count(value: object, name: str, low: int, high: int) -> int | str:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{name} is {type(value).__name__}, not an integer"
    if not low <= value <= high:
        return f"{name} {str(value)[:20]} is outside {low}..{high}"
    return value


def _text(value: object, name: str) -> str | None:
    """What is wrong with ``value`` as a short printable string, or None."""
    if not isinstance(value, str):
        return f"{name} is {type(value).__name__}, not a string"
    if len(value) > MAX_TEXT or not value.isprintable():
        return f"{name} is not a short printable string"
    return None


def check_result(doc: object, key: str) -> CellResult | str:
    """``doc`` (decoded JSON, or ``attrs.asdict`` of a worker's result) as the CellResult of cell ``key``,
    or one phrase saying why it is not one. A legitimate result always passes: the simulator's figures
    are quantiles of finite samples, and its counts and scales are within these ranges."""
    from kistexp.metrics import catalogue

    if not isinstance(doc, dict):
        return f"holds {type(doc).__name__}, not a JSON object"
    # a result without attack measures (a cell whose window holds no whole second) may leave them out
    missing = [f for f in _FIELDS if f not in doc and f != "attacks"]
    if missing:
        return f"no {missing[0]!r}"
    extra = sorted(str(k) for k in doc if k not in _FIELDS)
    if extra:
        return f"unknown field {extra[0][:40]!r}"
    if doc["key"] != key:
        return "is filed under another cell's key"
    figures = doc["figures"]
    if not isinstance(figures, (list, tuple)) or not figures:
        return "figures is not a non-empty list"
    out = []
    for i, figure in enumerate(figures):
        if not isinstance(figure, (list, tuple)) or len(figure) != 4:
            return f"figures[{i}] is not [metric, relay class, median, p95]"
        metric, relay_class, median, p95 = figure
        if not isinstance(metric, str) or catalogue.get(metric) is None:
            return f"figures[{i}] names no catalogue metric"
        problem = _text(relay_class, f"figures[{i}] relay class")
        if problem:
            return problem
        numbers = [_finite(v, f"figures[{i}] {what}", -math.inf, math.inf)
                   for v, what in ((median, "median"), (p95, "p95"))]
        for number in numbers:
            if isinstance(number, str):
                return number
        out.append((metric, relay_class, *numbers))
    if len({(m, c) for m, c, _, _ in out}) != len(out):
        return "figures name a metric and relay class twice"
    checked = [_count(doc["relays"], "relays", 1, 10**7), _count(doc["clients"], "clients", 0, 10**9),
               _finite(doc["bandwidth_scale"], "bandwidth_scale", 0.0, 1.0, low_open=True),
               _finite(doc["achieved_utilisation"], "achieved_utilisation", 0.0, 1e6),
               _finite(doc["wall_s"], "wall_s", 0.0, 1e9)]
    for value in checked:
        if isinstance(value, str):
            return value
    problem = _text(doc["host"], "host")
    if problem:
        return problem
    relays, clients, bandwidth_scale, utilisation, wall_s = checked
    measured = _attacks(doc.get("attacks", ()))
    if isinstance(measured, str):
        return measured
    return CellResult(key, tuple(out), relays, clients, bandwidth_scale, utilisation, wall_s, doc["host"], measured)


def _attacks(items: object) -> tuple[tuple[str, float], ...] | str:
    """A result's attack measures as (catalogued measure, finite value) pairs, each measure once, or why not."""
    from kistexp.metrics import catalogue

    if not isinstance(items, (list, tuple)):
        return "attacks is not a list"
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            return f"attacks[{i}] is not [measure, value]"
        measure, value = item
        if not isinstance(measure, str) or catalogue.attack_measure(measure) is None:
            return f"attacks[{i}] names no catalogued attack measure"
        number = _finite(value, f"attacks[{i}] value", -math.inf, math.inf)
        if isinstance(number, str):
            return number
        out.append((measure, number))
    if len({m for m, _ in out}) != len(out):
        return "attacks name a measure twice"
    return tuple(out)


class CellCache:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.rejected = 0  # entries found but not trusted (their cells run again)
        self.notices: list[str] = []  # the first MAX_NOTICES lines about entries, for the user
        self.notice_count = 0
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(dir=self.root, prefix=".probe-")
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise SweepError(f"{self.root}: cache directory is not writable ({exc.strerror or exc}); "
                             "choose another with --cache DIR") from None

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def _notice(self, line: str) -> None:
        self.notice_count += 1
        if len(self.notices) < MAX_NOTICES:
            self.notices.append(line)

    def _reject(self, path: Path, reason: str) -> None:
        self.rejected += 1
        self._notice(f"{path}: unusable cache entry ({reason}); its cell runs again")

    def get(self, key: str) -> CellResult | None:
        """The checked result of cell ``key``, or None: absent, or not trusted (a notice says why)."""
        path = self._path(key)
        try:
            info = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None  # never stored: run the cell
        except OSError as exc:
            self._reject(path, exc.strerror or str(exc))
            return None
        # only this process writes entries, always as regular files: a link was put there by someone else
        if stat.S_ISLNK(info.st_mode):
            self._reject(path, "a symbolic link")
            return None
        try:
            # bounded, and refuses a FIFO, a device or a directory without blocking or reading it
            raw = read_bounded(path, MAX_ENTRY_BYTES, "cache entry", SweepError)
        except SweepError as exc:
            self._reject(path, str(exc).removeprefix(f"{path}: "))
            return None
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # cut short, not UTF-8, nested past the parser's depth
            self._reject(path, f"not JSON: {str(exc).splitlines()[0][:100] if str(exc) else type(exc).__name__}")
            return None
        result = check_result(doc, key)
        if isinstance(result, str):
            self._reject(path, result)
            return None
        return result

    def put(self, result: CellResult) -> None:
        path = self._path(result.key)
        if path.is_dir() and not path.is_symlink():
            # a rename cannot replace a directory, and removing someone's directory is not the cache's call
            self._notice(f"{path}: a directory is in the place of this cell's cache entry; the result is not "
                         "cached (remove the directory)")
            return
        if path.parent.exists() and not path.parent.is_dir():
            self._notice(f"{path.parent}: a file is in the place of a cache directory; the result is not cached "
                         "(remove the file)")
            return
        try:
            text = json.dumps(attrs.asdict(result), allow_nan=False)  # strict JSON: NaN is never stored
        except ValueError:
            raise SweepError(f"{path}: cannot store the cell result: it holds a number that is not finite") from None
        tmp = None
        try:
            path.parent.mkdir(exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
        except OSError as exc:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            raise SweepError(f"{path}: cannot store the cell result ({exc.strerror or exc})") from None
