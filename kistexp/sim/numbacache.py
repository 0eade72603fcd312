"""Where numba keeps the compiled simulator (``cache=True``): one directory per version of the sources.

numba checks only the source file of each compiled function (its modification time and size),
but our functions inline constants and functions from other modules (``layout.py`` field numbers
above all), so a cache entry is valid only for the exact set of sources it was compiled from.
Instead of deleting stale entries (which races with other processes loading them, e.g. Dask
workers starting together), every set of sources gets its own directory,
``<base>/<sha256 of the compiled modules, numba and Python versions>``, set as numba's documented
``NUMBA_CACHE_DIR`` before any of them is compiled.  numba writes each cache file to a temporary
name and renames it into place, so processes compiling and loading at once see complete files.
Old directories are left alone (remove ``<base>`` by hand to reclaim the space).

``<base>`` is ``$KISTEXP_NUMBA_CACHE``, else ``$XDG_CACHE_HOME/kistexp/numba``, else
``~/.cache/kistexp/numba``.

``is_compiled()`` tells whether this copy of the simulator has been compiled into the cache (a marker
written by ``mark_compiled`` after a compile finished; numba keeps a copy's files apart by its source
directory, so the marker is per source directory too): the commands say "compiling the simulator, first
run only" before the minute or two of a first compile instead of sitting silent.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from importlib import metadata
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_active: Path | None = None  # the keyed directory use_keyed_cache chose
COMPILED_MODULES = ("layout", "ctrace", "events", "pqueue", "chanheap", "cmux_ewma", "channel", "tcp", "kistlite",
                    "kist",
                    "vanilla", "scheduler", "flowcontrol", "engine")


def sources_digest() -> str:
    digest = hashlib.sha256()
    for name in COMPILED_MODULES:
        src = _HERE / f"{name}.py"
        digest.update(name.encode())
        digest.update(src.read_bytes() if src.is_file() else b"")
    digest.update(metadata.version("numba").encode())
    digest.update(f"{sys.version_info[:2]}{platform.machine()}".encode())
    return digest.hexdigest()[:16]


def cache_base() -> Path:
    if os.environ.get("KISTEXP_NUMBA_CACHE"):
        return Path(os.environ["KISTEXP_NUMBA_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kistexp" / "numba"


def use_keyed_cache() -> Path:
    """Point numba's cache at this version's directory; call before the compiled modules load."""
    global _active
    path = cache_base() / sources_digest()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return path  # not writable: numba then compiles without a cache (it warns and goes on)
    _active = path
    os.environ["NUMBA_CACHE_DIR"] = str(path)  # inherited by worker processes
    if "numba" in sys.modules:  # numba read its configuration at import: tell it as well
        sys.modules["numba"].config.CACHE_DIR = str(path)
    return path


def _marker() -> Path | None:
    if _active is None:
        return None
    return _active / f"compiled-{hashlib.sha256(str(_HERE).encode()).hexdigest()[:16]}"


def is_compiled() -> bool:
    """True when a compile of these sources, from this directory, finished into the cache."""
    marker = _marker()
    return marker is not None and marker.is_file()


def mark_compiled() -> bool:
    """Record that the compile finished (False when the cache cannot be written: every run compiles)."""
    marker = _marker()
    if marker is None:
        return False
    try:
        marker.touch()
    except OSError:
        return False
    return True
