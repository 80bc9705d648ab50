"""The docs stay true to the tree: the module map names every module, and every path and link resolves.

docs/architecture.md's "Module map" is the one list of the project's modules. A module added, moved or
renamed under backends/, fixtures/, suites/, reports/ or native/ fails here, naming it, until the map says
what it is; a path the map names that no longer exists fails too. Links between README.md and docs/*.md
(and their #anchors) must lead somewhere, and so must every repository path the pages name in backticks.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = REPO_ROOT / "docs" / "architecture.md"
MAPPED_FOLDERS = ("backends", "fixtures", "suites", "reports", "native")
NOT_SOURCE = {"__pycache__", "build"}  # native/build/ holds compiled extensions
COVERS_ALL = "every module in"  # a folder row whose text starts so covers every module under it


# ------------------------------------------------------------------ the module map
def map_rows() -> list[tuple[list[str], str]]:
    """(paths named in the first cell, the rest of the row) for every table row of the "Module map" section."""
    text = ARCHITECTURE.read_text()
    assert "\n## Module map\n" in text, f"{ARCHITECTURE} has no '## Module map' section"
    section = text.split("\n## Module map\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.lstrip().startswith("|") or len(cells) < 2 or set(cells[0]) <= set("-: "):
            continue
        paths = re.findall(r"`([^`]+)`", cells[0])
        if paths:
            rows.append((paths, " | ".join(cells[1:])))
    return rows


@functools.cache
def source_modules() -> frozenset[str]:
    """Every Python module under the mapped folders; an empty __init__.py is no module to describe."""
    found = set()
    for top in MAPPED_FOLDERS:
        for dirpath, dirnames, filenames in os.walk(REPO_ROOT / top):
            dirnames[:] = [d for d in dirnames if d not in NOT_SOURCE and not d.startswith(".")]
            for name in filenames:
                path = Path(dirpath) / name
                if name.endswith(".py") and not (name == "__init__.py" and not path.read_text().strip()):
                    found.add(path.relative_to(REPO_ROOT).as_posix())
    return frozenset(found)


def covered_modules(rows) -> set[str]:
    covered = set()
    for paths, role in rows:
        for path in paths:
            if path.endswith("/"):
                covered.add(path + "__init__.py")  # a package's row names its __init__.py
                if role.lower().startswith(COVERS_ALL):
                    covered.update(m for m in source_modules() if m.startswith(path))
            else:
                covered.add(path)
    return covered


def test_every_path_the_module_map_names_exists():
    rows = map_rows()
    assert rows, f"no table rows in the Module map of {ARCHITECTURE}"
    missing = sorted({p for paths, _ in rows for p in paths if not (REPO_ROOT / p).exists()})
    assert not missing, (f"{ARCHITECTURE.relative_to(REPO_ROOT)} (Module map) names paths that do not exist: "
                         f"{', '.join(missing)}. Remove or rename their rows.")


def test_the_module_map_names_every_module():
    unnamed = sorted(source_modules() - covered_modules(map_rows()))
    assert not unnamed, (f"{ARCHITECTURE.relative_to(REPO_ROOT)} (Module map) does not name these modules: "
                         f"{', '.join(unnamed)}. Add a row for each (`path` | role), or a folder row "
                         f"(`folder/` | {COVERS_ALL} folder/: ...) covering them.")


def test_a_folder_row_covers_its_modules_only_when_it_says_so():
    rows = [(["suites/p2p/"], "every module in suites/p2p/: ..."), (["suites/rpc/"], "the RPC contract")]
    covered = covered_modules(rows)
    assert "suites/p2p/common.py" in covered and "suites/p2p/test_send_recv.py" in covered
    assert "suites/rpc/__init__.py" in covered and "suites/rpc/udfs.py" not in covered


# ------------------------------------------------------------------ links
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def pages() -> list[Path]:
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens; repeats get -1, -2."""
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", FENCE.sub("", page.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
            continue
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            shown = resolved.relative_to(REPO_ROOT) if resolved.is_relative_to(REPO_ROOT) else resolved
            broken.append(f"{target} (no file {shown})")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target} (no heading #{fragment} in {resolved.relative_to(REPO_ROOT)})")
    return broken


def test_every_relative_link_in_the_readme_and_docs_resolves():
    broken = {page.relative_to(REPO_ROOT).as_posix(): links for page in pages() if (links := broken_links(page))}
    assert not broken, "broken links: " + "; ".join(f"{page}: {', '.join(links)}" for page, links in broken.items())


def test_the_link_check_sees_a_broken_link_and_a_broken_anchor(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO_ROOT", tmp_path)
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Writing a backend in C++\n\n[ok](#writing-a-backend-in-c) [self](page.md#title) "
                    "[gone](missing.md) [bad](#nowhere) [web](https://example.org)\n\n```sh\n[x](in-a-fence.md)\n```\n")
    assert broken_links(page) == ["missing.md (no file missing.md)", "#nowhere (no heading #nowhere in page.md)"]


# ------------------------------------------------------------------ paths named in the text
REPO_PATH = re.compile(r"`((?:backends|fixtures|suites|reports|native|tests|docs|\.ci|\.github)/[^`\s]*)`")
RUN_OUTPUT = ("reports/out/",)  # what a run writes (git-ignored): named, never committed


def missing_paths(page: Path) -> list[str]:
    """Repository paths named in backticks that do not exist (placeholders such as <report-dir> are not paths)."""
    missing = []
    for token in REPO_PATH.findall(page.read_text()):
        path = token.split("::")[0]  # tests/test_launch_launchers.py::test_mpirun names a file
        if re.search(r"[<>{}*]", path) or (path.rstrip("/") + "/").startswith(RUN_OUTPUT):
            continue
        if not (REPO_ROOT / path).exists() and path not in missing:
            missing.append(path)
    return missing


def test_every_repository_path_the_readme_and_docs_name_exists():
    missing = {page.relative_to(REPO_ROOT).as_posix(): paths for page in pages() if (paths := missing_paths(page))}
    assert not missing, "paths named in the docs that do not exist: " + "; ".join(
        f"{page}: {', '.join(paths)}" for page, paths in missing.items())
