"""One directory per experiment: its database, a copy of its plan and, later, its report.

Layout::

    EXP/
      experiment.db   the one SQLite database (schema: kistexp/store/schema.py)
      plan.toml       copy of the plan the experiment runs (if one was given)
      report.html     written by the report step
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

from kistexp.store.schema import StoreError, open_db

DB_NAME = "experiment.db"
PLAN_NAME = "plan.toml"
REPORT_NAME = "report.html"


class ExperimentDir:
    """An experiment directory. Use ``create`` or ``open``; ``.db`` opens the database
    on first use and keeps the connection."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._db: sqlite3.Connection | None = None

    # --- construction -------------------------------------------------------------

    @classmethod
    def create(cls, path: str | Path, plan_path: str | Path | None = None, *,
               exist_ok: bool = False) -> ExperimentDir:
        """Make a new experiment directory (parents too) with an empty, migrated database.

        Refuses a path that is a file, a directory that already holds an experiment
        (unless ``exist_ok``) or one that cannot be written.
        """
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise StoreError(f"{path}: is a file, not an experiment directory")
        if (path / DB_NAME).exists() and not exist_ok:
            raise StoreError(f"{path}: already holds an experiment ({DB_NAME} exists)")
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"{path}: cannot create the experiment directory: {exc.strerror or exc}") from None
        _require_writable(path)
        exp = cls(path)
        if plan_path is not None:
            exp.save_plan(plan_path)
        exp.db  # noqa: B018 - creates and migrates the database now, so errors surface here
        return exp

    @classmethod
    def open(cls, path: str | Path) -> ExperimentDir:
        """Open an existing experiment directory (one holding experiment.db)."""
        path = Path(path)
        if not path.exists():
            raise StoreError(f"{path}: no such experiment directory")
        if not path.is_dir():
            raise StoreError(f"{path}: is a file, not an experiment directory")
        if not (path / DB_NAME).is_file():
            raise StoreError(f"{path}: not an experiment directory (no {DB_NAME})")
        exp = cls(path)
        exp.db  # noqa: B018 - surfaces a corrupt or newer database at open time
        return exp

    @classmethod
    def open_or_create(cls, path: str | Path) -> ExperimentDir:
        """Open the experiment at ``path``, creating it if the directory holds none."""
        path = Path(path)
        if (path / DB_NAME).is_file():
            return cls.open(path)
        return cls.create(path)

    # --- contents -------------------------------------------------------------------

    @property
    def db_path(self) -> Path:
        return self.path / DB_NAME

    @property
    def plan_path(self) -> Path:
        return self.path / PLAN_NAME

    @property
    def report_path(self) -> Path:
        return self.path / REPORT_NAME

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            self._db = open_db(self.db_path)
        return self._db

    def save_plan(self, plan_path: str | Path) -> Path:
        """Copy the plan file into the directory (the experiment keeps what it ran)."""
        src = Path(plan_path)
        if not src.is_file():
            raise StoreError(f"{src}: plan file not found")
        try:
            shutil.copyfile(src, self.plan_path)
        except OSError as exc:
            raise StoreError(f"{self.plan_path}: cannot copy the plan: {exc.strerror or exc}") from None
        return self.plan_path

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self) -> ExperimentDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ExperimentDir({str(self.path)!r})"


def _require_writable(path: Path) -> None:
    # os.access ignores root's override on read-only mounts; a real write test does not.
    probe = path / ".kistexp-write-test"
    try:
        with probe.open("wb"):
            pass
        probe.unlink()
    except OSError as exc:
        raise StoreError(f"{path}: experiment directory is not writable: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK):
        raise StoreError(f"{path}: experiment directory is not writable")
