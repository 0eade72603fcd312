"""CLI command modules. Each module exposes `register(app)` adding its commands or
sub-apps to the root typer app; modules are imported lazily-safe (no heavy work at import)."""

from __future__ import annotations

import importlib

import typer

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
)


def register_all(app: typer.Typer) -> None:
    for name in _MODULES:
        try:
            module = importlib.import_module(f"kistexp.commands.{name}")
        except ModuleNotFoundError as exc:
            # A command module not written yet is simply absent from the CLI.
            if exc.name == f"kistexp.commands.{name}":
                continue
            raise
        module.register(app)
