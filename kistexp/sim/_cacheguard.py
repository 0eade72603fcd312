"""Keep numba's on-disk cache (``cache=True``) consistent across the compiled modules.

numba checks only the source file of each compiled function, but our functions inline
constants and functions from other modules (``layout.py`` field numbers above all).  A change in
any of those files must therefore drop every cached kernel of the package, or a stale one
could index the wrong field.  A fingerprint of all module sources is kept next to the cache.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

_HERE = Path(__file__).resolve().parent
COMPILED_MODULES = ("layout", "events", "pqueue", "chanheap", "cmux_ewma", "channel", "tcp", "kistlite", "kist",
                    "vanilla", "scheduler", "flowcontrol", "engine")


def drop_stale_numba_cache() -> None:
    cache = _HERE / "__pycache__"
    digest = hashlib.sha256()
    for name in COMPILED_MODULES:
        src = _HERE / f"{name}.py"
        digest.update(name.encode())
        digest.update(src.read_bytes() if src.is_file() else b"")
    stamp = cache / "numba-sources.sha256"
    want = digest.hexdigest()
    try:
        if stamp.is_file() and stamp.read_text().strip() == want:
            return
        if cache.is_dir():
            for name in COMPILED_MODULES:
                for f in list(cache.glob(f"{name}.*.nbi")) + list(cache.glob(f"{name}.*.nbc")):
                    f.unlink(missing_ok=True)
        cache.mkdir(exist_ok=True)
        stamp.write_text(want + "\n")
    except OSError:
        pass  # read-only install: numba then uses its own cache location
