"""`kistexp params [NAME]`: the consensus-parameter catalogue."""

from __future__ import annotations

import typer

from kistexp import params as tor_params
from kistexp.errors import KistexpError
from kistexp.output import add_row, emit_json, make_table, plain, print_table, say


def _bounds_dict(b: tor_params.Bounds) -> dict:
    return {"default": b.default, "min": b.minimum, "max": b.maximum, "tor_versions": str(b.versions),
            "note": b.note}


def _param_dict(p: tor_params.ConsensusParam) -> dict:
    return {"name": p.name, "unit": p.unit, "meaning": p.meaning, "category": p.category,
            "read_by": p.read_by, "torrc_override": p.torrc_override, "source": p.source,
            "bounds": [_bounds_dict(b) for b in p.bounds]}


def params(
    name: str = typer.Argument(None, help="Show one parameter (case-sensitive, as tor matches it)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """List the consensus parameters kistexp knows, or show one."""
    if name is not None:
        entry = tor_params.get(name)
        if entry is None:
            close = tor_params.suggest(name)
            hint = f"; did you mean {close}?" if close else ""
            raise KistexpError(f"unknown consensus parameter {name!r}{hint}")
        if as_json:
            emit_json(_param_dict(entry))
            return
        say(plain(entry.name, "bold"), f" ({entry.unit}) - {entry.meaning}")
        say(f"  category: {entry.category}; read by: {entry.read_by}")
        for b in entry.bounds:
            note = f"  ({b.note})" if b.note else ""
            say(f"  tor {b.versions}: default {b.default}, min {b.minimum}, max {b.maximum}{note}")
        if entry.torrc_override:
            say(f"  override: {entry.torrc_override}")
        say(f"  source: {entry.source}")
        return
    if as_json:
        emit_json([_param_dict(p) for p in tor_params.CATALOGUE])
        return
    table = make_table("Consensus parameters", [
        (col, {"overflow": "fold"}) for col in ("name", "default", "min", "max", "unit", "tor versions", "meaning")],
        show_lines=False)
    for p in tor_params.CATALOGUE:
        for i, b in enumerate(p.bounds):
            add_row(table, p.name if i == 0 else "", str(b.default), str(b.minimum), str(b.maximum),
                          p.unit if i == 0 else "", str(b.versions), p.meaning if i == 0 else "")
    print_table(table)


def register(app: typer.Typer) -> None:
    app.command("params")(params)
