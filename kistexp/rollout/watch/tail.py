"""Reading the journal as it grows: ``JournalTail`` (the rows each poll adds, through the journal's
read-only reader), ``Feed`` (the tail and the pure ``feed`` together), ``follow`` and ``FeedThread``."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from kistexp.errors import KistexpError
from kistexp.expdir import DB_NAME
from kistexp.rollout.journal import JournalDamageError, JournalReader
from kistexp.rollout.state import PAUSED
from kistexp.rollout.watch.feed import (
    DEFAULT_REMINDER_S,
    ConsensusRow,
    FeedContext,
    FeedEvent,
    FeedState,
    GapRow,
    HealthRow,
    JournalRows,
    VoteRow,
    feed,
    reminder,
)


class JournalTail:
    """Reads what the journal gained since the last ``poll`` (see kistexp.rollout.watch) through the
    journal's read-only reader (``kistexp.rollout.journal.JournalReader``), keeping per table the id
    of the last row read."""

    def __init__(self, exp_path: Path | str) -> None:
        self.exp_path = Path(exp_path)
        self.db = self.exp_path / DB_NAME
        self.cursors: dict[str, int] = {}
        self._reader: JournalReader | None = None

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _connect(self) -> JournalReader | None:
        if self._reader is not None:
            return self._reader
        if not self.db.is_file():
            return None
        try:
            reader = JournalReader(self.db)
        except KistexpError:
            # being created, or not a rollout's database (yet); a damaged one is the run's to refuse, its
            # own opening of the database telling what is wrong
            return None
        try:
            started = reader.meta().cadence is not None
        except sqlite3.Error:
            started = False
        if not started:
            reader.close()
            return None
        self._reader = reader
        return reader

    def ready(self) -> bool:
        return self._connect() is not None

    def _after(self, table: str, rows: Sequence, key: str = "id") -> Sequence:
        """``rows`` (those past the cursor of ``table``), moving the cursor to the last of them."""
        if rows:
            self.cursors[table] = getattr(rows[-1], key)
        return rows

    def _rewritten(self, reader: JournalReader) -> bool:
        """A dry run deletes every row and starts again: the ids fall below the cursors."""
        for table, last in (("status", reader.last_status_id), ("decisions", reader.last_decision_id)):
            cursor = self.cursors.get(table, 0)
            if cursor and last() < cursor:
                return True
        return False

    def poll(self) -> JournalRows | None:
        """The rows added since the last poll; None while there is no rollout journal to read."""
        reader = self._connect()
        if reader is None:
            return None
        try:
            with reader.snapshot():  # one snapshot: a status row and its decision come together
                rewritten = self._rewritten(reader)
                if rewritten:
                    self.cursors.clear()
                return self._read(reader, rewritten)
        except sqlite3.Error:
            self.close()  # a busy or replaced database: read again at the next poll
            raise

    def _read(self, reader: JournalReader, rewritten: bool) -> JournalRows:
        c = self.cursors.get
        statuses = self._after("status", reader.statuses(c("status", 0)))
        decisions = self._after("decisions", reader.decisions(c("decisions", 0)))
        transitions = self._after("transitions", reader.transitions(c("transitions", 0)), "seq")
        verdicts = self._after("verdicts", reader.verdicts(c("verdicts", 0)))
        intents = reader.intents()
        commands = reader.commands()
        runs = reader.runs()
        votes = [VoteRow(v.authority, v.valid_after, v.served)
                 for v in self._after("votes", reader.votes_seen(c("votes", 0)))]
        consensuses = [ConsensusRow(r.valid_after, r.params, r.signers)
                       for r in self._after("consensuses", reader.consensus_seen(c("consensuses", 0)))
                       # one flavour tells the round; the engine fetches microdesc
                       if r.flavour in ("", "microdesc")]
        health, rounds = [], {}
        for h in self._after("health", reader.authority_health(c("health", 0))):
            state = h.state or ("ok" if h.voted else "down")
            rounds.setdefault(h.valid_after, []).append((h.authority, state, h.signed))
            if state != "no-consensus":  # a round that published nothing says nothing of who voted
                health.append(HealthRow(h.valid_after, h.authority, state))
        # the engine's health rows tell each round's consensus too (every round, not only those a
        # transition waited for): published or not, and who signed it; its parameters are in consensus_seen
        for va, entries in rounds.items():
            if r_signed := tuple(a for a, _, signed in entries if signed):
                consensuses.append(ConsensusRow(va, None, r_signed, True))
            elif all(st == "no-consensus" for _, st, _ in entries):
                consensuses.append(ConsensusRow(va, None, (), False))
        gaps, batches = [], []
        for b in self._after("batches", reader.metric_batches(c("batches", 0))):
            if b.gap:
                gaps.append(GapRow(b.source or "?", b.window, b.metric, problem=b.problem))
            else:
                batches.append(b.window)
        for h in self._after("source_health", reader.source_health(c("source_health", 0))):
            if not h.ok:
                gaps.append(GapRow(h.source or "?", h.window, "", h.instance, h.problem))
        exposure = self._after("exposure", reader.exposures(c("exposure", 0)))
        return JournalRows(tuple(statuses), tuple(decisions), tuple(transitions), tuple(verdicts), tuple(intents),
                           tuple(commands), tuple(runs), tuple(votes), tuple(consensuses), tuple(health), tuple(gaps),
                           tuple(batches), tuple(exposure), rewritten)


def context_for(exp_path: Path | str, shown_as: str | None = None) -> FeedContext:
    """The feed's context from the experiment directory (its plan copy and cadence); without a
    spec when it cannot be read yet, so the feed still tells what it can."""
    from kistexp.rollout.runs import load_spec

    shown = shown_as if shown_as is not None else str(exp_path)
    try:
        spec, _, meta = load_spec(Path(exp_path))
    except JournalDamageError:
        raise  # told in one line by whoever follows the feed, never shown as a journal without a plan
    except (KistexpError, OSError):
        return FeedContext(shown)
    return FeedContext(shown, spec, meta.get("experiment_id", ""))


class Feed:
    """A ``JournalTail`` and the pure ``feed`` together: ``poll()`` gives the new events."""

    def __init__(self, exp_path: Path | str, shown_as: str | None = None) -> None:
        self.exp_path = Path(exp_path)
        self.shown_as = shown_as if shown_as is not None else str(exp_path)
        self.tail = JournalTail(exp_path)
        self.ctx: FeedContext | None = None
        self.state = FeedState()

    def poll(self) -> tuple[FeedEvent, ...]:
        rows = self.tail.poll()
        if rows is None:
            return ()
        if self.ctx is None or self.ctx.spec is None or rows.rewritten:
            self.ctx = context_for(self.exp_path, self.shown_as)
        if self.ctx.spec is not None:
            from kistexp.rollout.journal.fit import rows_fit_plan

            rows_fit_plan(self.ctx.spec, self.tail.db, self.exp_path / "plan.toml", rows.transitions, rows.decisions)
        events, self.state = feed(self.ctx, self.state, rows)
        return events

    def prime(self) -> None:
        """Take in what the journal holds now without telling it (a resumed run shows what is new)."""
        try:
            self.poll()
        except sqlite3.Error:
            pass

    def reminder(self) -> FeedEvent | None:
        return None if self.ctx is None else reminder(self.ctx, self.state)

    def close(self) -> None:
        self.tail.close()


def follow(exp_dir: Path | str, emit: Callable[[FeedEvent], None], stop_event: threading.Event,
           poll_s: float = 1.0, *, reminder_s: float = DEFAULT_REMINDER_S, feed_: Feed | None = None,
           monotonic: Callable[[], float] = time.monotonic) -> None:
    """Emit the journal's events until ``stop_event`` is set, then once more (the last rows the
    run wrote). While the rollout is paused a reminder goes out every ``reminder_s`` seconds. A
    poll that cannot read (the database busy a moment) is retried at the next one."""
    f = feed_ or Feed(exp_dir)
    paused_since: float | None = None
    last_reminder: float | None = None
    try:
        while True:
            stopping = stop_event.is_set()
            try:
                for ev in f.poll():
                    emit(ev)
            except sqlite3.Error:
                pass
            st = f.state.status
            if st is not None and st.state == PAUSED:
                now = monotonic()
                paused_since = paused_since if paused_since is not None else now
                if reminder_s > 0 and now - (last_reminder or paused_since) >= reminder_s:
                    ev = f.reminder()
                    if ev is not None:
                        emit(attrs.evolve(ev, at=None))
                    last_reminder = now
            else:
                paused_since = last_reminder = None
            if stopping:
                return
            stop_event.wait(poll_s)
    finally:
        if feed_ is None:
            f.close()


class FeedThread:
    """``follow`` on a thread of its own, beside the engine of ``kistexp run``: ``stop()`` sets its
    stop event, lets it read the journal's last rows, and joins it. An ``emit`` that fails (a closed
    stdout) ends the feed, never the run; ``error`` keeps what it was."""

    def __init__(self, feed_: Feed, emit: Callable[[FeedEvent], None], poll_s: float = 1.0,
                 reminder_s: float = DEFAULT_REMINDER_S) -> None:
        self.feed, self.emit, self.poll_s, self.reminder_s = feed_, emit, poll_s, reminder_s
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kistexp-feed", daemon=True)

    def _run(self) -> None:
        try:
            follow(self.feed.exp_path, self.emit, self.stop_event, self.poll_s, reminder_s=self.reminder_s,
                   feed_=self.feed)
        except Exception as exc:  # reported by the caller in one line; the run goes on without its feed
            self.error = exc

    def start(self) -> FeedThread:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self.stop_event.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if not self._thread.is_alive():  # a thread still reading keeps its connection (it is a daemon)
            self.feed.close()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()
