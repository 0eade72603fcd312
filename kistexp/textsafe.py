"""Text from plans, input files and servers, made safe for the place kistexp writes it to.

Plan, stage and sweep names, notes, owners, contacts, criterion names, class-mix names, labels,
operator user names, file names and whatever an imported file or a server sends are free text. Written
as they are, some of them would act instead of being read: an escape sequence retitles the terminal or
hides a line, a pipe adds a column to a Markdown table, ``<script>`` is live HTML in a rendered
announcement, ``=HYPERLINK(...)`` runs as a formula in the spreadsheet that opens a CSV. Every writer of
such text passes it through one function here, chosen by where it goes:

``visible(value, keep="") -> str``
    Terminals, plain-text documents and figure labels: every control, format and separator character
    (C0, DEL, C1, bidi overrides such as U+202E, zero-width characters, U+2028, lone surrogates) as a
    Python-style escape (``\\x1b``, ``\\u202e``); characters in ``keep`` (e.g. ``"\\n"``) are left as they are.
``one_line(value) -> str``
    ``visible`` on one line: runs of white space, line breaks included, become one space.
``markdown(value) -> str``
    Inline Markdown text and table cells: one line, ``&`` and ``<`` as HTML entities (no live HTML, no
    autolink, no entity), the characters Markdown acts on (``\\ ` * _ [ ] | ~``, and a list, heading or
    quote marker at the start) backslash-escaped, so a table row keeps its columns.
``csv_cell(value)``
    A CSV or Parquet cell: text starting with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return
    gets a leading ``'`` (OWASP's advice against CSV injection) unless it is a plain decimal number;
    numbers and every other value are returned unchanged.
``csv_row(row)``
    ``csv_cell`` over a mapping's values (a row for ``csv.DictWriter``) or over a sequence.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

# Unicode categories that do not draw a glyph and can change what a terminal does or shows: controls
# (C0, DEL, C1), format characters (bidi overrides, zero-width), line/paragraph separators, surrogates
# (undecodable bytes in file names), private use and unassigned code points.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_escape_cache: dict[str, str] = {}


def _escape(ch: str) -> str:
    if ch in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[ch]
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def visible(value: object, keep: str = "") -> str:
    """``str(value)`` with every control, format and separator character (but those in ``keep``)
    replaced by its escape."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():
        return text  # the common case (isprintable is False for every hidden category above)
    out = []
    for ch in text:
        if ch in keep:
            out.append(ch)
            continue
        escaped = _escape_cache.get(ch)
        if escaped is None:
            escaped = _escape(ch) if unicodedata.category(ch) in _HIDDEN_CATEGORIES else ch
            if len(_escape_cache) < 4096:
                _escape_cache[ch] = escaped
        out.append(escaped)
    return "".join(out)


def one_line(value: object) -> str:
    """``visible(value)`` with white space runs (newlines, tabs, U+2028, ...) collapsed into one space
    and none at the ends: a name or note inside a sentence, a table cell or a heading."""
    text = value if isinstance(value, str) else str(value)
    return visible(" ".join(text.split()))


# What Markdown (CommonMark and GitHub's tables) acts on anywhere in a line. "&" and "<" become entities,
# which every Markdown dialect leaves alone (Markdown.pl passes "\\<script>" through as HTML); a ">"
# that opens no tag stays readable ("exit >100 Mbit/s").
_MD_INLINE = frozenset("\\`*_[]|~")
_MD_ENTITIES = {"&": "&amp;", "<": "&lt;"}
# At the start of a line: a heading, list item, setext underline or thematic break, quote, or an ordered list.
_MD_LEADING = frozenset("#-+=>")
_MD_ORDERED = re.compile(r"(\d{1,9})([.)])")


def markdown(value: object) -> str:
    """Text shown literally by a Markdown renderer, on one line, safe inside a table cell."""
    text = one_line(value)
    out = []
    for ch in text:
        if ch in _MD_ENTITIES:
            out.append(_MD_ENTITIES[ch])
        elif ch in _MD_INLINE:
            out.append("\\" + ch)
        else:
            out.append(ch)
    escaped = "".join(out)
    # the value may start a line (a signature, a list): it must not become a block marker there
    if escaped[:1] in _MD_LEADING:
        return "\\" + escaped
    ordered = _MD_ORDERED.match(escaped)
    if ordered:
        return f"{ordered.group(1)}\\{escaped[ordered.end(1):]}"
    return escaped


# OWASP's list: a spreadsheet treats a cell starting with one of these as a formula (tab and CR as well,
# since some applications strip them and then read the formula behind).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# A number written as text ("-1.5", "+2e-3") stays a number: its sign starts no formula.
_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?\Z")


def csv_cell(value: Any) -> Any:
    """``value``, with text a spreadsheet would run as a formula prefixed by ``'`` (numbers unchanged)."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS) and not _DECIMAL.match(value):
        return "'" + value
    return value


def csv_row(row: Mapping[str, Any] | Sequence[Any]) -> Any:
    """``csv_cell`` over every value of a row: a dict for ``csv.DictWriter`` or a list for ``csv.writer``."""
    if isinstance(row, Mapping):
        return {key: csv_cell(value) for key, value in row.items()}
    return [csv_cell(value) for value in row]
