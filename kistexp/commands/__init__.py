"""CLI command modules. Each module exposes `register(app)` adding its commands or
sub-apps to the root typer app. Modules do no heavy work at import, so `kistexp --help` stays fast."""

from __future__ import annotations

import importlib
import typing

import typer
import typer.core

from kistexp.asciinum import ascii_int
from kistexp.errors import KistexpError

# Order is the order of `kistexp --help`.
_MODULES = (
    "plan_cmds",
    "params_cmd",
    "consensus",
    "authorities",
    "authorities_live",
    "localnet",
    "sim",
    "fidelity",
    "metrics",
    "judge",
    "population",
    "simulate",
    "rollout",
    "report",
    "announce",
    "sweep",
)


def register_all(app: typer.Typer) -> None:
    for name in _MODULES:
        importlib.import_module(f"kistexp.commands.{name}").register(app)


class OptionValueError(KistexpError):
    """A command-line value kistexp refuses before typer converts it."""


def _takes_ints(annotation) -> bool:
    if annotation is int:
        return True
    args = typing.get_args(annotation)
    return bool(args) and all(a is int or a is type(None) for a in args) and int in args


def _guard_ints(param) -> None:
    """Check the raw text of an integer parameter: typer's conversion (pydantic's lax int) takes
    ``1_0``, `` 12``, ``12.0`` and other scripts' digits, none of which is a count, port or seed."""
    convert = param.process_value
    name = (getattr(param, "opts", None) or [param.name])[0]

    def process_value(ctx, value):
        for raw in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(raw, str) and ascii_int(raw) is None:
                raise OptionValueError(f"{name} {raw!r}: not a whole number (ASCII digits 0-9 with an optional "
                                       "sign; no '_', spaces, decimals or other scripts' digits)")
        return convert(ctx, value)

    param.process_value = process_value  # this parameter only: the command tree is the app's own


def guard_int_options(command) -> None:
    """Every integer option and argument under ``command`` refuses anything but ASCII digits."""
    for param in getattr(command, "params", ()):
        desc = getattr(param, "type_descriptor", None)
        if desc is not None and _takes_ints(desc.annotation):
            _guard_ints(param)
    for sub in getattr(command, "commands", {}).values():
        guard_int_options(sub)


class KistexpGroup(typer.core.TyperGroup):
    """The root command group: built once per invocation with every command under it, so the
    integer check reaches all of them, whichever module defines them."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        for sub in self.commands.values():
            guard_int_options(sub)


