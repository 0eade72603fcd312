"""The journal's rows as its readers return them: frozen classes for the rows of the ``rollout_*``
tables (columns in kistexp/store/schema.py), times as UTC datetimes, JSON columns parsed into tuples
so a row stays hashable. ``id`` is the row's id in its table (SQLite's rowid), which only grows while
a run appends: the event feed reads "the rows after id N" with it."""

from __future__ import annotations

import datetime as dt

import attrs
import numpy as np

from kistexp.rollout.journal.codec import Pairs
from kistexp.rollout.state import Status

INTENT_STATES = ("intended", "acted", "verified", "done", "superseded", "failed")
COMMAND_STATES = ("queued", "applied", "refused")


@attrs.frozen
class JournalMeta:
    """``rollout_meta``: what the run was started with (experiment id, mode, cadence, start, the plan's
    hashes). Keys a newer kistexp adds are kept too: ``get`` reads any."""

    items: tuple[tuple[str, str], ...] = ()

    def get(self, key: str, default: str | None = None) -> str | None:
        return next((v for k, v in self.items if k == key), default)

    def as_dict(self) -> dict[str, str]:
        return dict(self.items)

    @property
    def experiment_id(self) -> str | None:
        return self.get("experiment_id")

    @property
    def mode(self) -> str | None:
        return self.get("mode")

    @property
    def cadence(self) -> str | None:
        """The cadence as JSON; None until a run or dry run has laid the plan on the clock."""
        return self.get("cadence")

    @property
    def start(self) -> str | None:
        return self.get("start")


@attrs.frozen
class StatusRow:
    """``rollout_status``: the status after an event changed it (the last row is the status)."""

    id: int
    event_key: str
    at: dt.datetime
    status: Status


@attrs.frozen
class DecisionRow:
    id: int
    event_key: str
    at: dt.datetime
    decision: str
    stage: int
    valid_after: dt.datetime | None
    message: str


@attrs.frozen
class TransitionRow:
    seq: int  # the table's key: transitions are read "after seq N"
    at: dt.datetime
    from_state: str
    to_state: str
    stage: int
    kind: str
    targets: Pairs
    valid_after: dt.datetime
    cause: str


@attrs.frozen
class VerdictRow:
    id: int
    criterion: str
    window_end: dt.datetime
    stage: int
    outcome: str
    effect: float | None
    ci_low: float | None
    ci_high: float | None
    n_baseline: int
    n_stage: int
    shadow: bool
    detail: str
    reason: str = ""
    phase: str = ""
    rule: str = ""
    record: str = "{}"  # the judge's whole Verdict as JSON (kistexp.jsonout.to_json)


@attrs.frozen
class IntentRow:
    id: int
    idem_key: str
    seq: int  # the transition it belongs to
    authority: str
    desired: Pairs
    valid_after: dt.datetime
    state: str
    attempts: int
    error: str
    evidence: str
    intended: dt.datetime
    acted: dt.datetime | None
    verified: dt.datetime | None
    done: dt.datetime | None  # done, superseded or failed

    @property
    def changed(self) -> dt.datetime | None:
        """When it reached its present state, as journaled (None for ``intended``)."""
        return {"acted": self.acted, "verified": self.verified, "done": self.done, "superseded": self.done,
                "failed": self.done}.get(self.state)


@attrs.frozen
class CommandRow:
    id: int
    kind: str
    args: Pairs
    user: str
    queued: dt.datetime
    state: str  # queued | applied | refused
    result: str


@attrs.frozen
class RunRow:
    id: int
    pid: int
    host: str
    start: dt.datetime
    end: dt.datetime | None  # None while it runs, or if it died without ending its row
    reason: str
    argv: tuple[str, ...] = ()


@attrs.frozen
class OwnerRow:
    """``rollout_owner``: the process that last took the run lock, for messages and liveness."""

    pid: int
    host: str
    since: dt.datetime
    heartbeat: dt.datetime


@attrs.frozen
class VoteSeenRow:
    id: int
    authority: str
    valid_after: dt.datetime
    params: Pairs | None  # None: the authority served no vote
    digest: str

    @property
    def served(self) -> bool:
        return self.params is not None


@attrs.frozen
class ConsensusSeenRow:
    id: int
    valid_after: dt.datetime
    flavour: str
    params: Pairs | None  # None: no consensus was published
    signers: tuple[str, ...]


@attrs.frozen(eq=False)
class BatchRow:
    source: str
    metric: str
    phase: str
    window: dt.datetime
    values: np.ndarray
    relays: tuple[tuple[str, int], ...] | None
    origin: str


@attrs.frozen
class BatchInfoRow:
    """A metric batch without its samples: what was collected for a window, or that nothing was."""

    id: int
    source: str
    metric: str
    window: dt.datetime
    phase: str
    n: int
    missing: bool
    origin: str = ""
    excluded: int = 0
    problem: str = ""  # read where a newer schema has the column

    @property
    def gap(self) -> bool:
        return self.missing or not self.n


@attrs.frozen
class SourceHealthRow:
    window: dt.datetime
    source: str
    instance: str
    ok: bool
    n_samples: int
    problem: str
    id: int = 0


@attrs.frozen
class ExposureRow:
    """``rollout_exposure``: what share of a population ran the stage's values at a look, against what
    propagation predicts; kistexp.rollout.exposure's checks return these (``id`` 0 until journaled)."""

    at: dt.datetime
    stage: int
    population: str  # relays | clients
    expected_share: float
    observed_share: float | None  # None: no node could be asked
    n_nodes: int
    n_on_target: int
    n_pinned: int
    n_unknown: int
    short: bool
    detail: str
    id: int = 0


@attrs.frozen
class AuthorityHealthRow:
    valid_after: dt.datetime
    authority: str
    voted: bool
    signed: bool
    state: str
    id: int = 0

