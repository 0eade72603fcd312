"""Value objects of the metric model: one measurement (Sample) and one point of a
simulator-predicted distribution (Prediction).

A series is a catalogue metric plus a set of labels. Common label keys:

- ``relay``: relay identity fingerprint (40 uppercase hex), for relay metrics;
- ``relay_class``: the relay class of the plan or population model;
- ``position``: the relay's position from its consensus flags (guard+exit, guard, exit,
  middle);
- ``source``: where the sample came from (OnionPerf source name, scrape URL, report file);
- ``size``: transfer size in bytes, for client transfer metrics;
- ``server``: "onion" or "public" (OnionPerf's server kind);
- ``stage``: the plan stage the sample was taken in, when known;
- ``node``: a local network's node nickname.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping
from types import MappingProxyType

import attrs

from kistexp.metrics import catalogue

_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_]*$")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def to_us(t: dt.datetime) -> int:
    """Microseconds since the Unix epoch of an aware datetime (the store's time unit)."""
    if t.tzinfo is None:
        raise ValueError(f"naive datetime {t.isoformat()}: metric times must be UTC-aware")
    delta = t - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_us(us: int) -> dt.datetime:
    return _EPOCH + dt.timedelta(microseconds=int(us))


def from_unix(seconds: float) -> dt.datetime:
    """UTC datetime of a Unix timestamp in seconds, kept to the microsecond."""
    return _EPOCH + dt.timedelta(microseconds=round(float(seconds) * 1_000_000))


# Validated label sets, shared between samples: a store select builds thousands of
# samples per series, and re-validating the same labels for each dominated its cost.
_LABEL_SETS: dict[tuple[tuple[str, str], ...], Mapping[str, str]] = {}
_MAX_LABEL_SETS = 100_000


def _labels(value: Mapping[str, str] | None) -> Mapping[str, str]:
    if type(value) is MappingProxyType:
        known = _LABEL_SETS.get(tuple(value.items()))
        if known is not None:
            return known
    items = dict(value or {})
    for k, v in items.items():
        if not isinstance(k, str) or not _LABEL_KEY.match(k):
            raise ValueError(f"label key {k!r} is not a lowercase identifier")
        if not isinstance(v, str):
            raise ValueError(f"label {k}={v!r} is not a string")
    key = tuple(sorted(items.items()))
    known = _LABEL_SETS.get(key)
    if known is None:
        if len(_LABEL_SETS) >= _MAX_LABEL_SETS:
            _LABEL_SETS.clear()
        known = _LABEL_SETS[key] = MappingProxyType(dict(key))
    return known


def _utc(value: dt.datetime) -> dt.datetime:
    if not isinstance(value, dt.datetime):
        raise TypeError(f"sample time {value!r} is not a datetime")
    if value.tzinfo is None:
        raise ValueError(f"naive datetime {value.isoformat()}: metric times must be UTC-aware")
    return value.astimezone(dt.timezone.utc)


def _finite(_inst: object, attribute: attrs.Attribute, value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"{attribute.name} {value!r} is not a finite number")


@attrs.frozen
class Sample:
    """One measurement of a metric.

    ``param_value`` is the consensus value in effect for the measured relay or client
    when it was measured (None = unknown); windows select on it so that samples taken
    while a new value propagates are not counted for the wrong value.
    """

    time: dt.datetime = attrs.field(converter=_utc)
    value: float = attrs.field(converter=float, validator=_finite)
    labels: Mapping[str, str] = attrs.field(factory=dict, converter=_labels, hash=False)
    param_value: int | None = attrs.field(default=None, converter=attrs.converters.optional(int))


def _metric_name(_inst: object, _attribute: attrs.Attribute, value: str) -> None:
    if catalogue.get(value) is None:
        raise ValueError(f"unknown metric {value!r} (not in the catalogue)")


def _quantile(_inst: object, _attribute: attrs.Attribute, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"quantile {value!r} is outside [0, 1]")


@attrs.frozen
class Prediction:
    """One quantile of a predicted distribution: the value below which a share
    ``quantile`` of ``metric``'s samples fall, for ``stage`` ("baseline", a stage name or
    "transition:<stage>") and ``relay_class`` ("" for client metrics) on simulated
    network number ``network``."""

    stage: str
    metric: str = attrs.field(validator=_metric_name)
    relay_class: str
    network: int = attrs.field(converter=int)
    quantile: float = attrs.field(converter=float, validator=_quantile)
    value: float = attrs.field(converter=float, validator=_finite)


def _attack_measure_name(_inst: object, _attribute: attrs.Attribute, value: str) -> None:
    if not value.startswith("attack_flow_tpr_at_fpr_") and catalogue.attack_measure(value) is None:
        raise ValueError(f"unknown attack measure {value!r} (not in the catalogue)")


@attrs.frozen
class AttackValue:
    """What an attack achieved (``measure``, a name of ``catalogue.ATTACK_MEASURES``) in ``stage``
    ("baseline" or a stage name) on simulated network number ``network``."""

    stage: str
    measure: str = attrs.field(validator=_attack_measure_name)
    network: int = attrs.field(converter=int)
    value: float = attrs.field(converter=float, validator=_finite)


@attrs.frozen
class PredictionRun:
    """How one ``kistexp simulate`` made the stored predictions: at full NIC rates or scaled down
    (``rates`` "fast"), on networks of ``relays`` relays each, NICs multiplied by
    ``nic_scale_min``..``nic_scale_max``."""

    made: dt.datetime = attrs.field(converter=_utc)
    rates: str = attrs.field(validator=attrs.validators.in_(("full", "fast")))
    population_scale: float
    relays: tuple[int, ...]
    nic_scale_min: float
    nic_scale_max: float
    duration_s: float
    wall_s: float
