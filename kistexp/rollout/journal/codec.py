"""How the journal's columns hold values (kistexp/store/schema.py): a ``Status``, a parameter set and
a judge's sequential state as JSON; and the typed decoding of every column the readers return.

A value that is not what its column holds (text in a time column, a time outside the calendar, JSON
that does not parse or has the wrong shape) is damage: a decoder raises ``BadValue`` saying which
column and what is wrong, and the reader turns it into one ``JournalDamageError`` naming the database,
the table and the row. A row is never skipped or read as a default: status and history would then be
silently wrong, which is worse than a refusal.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs
import numpy as np

from kistexp.metrics.series import from_us, to_us
from kistexp.params import INT32_MAX, INT32_MIN
from kistexp.plan.loader import DATE_MARGIN
from kistexp.plan.model import UNSET
from kistexp.rollout.spec import RolloutError
from kistexp.rollout.state import ABORT_TO_BASELINE, COMMANDS, ROLLBACK_KINDS, STATES, Counters, Status
from kistexp.textsafe import visible

# a parameter set or a command's arguments as a frozen row holds them: (name, value) sorted by name
Pairs = tuple[tuple[str, object], ...]


def _iso(t: dt.datetime | None) -> str | None:
    return None if t is None else t.isoformat()


def status_to_json(st: Status) -> str:
    d = attrs.asdict(st, recurse=False)
    d["values"] = [list(kv) for kv in st.values]
    for k in ("target_va", "stage_va", "decision_at"):
        d[k] = _iso(d[k])
    d["reasons"] = sorted(st.reasons)
    d["counters"] = [[name, attrs.asdict(c)] for name, c in st.counters]
    return json.dumps(d, sort_keys=True)


def status_from_json(text) -> Status:
    """The ``Status`` a ``rollout_status.status`` cell holds; ``BadValue`` naming the field at fault.

    Every field the first journals wrote is required (a missing one would read as its default, e.g.
    ``{}`` as PENDING at the baseline); ``rounds_missing`` came later and defaults to 0. A key this
    kistexp does not know is refused too: it was written by a newer engine whose status this one
    cannot tell whole."""
    d = json_value(text, "status", dict)
    unknown = sorted(set(d) - set(_STATUS_FIELDS))
    if unknown:
        raise BadValue(f"status has fields this kistexp does not know ({_listed(unknown)}): written by a newer "
                       "kistexp?")
    out = {}
    for name, decode in _STATUS_FIELDS.items():
        if name not in d:
            if name in _STATUS_LATER:
                continue
            raise BadValue(f"status lacks its {name!r} field")
        out[name] = decode(d[name], f"status.{name}")
    return Status(**out)


def values_json(values) -> str:
    return json.dumps({k: v for k, v in values}, sort_keys=True)


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def sequential_to_dict(state) -> dict:
    d = attrs.asdict(state)
    d["fractions"] = list(state.fractions)
    return d


def sequential_from_dict(d: dict):
    from kistexp.judge import SequentialState

    return SequentialState(**{**d, "fractions": tuple(d["fractions"])})


def desired_params(values) -> dict[str, int]:
    """The ConsensusParams set an authority is asked to run: unset keys are left out."""
    return {k: int(v) for k, v in values if v != UNSET}


def pairs(mapping: Mapping | None) -> Pairs:
    return tuple(sorted((str(k), v) for k, v in (mapping or {}).items()))


# --- typed decoding of the journal's columns ---------------------------------------------------------


class JournalDamageError(RolloutError):
    """A row of the rollout journal that is not what its table holds: one line naming the database,
    the table and the row (its id, or a ``rollout_meta`` key), so it can be found and mended. Without a
    table: the database itself is damaged where SQLite reads it (a garbled page)."""

    def __init__(self, db: Path | str, table: str | None, row: object, problem: str) -> None:
        super().__init__(f"{db}: {table} row {row}: {problem}" if table else f"{db}: {problem}")
        self.db, self.table, self.row, self.problem = str(db), table, row, problem


class JournalTooNewError(RolloutError):
    """The journal's schema is newer than this kistexp reads: written by a newer kistexp."""


