"""Every SQL statement on a ``rollout_*`` table lives in the journal package (kistexp/rollout/journal/)
or in the schema (kistexp/store/schema.py): the rest of kistexp reads the journal through
``JournalReader`` and writes it through ``Journal`` (issue 32, deliverable 1).

The check reads the string literals of each module's syntax tree, so comments, docstrings and other
strings that are statements of their own (documentation: they cannot reach SQLite) are never
flagged. A literal is an offence when it is SQL on a rollout table, or a bare rollout table name (a
list of table names outside the journal only ever builds SQL elsewhere: ``f"DELETE FROM {table}"``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import kistexp

PACKAGE = Path(kistexp.__file__).parent
ALLOWED = (PACKAGE / "rollout" / "journal", PACKAGE / "store" / "schema.py")

TABLE = re.compile(r"\brollout_[a-z_]+")
BARE_TABLE = re.compile(r"\s*rollout_[a-z_]*\s*")  # a table name alone, or the prefix of one being built
# a statement that starts as SQL does, or a table named where SQL names one
STATEMENT = re.compile(r"^\s*(?:SELECT|INSERT|UPDATE|DELETE|REPLACE|PRAGMA|WITH|CREATE|DROP|ALTER)\b", re.IGNORECASE)
TABLE_CLAUSE = re.compile(r"\b(?:FROM|INTO|UPDATE|JOIN|TABLE|table_info\s*\()\s*rollout_[a-z_]+", re.IGNORECASE)


def _documentation(tree: ast.AST) -> set[int]:
    """ids of the string constants that are statements by themselves (docstrings included)."""
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, (ast.Constant, ast.JoinedStr))}


def _literals(tree: ast.AST):
    """(line, text) of each string literal that is not documentation; an f-string's text has ``{}``
    where its values go, and its constant parts are not looked at again on their own."""
    skip = _documentation(tree)
    parts: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts.update(id(v) for v in node.values)
            if id(node) not in skip:
                yield node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
                and id(node) not in parts):
            yield node.lineno, node.value


def offences(source: str, where: str = "<source>") -> list[str]:
    out = []
    for line, text in sorted(_literals(ast.parse(source, where))):
        sql = TABLE.search(text) and (STATEMENT.search(text) or TABLE_CLAUSE.search(text))
        if sql or BARE_TABLE.fullmatch(text):
            out.append(f"{where}:{line}: {' '.join(text.split())[:100]}")
    return out


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py")
                  if not any(p == a or a in p.parents for a in ALLOWED))


def test_no_sql_on_rollout_tables_outside_the_journal_and_the_schema():
    modules = _modules()
    assert len(modules) > 50 and PACKAGE / "rollout" / "exporter.py" in modules  # the scan sees the package
    found = [o for p in modules for o in offences(p.read_text(), str(p.relative_to(PACKAGE.parent)))]
    assert not found, ("SQL on rollout_* tables outside kistexp/rollout/journal/ (use JournalReader or Journal):\n"
                       + "\n".join(found))


def test_the_check_finds_sql_in_code_and_none_in_comments_or_documentation():
    flagged = '''
def f(conn, table, cols):
    conn.execute("SELECT value FROM rollout_meta WHERE key = 'cadence'")
    conn.execute(f"SELECT {', '.join(cols)} FROM rollout_verdicts WHERE id > ?")
    conn.execute("select count(*) " "from rollout_intents")
    conn.execute("DELETE FROM " + "rollout_status")
    conn.executemany("INSERT OR REPLACE INTO rollout_meta (key, value) VALUES (?, ?)", [])
    conn.execute("PRAGMA table_info(rollout_exposure)")
    for t in ("rollout_status", "rollout_decisions"):
        conn.execute(f"DELETE FROM {t}")
    return "rollout_" + table
'''
    found = offences(flagged)
    assert [int(o.split(":")[1]) for o in found] == [3, 4, 5, 6, 7, 8, 9, 9, 11], found
    clean = '''"""Reads rollout_meta: SELECT value FROM rollout_meta WHERE key = 'cadence'."""
# conn.execute("SELECT status FROM rollout_status ORDER BY id DESC LIMIT 1")
PREFIX = "kistexp_rollout"
NAME = "kistexp_rollout_up"


class Reader:
    """DELETE FROM rollout_intents happens in the journal only."""

    def f(self, db):
        """Each row of rollout_verdicts, in look order (ORDER BY window_end_us, id)."""
        "UPDATE rollout_owner SET heartbeat_us = ?: a statement of its own does nothing"
        return f"{db}: no rollout journal in this experiment; the rollout_ tables are empty"
'''
    assert offences(clean) == []


def test_the_journal_package_is_where_the_sql_is():
    journal = PACKAGE / "rollout" / "journal"
    assert offences((journal / "__init__.py").read_text()) and offences((journal / "reader.py").read_text())
