"""CLI command modules. Each module exposes `register(app)` adding its commands or
sub-apps to the root typer app. Modules do no heavy work at import, so `kistexp --help` stays fast."""

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