class BadValue(ValueError):
    """One value is not what its column holds; the message says which column and why (the reader adds
    the table and the row)."""


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


# A column the table lacks because an older schema did not have it yet: read as the column's default.
ABSENT = _Absent()

# The times a journal may hold. A plan's dates keep DATE_MARGIN clear of the calendar's ends (years 1 to
# 9999, as Python computes them; kistexp.plan.loader), so a time nearer the ends is damage; refusing it
# also keeps what is computed from it (an hour later, a propagation ETA) inside the calendar.
_UTC = dt.timezone.utc
EARLIEST = dt.datetime.min.replace(tzinfo=_UTC) + DATE_MARGIN
LATEST = dt.datetime.max.replace(tzinfo=_UTC) - DATE_MARGIN
EARLIEST_US, LATEST_US = to_us(EARLIEST), to_us(LATEST)
_SPAN = f"{EARLIEST.date().isoformat()} to {LATEST.date().isoformat()} UTC"
INT64_MAX = 2**63 - 1  # SQLite's integers


def shown(value: object) -> str:
    """A cell's value in a message: short, one line, its kind where the value itself says little."""
    if value is None:
        return "NULL"
    if value is ABSENT:
        return "missing"
    if isinstance(value, bytes):
        return f"a blob of {len(value)} bytes"
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else repr(value[:37]) + "..."
    if isinstance(value, (list, dict)):
        return f"a JSON {'list' if isinstance(value, list) else 'object'}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _listed(names) -> str:
    names = [visible(str(n))[:40] for n in names]  # names from the cell itself: shown, never obeyed
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def time_value(value, column: str, *, null: bool = False, default: dt.datetime | None = None) -> dt.datetime | None:
    """A time column (integer microseconds since 1970, UTC) as an aware datetime."""
    if value is ABSENT:
        return default
    if value is None and null:
        return None
    if not _is_int(value):
        raise BadValue(f"{column} is {shown(value)}, not a time (integer microseconds since 1970)")
    if not EARLIEST_US <= value <= LATEST_US:
        raise BadValue(f"{column} {value} is outside the times kistexp computes with "
                       f"({_SPAN})")
    return from_us(value)


def iso_time(value, column: str, *, null: bool = False) -> dt.datetime | None:
    """A time written as ISO 8601 text with its UTC offset (``Status`` fields, ``rollout_meta`` start)."""
    if value is None and null:
        return None
    if not isinstance(value, str):
        raise BadValue(f"{column} is {shown(value)}, not an ISO 8601 time")
    try:
        t = dt.datetime.fromisoformat(value)
    except ValueError:
        raise BadValue(f"{column} {shown(value)} is not an ISO 8601 time") from None
    if t.tzinfo is None:
        raise BadValue(f"{column} {shown(value)} has no UTC offset")
    try:
        t = t.astimezone(_UTC)
    except OverflowError:
        raise BadValue(f"{column} {shown(value)} is outside the times kistexp computes with") from None
    if not EARLIEST <= t <= LATEST:
        raise BadValue(f"{column} {shown(value)} is outside the times kistexp computes with "
                       f"({_SPAN})")
    return t


def int_value(value, column: str, *, null: bool = False, default: int | None = 0, low: int = 0,
              high: int = INT64_MAX) -> int | None:
    """An integer column in ``[low, high]`` (counts and stages are never negative)."""
    if value is ABSENT:
        return default
    if value is None and null:
        return None
    if not _is_int(value):
        raise BadValue(f"{column} is {shown(value)}, not an integer")
    if not low <= value <= high:
        raise BadValue(f"{column} {value} is " + (f"below {low}" if value < low and high == INT64_MAX else
                                                  f"out of range ({low} to {high})"))
    return value


def real_value(value, column: str, *, null: bool = False) -> float | None:
    """A number column; finite, as the writer keeps them (it writes NULL for NaN and infinities)."""
    if value is None and null:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise BadValue(f"{column} is {shown(value)}, not a number")
    try:
        x = float(value)
    except OverflowError:
        raise BadValue(f"{column} {shown(value)} is too large a number") from None
    if not math.isfinite(x):
        raise BadValue(f"{column} is {x}, not a finite number")
    return x


