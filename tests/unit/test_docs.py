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


def _tracked(*pathspecs: str, root: Path = REPO) -> list[Path] | None:
    """The tracked files that match `pathspecs`, or None outside a git checkout."""
    if shutil.which("git") is None or not (root / ".git").exists():
        return None
    listed = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--", *pathspecs],
        capture_output=True,
        check=True,
    ).stdout
    return sorted(root / name for name in listed.decode().split("\0") if (root / name).is_file())


# every tracked markdown page; outside a git checkout, those not under a hidden folder
PAGES = _tracked("*.md") or sorted(
    p for p in REPO.rglob("*.md") if not any(s.startswith(".") for s in p.relative_to(REPO).parts)
)

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,}).*?^ {0,3}\1[`~]*[ \t]*$", re.MULTILINE | re.DOTALL)
# a code span ends in its own paragraph: a stray backtick must not hide the links after it
_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(?:(?!\n[ \t]*\n).)+?(?<!`)\1(?!`)", re.DOTALL)
_TITLE = r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?"
# [text](target "title"), [text](<target with spaces>)
_LINK = re.compile(r"\[[^\]]*\]\(\s*(?:<([^>\n]*)>|([^\s<)][^\s)]*)?)" + _TITLE + r"\s*\)")
# [label]: target, [label]: <target> (not a footnote, [^1]: ...)
_DEFINITION = re.compile(
    r"^ {0,3}\[(?!\^)[^\]]+\]:[ \t]*\n?[ \t]*(?:<([^>\n]*)>|([^\s<]\S*))", re.MULTILINE
)
_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
# _emphasis_ and __strong__ by underscores: not within a word (snake_case stays as it is)
_UNDERSCORES = re.compile(r"(?<![\w\\])(_+)(?=[^\s_])(.+?)(?<=[^\s\\_])\1(?!\w)")


def _prose(text: str) -> str:
    """The text without fenced code blocks and code spans, where brackets are not links."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def _targets(text: str) -> list[str]:
    """The target of each inline link and each reference definition, in the text's order."""
    prose = _prose(text)
    found = sorted([*_LINK.finditer(prose), *_DEFINITION.finditer(prose)], key=lambda m: m.start())
    return [m.group(1) if m.group(1) is not None else m.group(2) or "" for m in found]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text as rendered (link targets dropped, emphasis marks
    removed, code spans kept as written), lowercase, punctuation other than hyphens and
    underscores removed, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    spans: list[str] = []

    def keep(m: re.Match) -> str:  # a code span's underscores are text, not emphasis
        spans.append(m.group())
        return f"\ue000{len(spans) - 1}\ue001"

    text = _CODE_SPAN.sub(keep, text)
    while (plain := _UNDERSCORES.sub(r"\2", text)) != text:  # nested emphasis: a pass each
        text = plain
    text = re.sub("\ue000(\\d+)\ue001", lambda m: spans[int(m.group(1))], text).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")  # `*` goes with the punctuation


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
    for target in _targets(page.read_text(encoding="utf-8")):
        if not target or _SCHEME.match(target):
            continue  # http(s):, mailto: and other URLs are not the repository's
        path, _, fragment = target.partition("#")
        linked = (page.parent / unquote(path)).resolve() if path else page
        if not linked.is_relative_to(root) or not linked.exists():
            broken.append(f"{page.relative_to(root)}: {target}")
        elif fragment and linked.suffix == ".md" and unquote(fragment) not in _anchors(linked):
            broken.append(f"{page.relative_to(root)}: {target} (no such heading)")
    return broken


# paths of a document outside the repository, spelled in parts so that this file does not hold them
OUTSIDE = ("../" + "shared/", "/" + "shared/spec/")


def _points_outside(content: bytes) -> bool:
    return any(path.encode() in content for path in OUTSIDE)


CITATION = re.compile(r"docs/([\w-]+\.md), [\"']([^\"']+)[\"']")
CITING = ("pipelines", "conf", "bronze", "silver", "gold", "scripts", "bench", "tests", ".ci")


def _citations(source: Path) -> list[tuple[str, str]]:
    """(page, heading) of each citation in `source`, a comment's lines joined."""
    text = re.sub(r"\n\s*#?\s*", " ", source.read_bytes().decode("utf-8", "replace"))
    return CITATION.findall(text)


def _wrong_citations(source: Path, root: Path = REPO) -> list[tuple[str, str, str]]:
    """Each citation in `source` whose page or heading start does not exist under `root`."""
    return [
        (str(source.relative_to(root)), page, heading)
        for page, heading in _citations(source)
        if not (root / "docs" / page).exists()
        or not any(h.startswith(heading) for h in _headings(root / "docs" / page))
    ]


def test_every_documentation_page_is_checked():
    names = {str(p.relative_to(REPO)) for p in PAGES}
    assert {"README.md", "ARCHITECTURE.md", "docs/README.md", "docs/orders-stream.md"} <= names
    tracked = _tracked("*.md")
    assert tracked is None or names == {str(p.relative_to(REPO)) for p in tracked}


def test_every_relative_link_reaches_a_file_and_a_heading_of_the_repository():
    assert [b for page in PAGES for b in _broken_links(page)] == []


def test_the_link_check_finds_what_is_broken(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text(
        "# B\n\n## Exit codes\n\n## Exit codes\n\n## _Italic_ part\n\n## max_offsets_per_trigger\n"
    )
    (tmp_path / "docs" / "a.md").write_text(
        "[ok](b.md#exit-codes) [again](b.md#exit-codes-1) [up](../docs/b.md) [web](https://x.org/y)\n"
        "[gone](c.md) [no heading](b.md#exit) [outside](../../etc/passwd) [self](#nowhere)\n"
        '[titled](b.md "B") [angled](<b.md#exit-codes>) [spaced](<b b.md>)\n'
        "[em](b.md#italic-part) [snake](b.md#max_offsets_per_trigger) [marks](b.md#_italic_-part)\n"
        "`[code](d.md)`\n```\n[fenced](e.md)\n```\n"
        "\nA stray ` backtick.\n\n[after the stray one](f.md)\n\nA ` later.\n\n"
        "[ref]: b.md#exit-codes\n[gone ref]: g.md\n[angled ref]: <h i.md>\n[^1]: a footnote\n"
    )
    assert _broken_links(tmp_path / "docs" / "a.md", root=tmp_path) == [
        "docs/a.md: c.md",
        "docs/a.md: b.md#exit (no such heading)",
        "docs/a.md: ../../etc/passwd",
        "docs/a.md: #nowhere (no such heading)",
        "docs/a.md: b b.md",
        "docs/a.md: b.md#_italic_-part (no such heading)",
        "docs/a.md: f.md",
        "docs/a.md: g.md",
        "docs/a.md: h i.md",
    ]


def test_a_heading_s_anchor_is_github_s():
    assert _slug("Jobs: Databricks-style multi-task `jobs` (2.1)") == (
        "jobs-databricks-style-multi-task-jobs-21"
    )
    assert _slug("_Italic_ part") == "italic-part"
    assert _slug("max_offsets_per_trigger") == "max_offsets_per_trigger"
    assert _slug("__Strong__, *em* and **strong**") == "strong-em-and-strong"
    assert _slug("_a __b__ c_ snake_case_") == "a-b-c-snake_case_"
    assert _slug("`_private_` and `bronze.max_offsets_per_trigger`") == (
        "_private_-and-bronzemax_offsets_per_trigger"
    )


def test_the_readme_fits_on_a_screen_or_two():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250


def test_no_tracked_file_points_outside_the_repository():
    tracked = _tracked()
    if tracked is None:
        pytest.skip("not a git checkout")
    assert [str(p.relative_to(REPO)) for p in tracked if _points_outside(p.read_bytes())] == []


def test_the_outside_check_finds_both_spellings():
    relative, absolute = ("see ../sha" + "red/spec/x.md", "see /sha" + "red/spec/x.md")
    assert _points_outside(relative.encode()) and _points_outside(absolute.encode())
    assert not _points_outside(b"see docs/orders-stream.md and /srv/shared-data/")


def test_the_code_cites_headings_its_docs_pages_have():
    """A citation such as `docs/guarantees.md, 'A checkpoint is a cache'` in the code, the job
    specs, the scripts, the benchmarks or the tests names a page that exists and the start of one
    of its headings."""
    sources = _tracked(*CITING) or [p for d in CITING for p in (REPO / d).rglob("*") if p.is_file()]
    sources = [s for s in sources if s != Path(__file__).resolve()]  # its examples are made up
    assert any(_citations(source) for source in sources), (
        "the code cites no docs page: this test has lost its subject"
    )
    assert [w for source in sources for w in _wrong_citations(source)] == []


def test_the_citation_check_finds_what_is_wrong(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "ops.md").write_text(
        "# Ops\n\n## Jobs: Databricks-style multi-task jobs\n"
    )
    (tmp_path / "run.sh").write_text(
        '# see docs/ops.md, "Jobs: Databricks-style\n# multi-task jobs", and docs/ops.md, "Exit"\n'
        "# and docs/gone.md, 'Ops'\n"
    )
    assert _wrong_citations(tmp_path / "run.sh", root=tmp_path) == [
        ("run.sh", "ops.md", "Exit"),
        ("run.sh", "gone.md", "Ops"),
    ]
