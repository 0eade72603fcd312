"""Shared output helpers for CLI commands: JSON for scripts, rich tables for people.

Everything a command prints to a terminal goes through this module, because much of what we print comes
from files and servers we do not control: plan owners and stage names, params keys in votes, file names,
server error messages. Such text is printed *as text*:

* never interpreted as rich markup (``[/red]`` in a plan's owner would raise MarkupError, ``[blink]`` would
  restyle the output) or as emoji codes (``:warning:``), and never re-highlighted;
* with control characters made visible as Python-style escapes (``ESC`` -> ``\\x1b``, ``BEL`` -> ``\\x07``,
  C1 controls such as ``\\x9b``, bidirectional overrides such as ``\\u202e``, lone surrogates from undecodable
  file names), so a document cannot retitle the terminal, move the cursor or hide text.

The API (stable; other command modules rely on it):

``visible(value) -> str``
    ``str(value)`` with every control/format character escaped. Use for any text built by hand
    (``kistexp.textsafe.visible``: the same rule for plain-text documents, figures, Markdown and CSV).
``plain(value, style=None) -> rich.text.Text``
    One piece of text, styled as a whole by *our* style (``"red"``, ``"bold"``), never by its content.
``say(*parts, style=None, err=False)``
    Print one line made of ``parts`` (str or ``plain(...)`` pieces) on stdout (or stderr).
``make_table(title=None, columns=(), **table_options) -> rich.table.Table``
    A table whose title and column headings are plain text; a column is a name or ``(name, options)``.
``add_row(table, *cells)``
    Add a row; each cell is plain text (str, number, None -> "", or a ``plain(...)`` piece).
``print_table(table, err=False)``
    Print a table built with the two functions above.
``error_line(message, prog="kistexp") -> str``
    The one-line ``prog: error: message`` the CLI prints on stderr (newlines inside become ``\\n``).
``emit_json(obj)``
    One JSON document on stdout (JSON escapes control characters itself).
``progress_bar(*columns, as_json=False, transient=True) -> rich.progress.Progress``
    The progress bar of long work, on stderr and only at a terminal; it never moves backwards, and
    its task descriptions are printed literally.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from rich.console import Console, ConsoleDimensions
from rich.markup import escape
from rich.progress import Progress, ProgressColumn, TaskID
from rich.table import Table
from rich.text import Text

# the one implementation of terminal-safe text (kistexp/textsafe.py); re-exported as part of this API
from kistexp.textsafe import visible

#: The width of piped output when $COLUMNS does not give one: people read it in pagers and CI logs, so
#: tables are not squeezed into 80 columns and lines are not wrapped.
PIPED_WIDTH = 200
# a date and time written with a space ("2027-03-01 12:00", "03-01 12:00") is one word when lines wrap
_DATE_TIME = re.compile(r"\b(?:\d{4}-)?\d{2}-\d{2} \d{2}:\d{2}(?::\d{2})?\b")


def _env_columns(environ: Mapping[str, str]) -> int | None:
    columns = environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else None


class _Console(Console):
    """A console laid out for the terminal's width or, piped, for $COLUMNS (read when printing, so
    ``COLUMNS=80 kistexp ... | less`` fits 80 columns), else for PIPED_WIDTH."""

    @property
    def size(self) -> ConsoleDimensions:
        dims = super().size
        if self.is_terminal:
            return dims
        return ConsoleDimensions(_env_columns(self._environ) or PIPED_WIDTH, dims.height)

    @size.setter
    def size(self, new_dimensions: tuple[int, int]) -> None:
        Console.size.fset(self, new_dimensions)  # type: ignore[attr-defined]

    def wrap_width(self) -> int | None:
        """The width to wrap lines at: the terminal's or $COLUMNS; None for piped output without $COLUMNS."""
        if self.is_terminal or _env_columns(self._environ):
            return self.size.width
        return None


console = _Console()
err_console = Console(stderr=True)


def plain(value: object, style: str | None = None) -> Text:
    """A piece of text printed literally (markup, emoji codes and control characters neutralised)."""
    if isinstance(value, Text):
        return value
    return Text(visible("" if value is None else value), style=style or "")


def _line(parts: Iterable[object], style: str | None) -> Text:
    line = Text(style=style or "")
    for part in parts:
        line.append_text(plain(part))
    return line


