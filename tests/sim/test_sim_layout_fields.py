"""The simulator's field numbers (``kistexp/sim/layout.py``, the block between ``# -- begin field numbers``
and ``# -- end field numbers``) are written out one per line so that linters and editors see them; this
checks that the block is what renumbering it gives: each table's fields 0, 1, ... in the order written,
then the table's count ``N_*``.

After adding, removing or moving a field, renumber the block with

    .venv/bin/python tests/sim/test_sim_layout_fields.py --write
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

LAYOUT = Path(__file__).resolve().parents[2] / "kistexp" / "sim" / "layout.py"
BEGIN = "# -- begin field numbers\n"
END = "# -- end field numbers\n"
# a field (or, with N_, a table's count): only these lines of the block are renumbered
NUMBER = re.compile(r"^([A-Z][A-Z0-9_]*) = ([0-9]+)$")


def _split(text: str) -> tuple[str, str, str]:
    head, rest = text.split(BEGIN, 1)
    block, tail = rest.split(END, 1)
    return head, block, tail


def numbers(text: str) -> list[tuple[str, int]]:
    """The (name, value) of every field and count in the block, in order."""
    _, block, _ = _split(text)
    return [(m[1], int(m[2])) for m in map(NUMBER.match, block.splitlines()) if m]


def renumbered(text: str) -> str:
    """``text`` (layout.py) with the block's fields numbered from 0 per table and each count set to
    its table's number of fields; everything else unchanged."""
    head, block, tail = _split(text)
    out = []
    k = 0
    for line in block.splitlines(keepends=True):
        m = NUMBER.match(line.rstrip("\n"))
        if m:
            line = f"{m[1]} = {k}\n"
            k = 0 if m[1].startswith("N_") else k + 1
        out.append(line)
    if k:
        raise ValueError(f"layout.py: the last {k} fields of the field-number block have no N_* count after them")
    return head + BEGIN + "".join(out) + END + tail


def test_the_field_numbers_are_what_renumbering_gives():
    text = LAYOUT.read_text()
    assert renumbered(text) == text, ("layout.py's field numbers are out of order: run "
                                      "`.venv/bin/python tests/sim/test_sim_layout_fields.py --write`")


def test_each_field_is_named_once_and_the_module_keeps_its_number():
    from kistexp.sim import layout as L

    found = numbers(LAYOUT.read_text())
    names = [n for n, _ in found]
    assert len(found) > 250 and len(set(names)) == len(names)
    assert all(getattr(L, n) == v and type(getattr(L, n)) is int for n, v in found)  # nothing redefines one
    # the counts size the state's tables
    assert (L.N_G, L.N_CI, L.N_EV, L.N_NS) == (L.G_RUN_CHAN_CELLS + 1, L.CI_EQK_LAST + 1, L.E_C + 1,
                                                L.NS_PEAK_TOTAL + 1)


def test_renumbering_fixes_an_inserted_field():
    text = LAYOUT.read_text()
    edited = text.replace("G_END = 1\n", "G_END = 1\nG_NEW = 1\n", 1)
    fixed = dict(numbers(renumbered(edited)))
    assert fixed["G_NEW"] == 2 and fixed["G_EVN"] == 3 and fixed["N_G"] == dict(numbers(text))["N_G"] + 1
    assert fixed["P_CIRCWINDOW"] == 0  # the next table starts again from 0


if __name__ == "__main__":
    current = LAYOUT.read_text()
    wanted = renumbered(current)
    if "--write" in sys.argv[1:]:
        if wanted != current:
            LAYOUT.write_text(wanted)
        print(f"{LAYOUT}: field numbers {'renumbered' if wanted != current else 'already in order'}")
    else:
        print(f"{LAYOUT}: field numbers {'need renumbering (--write)' if wanted != current else 'in order'}")
        sys.exit(wanted != current)
