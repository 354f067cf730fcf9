"""The documentation site (mkdocs.yml): its navigation covers every page of docs/, its API
reference names modules that exist, and ``mkdocs build --strict`` passes (warnings, such
as a broken link, are errors)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _nav_pages() -> list[str]:
    """The pages mkdocs.yml's nav lists (read as text: the file needs no YAML parser)."""
    text = (ROOT / "mkdocs.yml").read_text()
    nav = text[text.index("\nnav:") : text.index("\nvalidation:")]
    return re.findall(r":\s*(\S+\.md)\s*$", nav, flags=re.M)


def test_the_nav_lists_every_page_of_docs():
    pages = _nav_pages()
    on_disk = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(pages) == on_disk
    assert len(pages) == len(set(pages))


def test_the_api_reference_names_modules_that_exist():
    names = []
    for page in sorted((ROOT / "docs" / "api").glob("*.md")):
        names += re.findall(r"^::: ([\w.]+)\s*$", page.read_text(), flags=re.M)
    assert {"diloco_gym", "diloco_gym.envs.env", "diloco_gym.eval.protocol"} <= set(names)
    assert {"diloco_gym.eval.report", "diloco_gym.eval.frontier", "diloco_gym.rl"} <= set(names)
    for name in names:  # found without importing (the rl modules import SB3)
        assert importlib.util.find_spec(name) is not None, name


@pytest.mark.slow
def test_the_site_builds_in_strict_mode(tmp_path):
    pytest.importorskip("mkdocs", reason="MkDocs is not installed (the docs extra)")
    pytest.importorskip("mkdocstrings", reason="mkdocstrings is not installed (the docs extra)")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "api" / "envs" / "index.html").read_text().count("DiLoCoSyncEnv") > 0
