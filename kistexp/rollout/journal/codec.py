"""How the journal's columns hold values (kistexp/store/schema.py): a ``Status``, a parameter set and
a judge's sequential state as JSON, and the tolerant JSON reading of the read-only views."""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping

import attrs

from kistexp.rollout.state import Counters, Status

# a parameter set or a command's arguments as a frozen row holds them: (name, value) sorted by name
Pairs = tuple[tuple[str, object], ...]


def _iso(t: dt.datetime | None) -> str | None:
    return None if t is None else t.isoformat()


def _dt(s: str | None) -> dt.datetime | None:
    return None if s is None else dt.datetime.fromisoformat(s)


def status_to_json(st: Status) -> str:
    d = attrs.asdict(st, recurse=False)
    d["values"] = [list(kv) for kv in st.values]
    for k in ("target_va", "stage_va", "decision_at"):
        d[k] = _iso(d[k])
    d["reasons"] = sorted(st.reasons)
    d["counters"] = [[name, attrs.asdict(c)] for name, c in st.counters]
    return json.dumps(d, sort_keys=True)


def status_from_json(text: str) -> Status:
    d = json.loads(text)
    d["values"] = tuple(tuple(kv) for kv in d["values"])
    for k in ("target_va", "stage_va", "decision_at"):
        d[k] = _dt(d[k])
    d["reasons"] = frozenset(d["reasons"])
    d["counters"] = tuple((name, Counters(**c)) for name, c in d["counters"])
    return Status(**d)


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
    return {k: int(v) for k, v in values if v != "unset"}


def pairs(mapping: Mapping | None) -> Pairs:
    return tuple(sorted((str(k), v) for k, v in (mapping or {}).items()))


def loads(text, default=None) -> object:
    """JSON of a journal column, or ``default`` when it is NULL or not JSON: a reader beside a run
    of another kistexp version shows what it can rather than fail on one cell."""
    try:
        return json.loads(text) if isinstance(text, (str, bytes)) else default
    except ValueError:
        return default
