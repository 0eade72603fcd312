"""The documentation's checkable parts: every relative link in README.md and docs/*.md reaches a file (and
its ``#anchor`` a heading, by GitHub's slugs), and revert-default means one thing everywhere."""

from __future__ import annotations

import re
import types
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# [text](target) or [text](target "title"); images too. Not inside code spans or fenced blocks (see _prose).
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^[ \t]{0,3}\[[^\]]+\]:\s+<?(\S+?)>?(?:\s.*)?$", re.M)
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose(text: str, code_spans: bool = False) -> str:
    """The text with fenced code blocks blanked and, unless ``code_spans``, inline code spans removed (links
    there are not links; a heading's code span is part of its anchor)."""
    out, fence = [], None
    for line in text.splitlines():
        m = re.match(r"^\s{0,3}(`{3,}|~{3,})", line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
            out.append("")
            continue
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            out.append("")
            continue
        out.append(line if code_spans else re.sub(r"(`+)(?:(?!\1).)+?\1", "", line))
    return "\n".join(out)


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation other than '-' and '_' removed,
    each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in ``path``; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(path.read_text(encoding="utf-8"), code_spans=True).splitlines():
        m = HEADING.match(line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    out |= set(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", path.read_text(encoding="utf-8")))
    return out


def relative_links(path: Path) -> list[tuple[int, str]]:
    prose = _prose(path.read_text(encoding="utf-8"))
    found = []
    for lineno, line in enumerate(prose.splitlines(), 1):
        found += [(lineno, m.group(1)) for m in LINK.finditer(line)]
    found += [(prose[:m.start()].count("\n") + 1, m.group(1)) for m in REFERENCE.finditer(prose)]
    return [(n, t) for n, t in found if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I)]  # http:, mailto: ...


def broken_links(path: Path) -> list[str]:
    problems = []
    for lineno, target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        dest = path if not file_part else (path.parent / unquote(file_part)).resolve()
        where = f"{path.relative_to(REPO)}:{lineno}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and unquote(anchor).lower() not in anchors(dest):
            problems.append(f"{where}: no heading #{anchor} in {dest.relative_to(REPO)}")
    return problems


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(path):
    assert broken_links(path) == []


def test_the_checker_finds_broken_links_and_anchors(tmp_path, monkeypatch):
    monkeypatch.setattr(__import__(__name__), "REPO", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# The `b` page: one, two!\n\n## Same\n\n## Same\n")
    a = tmp_path / "docs" / "a.md"
    a.write_text("[ok](b.md) [ok](b.md#the-b-page-one-two) [ok](b.md#same-1) [ok](#top) [web](https://x.org/y)\n"
                 "# Top\n"
                 "[gone](missing.md) [bad](b.md#nowhere) [bad2](b.md#same-2) `[code](nothere.md)`\n"
                 "```\n[fenced](nothere.md)\n```\n"
                 "[ref]: ../docs/absent.md\n")
    assert broken_links(a) == [
        "docs/a.md:3: missing.md: no such file",
        "docs/a.md:3: b.md#nowhere: no heading #nowhere in docs/b.md",
        "docs/a.md:3: b.md#same-2: no heading #same-2 in docs/b.md",
        "docs/a.md:7: ../docs/absent.md: no such file",
    ]


@pytest.mark.parametrize(("heading", "slug"), [
    ("Rollback kinds", "rollback-kinds"),
    ("`kistexp judge compare` on OnionPerf data", "kistexp-judge-compare-on-onionperf-data"),
    ("What's new? (2024-01, v0.4.8)", "whats-new-2024-01-v048"),
    ("A [link](x.md) in it", "a-link-in-it"),
    ("snake_case & more", "snake_case--more"),
])
def test_github_slugs(heading, slug):
    assert github_slug(heading) == slug


def test_revert_default_means_the_baselines_values_everywhere():
    """The engine's revert-default votes the baseline's values and removes a key the baseline leaves unset;
    every definition of it in the documentation says so, and none calls it tor's default."""
    from kistexp.plan.model import UNSET
    from kistexp.rollout.rollback import target_values
    from kistexp.rollout.state import REVERT_DEFAULT

    spec = types.SimpleNamespace(kind="staged", parameters=("KISTSchedRunInterval", "KISTSockBufSizeFactor"),
                                 baseline_values=(("KISTSchedRunInterval", 10),))
    assert target_values(spec, REVERT_DEFAULT, (("KISTSchedRunInterval", 2), ("KISTSockBufSizeFactor", 3)), 2) == (
        ("KISTSchedRunInterval", 10), ("KISTSockBufSizeFactor", UNSET))
    definitions = []
    for path in DOCS:
        for line in path.read_text(encoding="utf-8").splitlines():
            if "revert-default" in line:
                assert not re.search(r"tor'?s default for|stated versions", line), f"{path.name}: {line}"
            if re.match(r"\|\s*`revert-default`\s*\|", line):
                definitions.append(line)
    assert len(definitions) >= 2
    for line in definitions:
        assert "baseline's values" in line and "unset is removed" in line, line
