"""Finished cells on disk, one JSON file per cell key (``<root>/<key[:2]>/<key>.json``).

Only the submitting process writes (results come back through the executor), each file under a temporary
name renamed into place, so an interrupted sweep leaves complete files only and a re-run skips them.
Failed cells are not stored: a re-run tries them again.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import attrs

from kistexp.errors import SweepError
from kistexp.sweep.cells import CellResult


def default_cache_dir() -> Path:
    if os.environ.get("KISTEXP_SWEEP_CACHE"):
        return Path(os.environ["KISTEXP_SWEEP_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kistexp" / "sweep"


class CellCache:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
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

    def get(self, key: str) -> CellResult | None:
        try:
            doc = json.loads(self._path(key).read_text(encoding="utf-8"))
            doc["figures"] = tuple(tuple(f) for f in doc["figures"])
            result = CellResult(**doc)
        except (OSError, ValueError, TypeError, KeyError):
            return None  # absent or unreadable: run the cell (again)
        return result if result.key == key else None

    def put(self, result: CellResult) -> None:
        path = self._path(result.key)
        try:
            path.parent.mkdir(exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(attrs.asdict(result), f)
            os.replace(tmp, path)
        except OSError as exc:
            raise SweepError(f"{path}: cannot store the cell result ({exc.strerror or exc})") from None
