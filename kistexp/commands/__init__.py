"""CLI command modules. Each module exposes `register(app)` adding its commands or
sub-apps to the root typer app. Modules do no heavy work at import, so `kistexp --help` stays fast."""

from __future__ import annotations

import datetime
import enum
import importlib
import typing
from pathlib import Path

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


_PLAIN_NAMES = {str: "TEXT", int: "INTEGER", float: "FLOAT", bool: "BOOLEAN", Path: "PATH",
                datetime.datetime: "DATETIME"}
_PATH_NAMES = {"file": "FILE", "dir": "DIRECTORY", "path": "PATH"}


def _plain_name(annotation) -> str:
    """Click's name for a value type (TEXT, INTEGER, PATH), never a Python type's repr."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin in (list, tuple) and args:
        return " ".join(_plain_name(a) for a in args if a is not Ellipsis)
    if origin is not None and len(args) == 1:  # Optional[X], Annotated[X, ...]
        return _plain_name(args[0])
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "[" + "|".join(str(m.value) for m in annotation) + "]"
    if annotation in _PLAIN_NAMES:
        return _PLAIN_NAMES[annotation]
    return getattr(annotation, "__name__", "VALUE").upper()


def plain_metavar(param) -> str | None:
    """What the help shows after an option or argument: the metavar given, else TEXT, INTEGER, FLOAT,
    PATH, ``[a|b]`` for choices, INTEGER RANGE for bounded numbers; nothing for a flag. Typer (0.2x)
    shows ``<str>``, ``<bool>``, ``<list[str]>`` instead, which reads as Python, not as a command line."""
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return None
    if param.metavar is not None and isinstance(param, typer.core.TyperOption):
        return param.metavar
    desc = param.type_descriptor
    if desc.is_choice:
        return "[" + "|".join(str(getattr(c, "value", c)) for c in desc.choices) + "]"
    if desc.is_path:
        return _PATH_NAMES.get(desc.path_type, "PATH")
    name = _plain_name(desc.annotation)
    return f"{name} RANGE" if desc.is_ranged else name


def plain_metavars(command) -> None:
    """Every option and argument under ``command`` shows a plain metavar in ``--help``."""
    for param in getattr(command, "params", ()):
        if getattr(param, "type_descriptor", None) is None:
            continue  # a typer that builds click parameter types already shows click's names
        shown = plain_metavar(param)
        if getattr(param, "nargs", 1) != 1 and shown is not None and isinstance(param, typer.core.TyperOption):
            shown += "..."
        param.display_type_rich = lambda ctx, shown=shown: shown  # this parameter only
    if hasattr(command, "get_help_option") and not getattr(command, "_kistexp_plain_help", False):
        command.get_help_option = _flag_help_option(command.get_help_option)
        command._kistexp_plain_help = True
    for sub in getattr(command, "commands", {}).values():
        plain_metavars(sub)


def _flag_help_option(get_help_option):
    """``--help`` is a flag too: click makes it on demand, outside the command's parameters."""

    def wrapped(ctx):
        option = get_help_option(ctx)
        if option is not None:
            option.display_type_rich = lambda ctx: None
        return option

    return wrapped


class KistexpGroup(typer.core.TyperGroup):
    """The root command group: built once per invocation with every command under it, so the
    integer check and the plain help metavars reach all of them, whichever module defines them."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        for sub in self.commands.values():
            guard_int_options(sub)
        plain_metavars(self)


