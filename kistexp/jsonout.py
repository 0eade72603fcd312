"""JSON of kistexp's values: one cattrs converter for every ``--json`` document, the journal's judge
records, the held-consensus watch's lines and the fake authorities' operator API.

``to_json(obj)`` turns a value into plain JSON values (dicts, lists, str, numbers, bool, None). An attrs
class is written as an object of its fields, in their order, each as its type says:

* aware datetimes as ``YYYY-MM-DDTHH:MM:SSZ`` (kistexp's times are UTC), naive ones in ISO 8601;
* timedeltas as seconds; enums as their values;
* tuples, lists and sets as lists, mappings as objects;
* a field typed as pairs, ``tuple[tuple[K, V], ...]`` (a params line, a stage's values), as an object;
* floats as they are: NaN and infinities are written as ``NaN`` / ``Infinity`` by ``json.dumps``,
  unless the class says ``nan_as_null``.

A class whose JSON differs from its fields says how next to its definition, with ``@shape(...)``.
This module imports nothing of kistexp, so every layer can use it.
"""

from __future__ import annotations

import datetime as dt
import math
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from typing import Any, TypeVar

import cattrs
from cattrs.gen import make_dict_unstructure_fn, override

__all__ = ["OMIT", "converter", "shape", "time_text", "to_json"]

T = TypeVar("T")

#: A ``derived`` value that writes no key at all.
OMIT: Any = object()


def time_text(t: dt.datetime) -> str:
    """A datetime as kistexp writes one in JSON: ``YYYY-MM-DDTHH:MM:SSZ`` when aware, ISO 8601 when naive."""
    return t.strftime("%Y-%m-%dT%H:%M:%SZ") if t.tzinfo else t.isoformat()


def _is_pairs(t: Any) -> bool:
    """``tuple[tuple[K, V], ...]``: a tuple of (key, value) pairs."""
    args = typing.get_args(t)
    if typing.get_origin(t) is not tuple or len(args) != 2 or args[1] is not Ellipsis:
        return False
    inner = typing.get_args(args[0])
    return typing.get_origin(args[0]) is tuple and len(inner) == 2 and Ellipsis not in inner


converter = cattrs.Converter(unstruct_collection_overrides={
    Sequence: list, tuple: list, Set: list, frozenset: list, set: list, Mapping: dict})
converter.register_unstructure_hook(dt.datetime, time_text)
converter.register_unstructure_hook(dt.timedelta, lambda d: d.total_seconds())
converter.register_unstructure_hook_factory(
    _is_pairs, lambda _t: lambda pairs: {k: converter.unstructure(v) for k, v in pairs})


def to_json(obj: Any) -> Any:
    """``obj`` as plain JSON values (see the module docstring)."""
    return converter.unstructure(obj)


def _null_if_not_finite(out: dict) -> dict:
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in out.items()}


def shape(*, rename: Mapping[str, str] | None = None, omit: Iterable[str] = (),
          fields: Mapping[str, Callable[[Any], Any]] | None = None,
          derived: Mapping[str, Callable[[Any], Any]] | None = None, inline: Iterable[str] = (),
          order: Sequence[str] = (), nan_as_null: bool = False) -> Callable[[type[T]], type[T]]:
    """A class decorator: how the attrs class's JSON differs from its fields.

    ``rename``: attribute -> key. ``omit``: attributes not written. ``fields``: attribute -> function of
    its value giving what is written (a rounding, another time format). ``derived``: key -> function of
    the object, written after the fields (converted like a field; ``OMIT``: no key). ``inline``:
    attributes holding pairs or a mapping whose items are written as keys of the object itself (after
    the rest). ``order``: keys to write first, in this order (the others follow as they come).
    ``nan_as_null``: a NaN or infinite float in a key of this object is written as null."""
    rename, fields, derived = dict(rename or {}), dict(fields or {}), dict(derived or {})
    omit, inline, order = tuple(omit), tuple(inline), tuple(order)

    def register(cls: type[T]) -> type[T]:
        def factory(_t: Any) -> Callable[[T], dict]:
            overrides = {a: override(omit=True) for a in (*omit, *inline)}
            for a in set(rename) | set(fields):
                overrides[a] = override(rename=rename.get(a), unstruct_hook=fields.get(a))
            base = make_dict_unstructure_fn(cls, converter, **overrides)

            def unstructure(obj: T) -> dict:
                out = base(obj)
                for key, value_of in derived.items():
                    value = value_of(obj)
                    if value is not OMIT:
                        out[key] = converter.unstructure(value)
                for a in inline:
                    out.update((k, converter.unstructure(v)) for k, v in dict(getattr(obj, a)).items())
                if nan_as_null:
                    out = _null_if_not_finite(out)
                if order:
                    out = {**{k: out[k] for k in order if k in out}, **out}
                return out

            return unstructure

        converter.register_unstructure_hook_factory(lambda t: t is cls, factory)
        return cls

    return register
