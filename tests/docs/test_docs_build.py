"""The documentation builds strictly, and every relative link of the README and the guide resolves.

``mkdocs build --strict`` fails on a broken link or anchor between pages, a page missing from
the nav and a docstring or ``:::`` reference the API pages cannot resolve (a renamed API). The
README is not part of the site, so its links are checked here, with GitHub's heading anchors;
the guide's links are checked the same way with the anchors mkdocs makes, to fail fast without
the build.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from conftest import REPO

ROOT = REPO
DOCS = ROOT / "docs"
README_MAX_LINES = 250  # the front page; the rest belongs in docs/
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, inline code removed."""
    out, fence = [], None
    for n, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^\s*(`{3,}|~{3,})", line)
        if m and (fence is None or m.group(1).startswith(fence)):
            fence = None if fence else m.group(1)
            continue
        if fence is None:
            out.append((n, re.sub(r"`+[^`]*`+", "", line)))
    return out


def heading_texts(text: str) -> list[str]:
    """The text of every ATX heading, as rendered (code spans kept, markup and link targets dropped)."""
    out, fence = [], None
    for line in text.splitlines():
        m = re.match(r"^\s*(`{3,}|~{3,})", line)
        if m and (fence is None or m.group(1).startswith(fence)):
            fence = None if fence else m.group(1)
            continue
        h = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line) if fence is None else None
        if h:
            heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", h.group(1))
            out.append(heading.replace("`", "").replace("*", ""))
    return out


def github_slug(text: str) -> str:
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def mkdocs_slug(text: str) -> str:  # Python-Markdown's toc.slugify, which mkdocs uses
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


def anchors(page: Path, slug) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in heading_texts(page.read_text()):
        s = slug(heading)
        out.add(s if s not in seen else f"{s}-{seen[s]}" if slug is github_slug else f"{s}_{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def broken_links(page: Path, slug) -> list[str]:
    problems = []
    for n, line in prose_lines(page.read_text()):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][\w+.-]*:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            where = f"{rel(page)}:{n}: {target}"
            if not file.exists():
                problems.append(f"{where}: no such file")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file, slug):
                problems.append(f"{where}: {rel(file)} has no heading with anchor #{anchor}")
    return problems


def test_readme_links_resolve():
    assert broken_links(ROOT / "README.md", github_slug) == []


def test_guide_links_resolve():
    problems = [p for page in sorted(DOCS.glob("**/*.md")) for p in broken_links(page, mkdocs_slug)]
    assert problems == []


def test_the_link_checker_sees_a_broken_link_and_anchor(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A `code` heading\n\n[ok](#a-code-heading) [bad](#nope) [gone](missing.md)\n")
    assert len(broken_links(page, github_slug)) == 2


def test_readme_stays_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move the details to docs/"


def test_the_citation_is_the_same_on_the_front_page_and_the_site():
    def bibtex(page: Path) -> str:
        found = re.findall(r"```bibtex\n(.*?)```", page.read_text(), re.S)
        assert len(found) == 1, f"{page.name}: expected one bibtex block"
        return found[0]

    assert bibtex(ROOT / "README.md") == bibtex(DOCS / "index.md")


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="building the docs needs the docs extra: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings", reason="the API pages need the docs extra: pip install -e '.[docs]'")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    site = tmp_path / "site"
    # No --quiet: it drops warnings before strict mode counts them, so a page missing from the nav
    # (a warning) would pass.
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    # every line but mkdocs' INFO ones: a warning's own lines (the pages it names) included
    messages = "\n".join(line for line in (result.stdout + result.stderr).splitlines() if "INFO" not in line)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{messages or result.stderr[-3000:]}"
    assert (site / "api" / "skips" / "index.html").is_file()


def test_every_top_level_name_is_on_the_api_page():
    tree = ast.parse((ROOT / "src" / "scalelong" / "__init__.py").read_text())
    names = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets)
    )
    page = (DOCS / "api" / "scalelong.md").read_text()
    assert [n for n in names if f"`{n}`" not in page] == []
