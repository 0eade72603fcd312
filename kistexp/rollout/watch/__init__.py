"""The rollout as it happens, read from its journal (docs/watching.md).

Everything here reads the ``rollout_*`` tables, through the journal's read-only reader
(``kistexp.rollout.journal.JournalReader``): it needs no hook in the engine, so it
shows a dry run, a live run against fake authorities, a local tor network or the real one alike,
and it may run in the process driving the rollout or in another one (``kistexp status --watch``).

Three layers:

* ``JournalTail.poll()`` reads, on the reader's read-only connection and in one read transaction (so a
  status row and the decision written with it arrive together), the rows added since the last poll: by
  row id for the append-only tables, as a whole for the few small tables whose rows change state
  (intents, commands, runs).
* ``feed(ctx, state, rows)`` is a pure function from those rows to ``FeedEvent`` lines in plain words
  (stage entered, each look's verdict per criterion, intents acted/verified/done, pauses with what
  resolves them, rollbacks with the authorities that must act, authority outages, consensuses,
  metric gaps), and the state the next call continues from. It touches no clock and no file.
* ``follow(exp_dir, emit, stop_event, poll_s)`` polls until ``stop_event`` is set (then drains once
  more), emitting each event, and a reminder every ``reminder_s`` while the rollout is paused.

The package: ``feed`` (the rows and the pure function), ``tail`` (reading the journal as it grows),
``health`` (the authorities' health for the commands and the report).
"""

from kistexp.rollout.journal import (
    CommandRow,
    DecisionRow,
    ExposureRow,
    IntentRow,
    RunRow,
    StatusRow,
    TransitionRow,
    VerdictRow,
)
from kistexp.rollout.watch.feed import (
    CRITICAL,
    DEFAULT_REMINDER_S,
    INFO,
    WARNING,
    ConsensusRow,
    FeedContext,
    FeedEvent,
    FeedState,
    GapRow,
    HealthRow,
    JournalRows,
    VoteRow,
    effect_text,
    feed,
    reminder,
    resolving_commands,
    values_text,
)
from kistexp.rollout.watch.health import HealthSummary, health_of, health_summary
from kistexp.rollout.watch.tail import Feed, FeedThread, JournalTail, context_for, follow

__all__ = [
    "CRITICAL", "DEFAULT_REMINDER_S", "INFO", "WARNING", "CommandRow", "ConsensusRow", "DecisionRow", "ExposureRow",
    "Feed", "FeedContext", "FeedEvent", "FeedState", "FeedThread", "GapRow", "HealthRow", "HealthSummary",
    "IntentRow", "JournalRows", "JournalTail", "RunRow", "StatusRow", "TransitionRow", "VerdictRow", "VoteRow",
    "context_for", "effect_text", "feed", "follow", "health_of", "health_summary", "reminder", "resolving_commands",
    "values_text",
]