def wrap_offsets(text: str, width: int, indent: int = 0) -> list[int]:
    """Where to break ``text`` into lines of at most ``width`` cells, at spaces (a date and time count
    as one word); lines after the first are meant to be printed after ``indent`` spaces. A word
    longer than a line is cut."""
    protected = [m.span() for m in _DATE_TIME.finditer(text)]
    words = []  # (start, end) of each word, a protected date-time kept whole
    for m in re.finditer(r"\S+", text):
        start, end = m.span()
        if words and any(a <= words[-1][0] < b and start < b for a, b in protected):
            words[-1] = (words[-1][0], end)
        else:
            words.append((start, end))
    breaks: list[int] = []
    line_start, room = 0, width
    for start, end in words:
        if end - line_start <= room or start == line_start:
            pass
        else:
            breaks.append(start)
            line_start, room = start, width - indent
        while end - line_start > room:  # one word longer than a line: cut it
            line_start += room
            breaks.append(line_start)
            room = width - indent
    return breaks


def say(*parts: object, style: str | None = None, err: bool = False, indent: int = 4) -> None:
    """Print one line made of ``parts`` literally. At a terminal, or piped with $COLUMNS set, a long line is
    wrapped at spaces (dates with their times kept whole) with ``indent`` spaces before its continuation
    lines; piped without $COLUMNS it stays one line (pagers fold it)."""
    target = err_console if err else console
    line = _line(parts, style)
    width = target.wrap_width() if isinstance(target, _Console) else (target.width if target.is_terminal else None)
    if width is None or len(line.plain) <= width:
        target.print(line, soft_wrap=True)
        return
    indent = min(indent, width // 4)
    pieces = line.divide(wrap_offsets(line.plain, width, indent))
    for i, piece in enumerate(pieces):
        piece.rstrip()
        if i:
            piece = Text(" " * indent, style=style or "").append_text(piece)
        target.print(piece, soft_wrap=True)


def make_table(title: object = None, columns: Iterable[object] = (), **options: Any) -> Table:
    """A rich Table whose title and headings are plain text. A column is ``name`` or ``(name, {options})``."""
    table = Table(title=None if title is None else plain(title), **options)
    for column in columns:
        name, col_options = column if isinstance(column, tuple) else (column, {})
        table.add_column(plain(name), **col_options)
    return table


def add_row(table: Table, *cells: object) -> None:
    """Add a row of plain-text cells (a ``plain(value, style)`` cell keeps its style)."""
    table.add_row(*(plain(cell) for cell in cells))


def print_table(table: Table, err: bool = False) -> None:
    (err_console if err else console).print(table)


def error_line(message: object, prog: str = "kistexp") -> str:
    """``prog: error: message`` on one line, safe for a terminal."""
    return f"{prog}: error: {visible(message)}"


def _default(obj: Any) -> Any:
    # datetimes and attrs objects are the common non-JSON values we emit (a value with a shape of its
    # own is converted before: kistexp.jsonout.to_json)
    import datetime as _dt

    import attrs

    from kistexp.jsonout import time_text

    if isinstance(obj, _dt.datetime):
        return time_text(obj)
    if isinstance(obj, _dt.timedelta):
        return obj.total_seconds()
    if attrs.has(type(obj)):
        return attrs.asdict(obj, recurse=True)
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def emit_json(obj: Any) -> None:
    """Print one JSON document on stdout."""
    sys.stdout.write(json.dumps(obj, default=_default, indent=2, sort_keys=False) + "\n")


def _description(text: object) -> str:
    # rich's TextColumn reads a task's description as markup: a sweep, file or stage name in it is
    # escaped for that, and its control characters made visible
    return escape(visible(text))


class _ForwardProgress(Progress):
    """A Progress whose ``update(completed=...)`` never moves a bar back (``reset`` still can), and whose
    task descriptions are printed literally."""

    def add_task(self, description: str, *args: Any, **kwargs: Any) -> TaskID:
        return super().add_task(_description(description), *args, **kwargs)

    def update(self, task_id: Any, *, completed: float | None = None, description: str | None = None,
               **kwargs: Any) -> None:
        if completed is not None:
            shown = next((t.completed for t in self.tasks if t.id == task_id), None)
            if shown is not None and completed < shown:
                completed = shown
        if description is not None:
            description = _description(description)
        super().update(task_id, completed=completed, description=description, **kwargs)


def progress_bar(*columns: str | ProgressColumn, as_json: bool = False, transient: bool = True) -> Progress:
    """The bar of a long command, on stderr, drawn only for a person at a terminal: with ``--json``
    or a piped stderr it draws nothing, so a script's stdout stays one document and its stderr holds
    nothing but a one-line error (a transient bar that never drew still ends with a blank line).
    The bar only moves forward: a ``completed`` below the one shown keeps the one shown."""
    return _ForwardProgress(*columns, console=err_console, transient=transient,
                            disable=as_json or not err_console.is_terminal)
