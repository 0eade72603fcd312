"""The kistexp command line. Thin: each command lives in kistexp/commands/ and only
parses arguments, calls the library and prints."""

from __future__ import annotations

import sys

import typer

from kistexp.commands import KistexpGroup, register_all
from kistexp.errors import KistexpError
from kistexp.output import error_line

app = typer.Typer(
    name="kistexp",
    help="Plan, rehearse, run and roll back Tor consensus-parameter experiments.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=KistexpGroup,  # integer options take ASCII digits only (kistexp/commands/__init__.py)
)
register_all(app)


def main() -> None:
    try:
        app()
    except KistexpError as exc:
        print(error_line(exc), file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("kistexp: interrupted", file=sys.stderr)
        sys.exit(130)
