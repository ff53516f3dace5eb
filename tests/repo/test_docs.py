"""The docs hold together: every relative Markdown link in README.md and docs/ reaches an existing file (and, with
an anchor, a heading of it), every method fl/methods registers has a page linked from docs/index.md that names it,
and every method page has the same sections."""
import re
from pathlib import Path

import pytest

from fl.core import registry
from tests.helpers import ROOT, markdown_headings

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
METHOD_SECTIONS = ["What it does", "Hyperparameters", "Configs", "Protocol", "Where it differs from the paper"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (not - or _), spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.lower().replace("`", "")).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, title, _ in markdown_headings(path.read_text()):
        base = slug(title)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    """The link targets of a Markdown file, outside code blocks and code spans."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)
    return LINK.findall(text)


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in links(path):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            broken.append(f"{target} (no heading #{anchor} in {dest.name})")
    return broken


def test_the_anchor_rule_is_githubs():
    assert slug("Sweeps, reports and dashboards") == "sweeps-reports-and-dashboards"
    assert slug("FedACD and FedACD_base") == "fedacd-and-fedacd_base"
    assert slug("Target client, validation splits, old names") == "target-client-validation-splits-old-names"


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n[ok](#top) [gone](missing.md) [bad anchor](page.md#nowhere) `[code](x.md)`\n"
                    "```\n[fenced](y.md)\n```\n")
    assert broken_links(page) == ["missing.md (no such file)", "page.md#nowhere (no heading #nowhere in page.md)"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_heading(doc):
    assert broken_links(doc) == []


@pytest.mark.parametrize("doc", [d for d in DOCS[1:] if d.name != "index.md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_docs_page_links_back_to_the_index(doc):
    assert any((doc.parent / t.partition("#")[0]).resolve() == (ROOT / "docs" / "index.md").resolve()
               for t in links(doc))


def test_every_docs_page_is_linked_from_the_index_or_the_readme():
    linked = {(page.parent / t.partition("#")[0]).resolve() for page in (ROOT / "README.md", ROOT / "docs/index.md")
              for t in links(page) if not re.match(r"[a-z]+:", t)}
    assert [str(p.relative_to(ROOT)) for p in DOCS[1:] if p.name != "index.md" and p.resolve() not in linked] == []


# What a method contributed to this repository needs beside its file (docs/adding-a-method.md, "What a contribution
# needs beyond the file"): said by every failure of the two tests below.
CONTRIBUTION = ("a method contributed to fl needs, besides its file, a row in docs/index.md's Methods table "
                "(| `NAME` | Name | [methods/NAME.md](methods/NAME.md) |) and a page docs/methods/NAME.md naming "
                f"`NAME`, with one # title and exactly the sections {', '.join('## ' + t for t in METHOD_SECTIONS)} "
                "in this order (docs/adding-a-method.md, 'What a contribution needs beyond the file')")


def test_every_registered_method_has_a_page_linked_from_the_index_that_names_it():
    registry.load_plugins()
    shipped = sorted(m for m, spec in registry.METHODS.items() if spec.client_cls.__module__.startswith("fl."))
    assert len(shipped) >= 35  # the five seed methods and their baselines (FedProx-FT, FedSAM-FT are configs)
    index = ROOT / "docs" / "index.md"
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \|[^|]*\| \[[^\]]*\]\(([^)#]+)[^)]*\) \|$",
                                                        index.read_text(), re.M)}
    missing = sorted(set(shipped) - rows.keys())
    assert missing == [], f"no row in docs/index.md's Methods table for {', '.join(missing)}: {CONTRIBUTION}"
    assert sorted(set(rows) - set(shipped)) == [], "rows in docs/index.md naming no registered method"
    for method, target in rows.items():
        page = index.parent / target
        assert page.parent == index.parent / "methods" and page.exists(), f"{method}: no page {target}; {CONTRIBUTION}"
        assert re.search(rf"`(method\.name=)?{method}`", page.read_text()), (f"{target} does not name `{method}`; "
                                                                            f"{CONTRIBUTION}")


def test_every_method_page_has_the_same_sections_in_order():
    pages = sorted((ROOT / "docs" / "methods").glob("*.md"))
    assert pages
    for page in pages:
        levels = markdown_headings(page.read_text())
        sections = [t for lv, t, _ in levels if lv == 2]
        assert sections == METHOD_SECTIONS, f"docs/methods/{page.name} has the sections {sections}; {CONTRIBUTION}"
        assert [lv for lv, _, _ in levels].count(1) == 1 and levels[0][0] == 1, f"docs/methods/{page.name}: " \
            f"{CONTRIBUTION}"


CONFLICT = re.compile(r"^(<{7} |>{7} |={7}$)", re.M)


def conflict_markers(root: Path) -> list[str]:
    """file:line of every merge-conflict marker in the project's text files (Markdown, Python, YAML, shell)."""
    tops = [p for p in root.iterdir() if not p.name.startswith(".") and p.name != "outputs"] + [root / ".ci"]
    files = sorted(f for top in tops for f in ([top] if top.is_file() else top.rglob("*")))
    found = []
    for path in files:
        if path.is_file() and (path.suffix in {".md", ".py", ".yaml", ".yml", ".toml", ".sh"} or path.name == "run"):
            text = path.read_text(errors="replace")
            found += [f"{path.relative_to(root)}:{text.count(chr(10), 0, m.start()) + 1}"
                      for m in CONFLICT.finditer(text)]
    return found


def test_no_file_holds_a_merge_conflict_marker(tmp_path):
    assert conflict_markers(ROOT) == []
    (tmp_path / "a.md").write_text("one\n" + "<" * 7 + " HEAD\ntwo\n" + "=" * 7 + "\nthree\n" + ">" * 7 + " branch\n")
    assert conflict_markers(tmp_path) == ["a.md:2", "a.md:4", "a.md:6"]