def text_value(value, column: str, *, default: str = "", null: bool = False) -> str:
    """A text column (NULL only where the column allows it: then read as ``default``)."""
    if value is ABSENT or (value is None and null):
        return default
    if not isinstance(value, str):
        raise BadValue(f"{column} is {shown(value)}, not text")
    return value


def flag_value(value, column: str, *, default: bool = False) -> bool:
    """A 0/1 column."""
    if value is ABSENT:
        return default
    if value not in (0, 1) or not _is_int(value):
        raise BadValue(f"{column} is {shown(value)}, not 0 or 1")
    return bool(value)


def json_value(value, column: str, kind: type | tuple[type, ...], *, null: bool = False):
    """A JSON column of ``kind`` (dict, list); JSON ``null`` where ``null`` allows it (returns None)."""
    if not isinstance(value, str):
        raise BadValue(f"{column} is {shown(value)}, not JSON text")
    if not value.strip():
        raise BadValue(f"{column} is empty, not JSON")
    try:
        parsed = json.loads(value)
    except RecursionError:
        raise BadValue(f"{column} is JSON nested too deeply") from None
    except ValueError:
        raise BadValue(f"{column} is not JSON") from None
    if parsed is None and null:
        return None
    if not isinstance(parsed, kind):
        want = " or ".join(_JSON_KINDS.get(k, k.__name__) for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise BadValue(f"{column} is {_json_kind(parsed)}, not {want}")
    return parsed


_JSON_KINDS = {dict: "a JSON object", list: "a JSON list"}


def _json_kind(x) -> str:
    if x is None:
        return "JSON null"
    if isinstance(x, bool):
        return "a JSON boolean"
    if isinstance(x, (int, float)):
        return "a JSON number"
    if isinstance(x, str):
        return "a JSON string"
    return _JSON_KINDS[type(x)]


def param_value(value, column: str, *, unset: bool = False) -> int | str:
    """A consensus parameter's value: a 32-bit integer as tor takes them; ``"unset"`` where a set may
    leave a parameter out (a stage's target values)."""
    if unset and isinstance(value, str):
        # a Status keeps values as the plan gave them: integers, or text of one ("10"), or "unset"
        digits = value.removeprefix("-")
        if value == UNSET or (digits.isascii() and digits.isdigit() and len(digits) <= 10
                                and INT32_MIN <= int(value) <= INT32_MAX):
            return value
        raise BadValue(f"{column} is {shown(value)}, not a parameter value")
    if not _is_int(value) or not INT32_MIN <= value <= INT32_MAX:
        raise BadValue(f"{column} is {shown(value)}, not a 32-bit integer")
    return value


def params_value(value, column: str, *, unset: bool = False, null: bool = False) -> Pairs | None:
    """A parameter set held as a JSON object {name: value} (or JSON null where ``null`` allows)."""
    d = json_value(value, column, dict, null=null)
    if d is None:
        return None
    return tuple(sorted((k, param_value(v, f"{column}[{k!r}]", unset=unset)) for k, v in d.items()))


def samples_value(payload, n) -> np.ndarray:
    """A metric batch's payload: float64 little-endian samples, as many as its ``n`` column says."""
    if not isinstance(payload, bytes):
        raise BadValue(f"payload is {shown(payload)}, not float64 samples")
    if len(payload) % 8 or (_is_int(n) and len(payload) // 8 != n):
        raise BadValue(f"payload holds {len(payload)} bytes, not the {shown(n)} float64 samples its n says")
    return np.frombuffer(payload, dtype="<f8")


def relays_value(value, column: str) -> tuple[tuple[str, int], ...]:
    """A batch's relays: a JSON list of [relay, samples] pairs in payload order."""
    items = json_value(value, column, list)
    out = []
    for i, item in enumerate(items):
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and _is_int(item[1])
                and item[1] >= 0):
            raise BadValue(f"{column}[{i}] is not a [relay, samples] pair")
        out.append((item[0], item[1]))
    return tuple(out)


def sequential_value(value, column: str):
    """A criterion's sequential test state (``kistexp.judge.SequentialState``) as the engine saved it."""
    from kistexp.judge import SequentialState
    from kistexp.judge.model import SEQUENTIAL_METHODS

    d = json_value(value, column, dict)
    names = {f.name for f in attrs.fields(SequentialState)}
    if not set(d) <= names or "method" not in d or "planned_stage" not in d:
        raise BadValue(f"{column} has fields {_listed(sorted(d))}, not those of a sequential test state")
    if d["method"] not in SEQUENTIAL_METHODS:
        raise BadValue(f"{column}.method is {shown(d['method'])}, not one of {', '.join(SEQUENTIAL_METHODS)}")
    fractions = d.get("fractions", [])
    if not isinstance(fractions, list):
        raise BadValue(f"{column}.fractions is {_json_kind(fractions)}, not a list")
    numbers = {k: real_value(v, f"{column}.{k}") for k, v in d.items() if k not in ("method", "fractions")}
    return SequentialState(d["method"], **numbers,
                           fractions=tuple(real_value(x, f"{column}.fractions[{i}]") for i, x in enumerate(fractions)))


def cadence_value(value, column: str = "value"):
    """A run's voting cadence as ``rollout_meta`` keeps it (a ``kistexp.rollout.spec.Cadence`` as JSON),
    within what the cadences kistexp lays plans on can be: a whole interval of 2 s (the fastest fake
    authorities) to 24 h (tor's limit), positive delays that tor's Interval/4 rule keeps within half of
    it, at least two intervals of validity, an offset inside the interval."""
    from kistexp.rollout.spec import Cadence

    d = json_value(value, column, dict)
    fields = {f.name for f in attrs.fields(Cadence)}
    unknown = sorted(set(d) - fields)
    if unknown:
        raise BadValue(f"cadence has fields this kistexp does not know ({_listed(unknown)})")
    for name in ("interval_s", "vote_s", "dist_s"):
        if name not in d:
            raise BadValue(f"cadence lacks its {name!r} field")
    interval = real_value(d["interval_s"], "cadence interval_s")
    if not (interval.is_integer() and 2 <= interval <= 86_400):
        raise BadValue(f"cadence interval_s {d['interval_s']!r} is not a whole number of seconds from 2 to 86400")
    vote, dist = real_value(d["vote_s"], "cadence vote_s"), real_value(d["dist_s"], "cadence dist_s")
    if not (vote > 0 and dist > 0 and vote + dist <= interval / 2 + 1e-6):
        raise BadValue(f"cadence vote_s {vote:g} and dist_s {dist:g} are not positive delays within half of "
                       f"interval_s {interval:g}")
    n_valid = int_value(d.get("n_valid", 3), "cadence n_valid", low=2, high=1000)
    offset = int_value(d.get("offset_s", 0), "cadence offset_s", high=int(interval) - 1)
    margin = d.get("margin_override_s")
    if margin is not None and not 0 <= real_value(margin, "cadence margin_override_s") < interval:
        raise BadValue(f"cadence margin_override_s {margin!r} is not from 0 to the interval")
    # the values as written (an int stays an int): the spec laid on them is the run's own
    return Cadence(d["interval_s"], d["vote_s"], d["dist_s"], n_valid, offset, margin)


def _stage_arg(v) -> bool:
    return v in ("", "baseline") or isinstance(v, str) and v.isascii() and v.isdigit() and len(v) <= 6


# What each command takes, as ``kistexp pause|resume|...`` and a dry run's ``--command`` write them: a
# flag is true or false, ``abort --kind`` a rollback kind, ``undo --to-stage`` a stage number or baseline.
_ARGS: dict[str, dict[str, Callable[[object], bool]]] = {
    "pause": {"freeze": lambda v: isinstance(v, bool)},
    "resume": {},
    "promote": {"full": lambda v: isinstance(v, bool), "force": lambda v: isinstance(v, bool)},
    "abort": {"kind": lambda v: v in ("", *ROLLBACK_KINDS, ABORT_TO_BASELINE)},
    "retry": {},
    "undo": {"to_stage": _stage_arg, "fast": lambda v: isinstance(v, bool)},
}


def args_value(value, column: str, kind: str) -> Pairs:
    """A command's arguments (a JSON object) as command ``kind`` takes them; anything else is refused,
    since the engine would act on it (``--freeze "maybe"`` reads as a freeze)."""
    d = json_value(value, column, dict)
    takes = _ARGS.get(kind, {})
    for k, v in d.items():
        if k not in takes:
            what = ", ".join(takes) or "no arguments"
            raise BadValue(f"{column}: {kind} takes {what}, not {shown(k)}")
        if not takes[k](v):
            raise BadValue(f"{column}: {kind} {k} is {shown(v) if isinstance(v, str) else _json_kind(v)}, which "
                           f"{kind} does not take")
    return pairs(d)


def names_value(value, column: str) -> tuple[str, ...]:
    """A JSON list of text (a consensus's signers, a run's argv)."""
    items = json_value(value, column, list)
    for i, x in enumerate(items):
        if not isinstance(x, str):
            raise BadValue(f"{column}[{i}] is {_json_kind(x)}, not text")
    return tuple(items)


def command_kind(value, column: str = "kind") -> str:
    if value not in COMMANDS:
        raise BadValue(f"{column} is {shown(value)}, not one of {', '.join(COMMANDS)}")
    return value


# --- a Status's fields ---------------------------------------------------------------------------------

def _state(v, where: str) -> str:
    if v not in STATES:
        raise BadValue(f"{where} is {shown(v)}, not a rollout state")
    return v


def _count(v, where: str) -> int:
    return int_value(v, where)


def _opt_count(v, where: str) -> int | None:
    return int_value(v, where, null=True)


def _text(v, where: str) -> str:
    return text_value(v, where)


def _flag(v, where: str) -> bool:
    if not isinstance(v, bool):
        raise BadValue(f"{where} is {_json_kind(v) if not isinstance(v, (str, bytes)) else shown(v)}, not true "
                       "or false")
    return v


def _opt_time(v, where: str) -> dt.datetime | None:
    return iso_time(v, where, null=True)


def _values(v, where: str) -> tuple[tuple[str, int | str], ...]:
    if not isinstance(v, list):
        raise BadValue(f"{where} is {_json_kind(v)}, not a list of [parameter, value] pairs")
    out = []
    for i, kv in enumerate(v):
        if not (isinstance(kv, list) and len(kv) == 2 and isinstance(kv[0], str)):
            raise BadValue(f"{where}[{i}] is not a [parameter, value] pair")
        out.append((kv[0], param_value(kv[1], f"{where}[{i}]", unset=True)))
    return tuple(out)


def _reasons(v, where: str) -> frozenset[str]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise BadValue(f"{where} is not a list of pause reasons")
    return frozenset(v)


_COUNTER_FIELDS = tuple(f.name for f in attrs.fields(Counters))


def _counters(v, where: str) -> tuple[tuple[str, Counters], ...]:
    if not isinstance(v, list):
        raise BadValue(f"{where} is {_json_kind(v)}, not a list of [criterion, counters] pairs")
    out = []
    for i, item in enumerate(v):
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], dict)):
            raise BadValue(f"{where}[{i}] is not a [criterion, counters] pair")
        name, c = item
        if set(c) != set(_COUNTER_FIELDS):
            raise BadValue(f"{where}[{i}] ({name!r}) has counters {_listed(sorted(c))}, not "
                           f"{_listed(_COUNTER_FIELDS)}")
        out.append((name, Counters(**{k: (_text if k == "latest" else _count)(c[k], f"{where}[{i}].{k}")
                                      for k in _COUNTER_FIELDS})))
    return tuple(out)


_STATUS_FIELDS: dict[str, Callable] = {
    "state": _state, "stage": _count, "values": _values, "target_va": _opt_time, "rounds_waited": _count,
    "rounds_missing": _count, "stage_va": _opt_time, "decision_at": _opt_time, "extensions": _count,
    "reasons": _reasons, "rollback_kind": _text, "from_stage": _count, "counters": _counters,
    "aborted_stage": _opt_count, "fast": _flag, "promoted": _flag, "resume_to": _text, "seq": _count,
}
_STATUS_LATER = frozenset({"rounds_missing"})  # fields the first journals' statuses lack
