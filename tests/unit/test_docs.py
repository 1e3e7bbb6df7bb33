"""The documentation holds together: every relative link and anchor resolves, nothing points
outside the repository, the README stays short, and the code's citations of a docs page name a
heading that page has."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([REPO / "README.md", REPO / "ARCHITECTURE.md", *(REPO / "docs").glob("*.md")])

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,}).*?^ {0,3}\1[`~]*[ \t]*$", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)", re.DOTALL)
_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _prose(text: str) -> str:
    """The text without fenced code blocks and code spans, where brackets are not links."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: link targets dropped, lowercase, punctuation other than
    hyphens and underscores removed, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@functools.cache
def _anchors(page: Path) -> set[str]:
    """Every heading's anchor; a repeated one gets GitHub's -1, -2, ... suffix."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in _HEADING.findall(_FENCE.sub("", page.read_text(encoding="utf-8"))):
        slug = _slug(heading)
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _headings(page: Path) -> list[str]:
    return _HEADING.findall(_FENCE.sub("", page.read_text(encoding="utf-8")))


def _broken_links(page: Path, root: Path = REPO) -> list[str]:
    """`page: target` for each relative link whose file or anchor does not exist under `root`."""
    broken = []
    for target in _LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if not target or _SCHEME.match(target):
            continue  # http(s):, mailto: and other URLs are not the repository's
        path, _, fragment = target.partition("#")
        linked = (page.parent / unquote(path)).resolve() if path else page
        if not linked.is_relative_to(root) or not linked.exists():
            broken.append(f"{page.relative_to(root)}: {target}")
        elif fragment and linked.suffix == ".md" and unquote(fragment) not in _anchors(linked):
            broken.append(f"{page.relative_to(root)}: {target} (no such heading)")
    return broken


def test_every_documentation_page_is_checked():
    names = [str(p.relative_to(REPO)) for p in PAGES]
    assert {"README.md", "ARCHITECTURE.md", "docs/README.md", "docs/orders-stream.md"} <= set(names)


def test_every_relative_link_reaches_a_file_and_a_heading_of_the_repository():
    assert [b for page in PAGES for b in _broken_links(page)] == []


def test_the_link_check_finds_what_is_broken(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# B\n\n## Exit codes\n\n## Exit codes\n")
    (tmp_path / "docs" / "a.md").write_text(
        "[ok](b.md#exit-codes) [again](b.md#exit-codes-1) [up](../docs/b.md) [web](https://x.org/y)\n"
        "[gone](c.md) [no heading](b.md#exit) [outside](../../etc/passwd) [self](#nowhere)\n"
        "`[code](d.md)`\n```\n[fenced](e.md)\n```\n"
    )
    assert _broken_links(tmp_path / "docs" / "a.md", root=tmp_path) == [
        "docs/a.md: c.md",
        "docs/a.md: b.md#exit (no such heading)",
        "docs/a.md: ../../etc/passwd",
        "docs/a.md: #nowhere (no such heading)",
    ]
    assert _slug("Jobs: Databricks-style multi-task `jobs` (2.1)") == (
        "jobs-databricks-style-multi-task-jobs-21"
    )


def test_the_readme_fits_on_a_screen_or_two():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250


def test_no_tracked_file_points_outside_the_repository():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True
    ).stdout
    outside = "../" + "shared/"  # spelled in two parts, so that this file does not hold it
    found = [
        name
        for name in listed.decode().split("\0")
        if name and (REPO / name).is_file() and outside.encode() in (REPO / name).read_bytes()
    ]
    assert found == []


def test_the_code_cites_headings_its_docs_pages_have():
    """A citation such as `docs/guarantees.md, 'A checkpoint is a cache'` in the code or the
    job specs names a page that exists and the start of one of its headings."""
    cited = re.compile(r"docs/([\w-]+\.md), [\"']([^\"']+)[\"']")
    sources = [
        *(REPO / "pipelines").rglob("*.py"),
        *(REPO / "conf").rglob("*.yaml"),
        *(REPO / "bronze").rglob("*.py"),
        *(REPO / "silver").rglob("*.py"),
        *(REPO / "gold").rglob("*.py"),
    ]
    citations = [
        (source.relative_to(REPO), page, heading)
        for source in sources
        for page, heading in cited.findall(
            re.sub(r"\n\s*#?\s*", " ", source.read_text(encoding="utf-8"))
        )
    ]
    assert citations, "the code cites no docs page: this test has lost its subject"
    wrong = [
        (str(source), page, heading)
        for source, page, heading in citations
        if not (REPO / "docs" / page).exists()
        or not any(h.startswith(heading) for h in _headings(REPO / "docs" / page))
    ]
    assert wrong == []
