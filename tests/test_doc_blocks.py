"""Every fenced code block of README.md and docs/*.md is run by a test, or says why not.

A block's fate is the HTML comment on the line just before its fence (blank lines between
are allowed):

* ``<!-- no-run: REASON -->``: not run; the reason is a sentence (a format excerpt, an
  install, a cluster, an hour-long run whose small form a named test runs, ...).
* ``<!-- run-by: PATH -->``: run by the tests in PATH (which read this page).
* ``<!-- quickstart: install-run -->`` / ``<!-- quickstart: test -->`` (README only): the
  quickstart commands, which ``.ci/run`` reads from the README and runs as written.
* ``<!-- run-with: SUB OPTION VALUE...; SUB OPTION VALUE... -->``: a shell block run here
  with the named ``diloco-gym SUB`` options set to small values (replaced where the
  command gives them, added where it does not), e.g. ``report --seeds 2 --draws 20``.

Without a comment, a ``python`` block runs as it is (``tests/test_readme.py``), a ``bash``
block runs as it is (below), and any other block fails the first test here.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```[ \t]*$", flags=re.S | re.M)
_NOTE = re.compile(r"<!--\s*([a-z-]+):\s*(.*?)\s*-->", flags=re.S)

#: The Azure trace the blocks name (not shipped: the Azure LLM inference trace is public in
#: Azure/AzurePublicDataset on GitHub), stood in for by the shipped 600 s bursty trace in
#: the Azure format.
AZURE = "AzureLLMInferenceTrace_code.csv"


def _azure_stand_in(path: Path) -> None:
    import pandas as pd

    t = pd.read_csv(ROOT / "traces" / "bursty.csv", comment="#")
    start = pd.Timestamp("2023-11-16 18:00:00")
    stamps = start + pd.to_timedelta(t["arrival_s"], unit="s")
    pd.DataFrame(
        {
            "TIMESTAMP": stamps.dt.strftime("%Y-%m-%d %H:%M:%S.%f"),
            "ContextTokens": t["prompt_tokens"],
            "GeneratedTokens": t["output_tokens"],
        }
    ).to_csv(path, index=False)


#: Folders of the checkout that commands name by relative path (linked into the run's cwd).
FOLDERS = ("docs", "agents", "traces", "diloco_gym")


@dataclass(frozen=True)
class Block:
    page: str  # README.md or docs/NAME.md
    line: int  # the fence's line (1-based)
    lang: str  # the fence's info string's first word
    code: str
    kind: str  # the comment's keyword ("" without one)
    arg: str  # what follows it

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def doc_blocks() -> list[Block]:
    """Every fenced block of README.md and docs/*.md with the comment before it."""
    found = []
    for path in PAGES:
        text = path.read_text()
        for m in _FENCE.finditer(text):
            before = text[: m.start()].rstrip()
            note = (
                _NOTE.fullmatch(before[before.rfind("<!--") :]) if before.endswith("-->") else None
            )
            found.append(
                Block(
                    page=str(path.relative_to(ROOT)),
                    line=text[: m.start()].count("\n") + 1,
                    lang=m.group(1),
                    code=m.group(2),
                    kind=note.group(1) if note else "",
                    arg=" ".join(note.group(2).split()) if note else "",
                )
            )
    return found


def _uncovered(b: Block) -> str | None:
    """Why ``b`` is neither run nor explained (None when it is one or the other)."""
    if b.kind == "no-run":
        return None if len(b.arg.split()) >= 3 else "a no-run comment needs its reason"
    if b.kind == "run-by":
        target = ROOT / b.arg
        if not target.is_file():
            return f"run-by names {b.arg}, which does not exist"
        if Path(b.page).name not in target.read_text():
            return f"{b.arg} does not read {b.page}"
        return None
    if b.kind == "quickstart":
        if b.page != "README.md" or b.arg not in ("install-run", "test"):
            return "quickstart blocks are README.md's install-run and test"
        return None
    if b.kind == "run-with":
        return None if b.lang == "bash" else "run-with is for bash blocks"
    if b.kind:
        return f"unknown block comment {b.kind!r}"
    if b.lang in ("python", "bash"):
        return None
    return f"a {b.lang or 'plain'} block without <!-- no-run: reason --> before it"


def test_every_block_is_run_or_says_why_not():
    blocks = doc_blocks()
    assert len(blocks) > 30  # the parser sees the pages' blocks
    bad = [f"{b.id}: {why}" for b in blocks if (why := _uncovered(b))]
    assert not bad, "\n".join(bad)


def test_the_readme_quickstart_blocks_are_the_two_commands():
    quick = {b.arg: b for b in doc_blocks() if b.kind == "quickstart"}
    assert set(quick) == {"install-run", "test"}
    install_run, test = quick["install-run"].code.strip(), quick["test"].code.strip()
    assert install_run.startswith("python -m pip install . && diloco-gym report ")
    assert test.startswith("python -m pip install -e ") and test.endswith("python -m pytest -q")


def test_the_block_comments_are_parsed(tmp_path, monkeypatch):
    """The parser reads the comment right before a fence, and only that one."""
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- no-run: a format excerpt -->\n\n```csv\na,b\n```\n\ntext\n\n```toml\nx = 1\n```\n"
        "<!-- run-with: report --seeds 2 -->\n```bash\ndiloco-gym report\n```\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "PAGES", [page])
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    got = [(b.lang, b.kind, b.arg) for b in doc_blocks()]
    assert got == [
        ("csv", "no-run", "a format excerpt"),
        ("toml", "", ""),
        ("bash", "run-with", "report --seeds 2"),
    ]
    assert _uncovered(doc_blocks()[1]) == "a toml block without <!-- no-run: reason --> before it"


# ------------------------------------------------------------------ running shell blocks
def shell_commands(code: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    out = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(shlex.join(words))
    return out


def with_small_options(command: str, spec: str) -> str:
    """``command`` with the options of ``spec`` (``SUB --opt V...; SUB2 --opt V``) set for
    ``diloco-gym SUB`` commands: an option's values replaced where the command gives it,
    the option added where it does not."""
    words = shlex.split(command)
    if words[:1] != ["diloco-gym"] or len(words) < 2:
        return command
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        sub, *opts = shlex.split(part)
        if words[1] != sub:
            continue
        i = 0
        while i < len(opts):
            name, j = opts[i], i + 1
            while j < len(opts) and not opts[j].startswith("--"):
                j += 1
            values = opts[i + 1 : j]
            if name in words:
                k = words.index(name) + 1
                end = k
                while end < len(words) and not words[end].startswith("--"):
                    end += 1
                words[k:end] = values
            else:
                words += [name, *values]
            i = j
    return shlex.join(words)


def test_small_options_replace_or_add():
    spec = "report --seeds 2 --draws 20; train --timesteps 256"
    got = with_small_options("diloco-gym report --seeds 200 --regimes a b --force", spec)
    assert got == "diloco-gym report --seeds 2 --regimes a b --force --draws 20"
    got = with_small_options("diloco-gym train --regimes a b --timesteps 300000", spec)
    assert got == "diloco-gym train --regimes a b --timesteps 256"
    assert with_small_options("diloco-gym run --seeds 20", spec) == "diloco-gym run --seeds 20"
    assert shell_commands("a --x 1 \\\n    --y 2   # note\n\n# only a comment\nb\n") == [
        "a --x 1 --y 2",
        "b",
    ]


def _shell_blocks() -> list[Block]:
    return [b for b in doc_blocks() if b.lang == "bash" and b.kind in ("", "run-with")]


@pytest.mark.slow
@pytest.mark.parametrize("block", _shell_blocks(), ids=lambda b: b.id)
def test_shell_block_runs(block: Block, tmp_path: Path):
    """Each command of the block, in order, in a fresh directory outside the checkout that
    holds the folders and stand-in files the commands name; ``diloco-gym`` is this
    checkout's CLI (``python -m diloco_gym.cli``)."""
    commands = [with_small_options(c, block.arg) for c in shell_commands(block.code)]
    text = " ".join(commands)
    if re.search(r"\btrain\b|reference-ppo|model\.zip", text):
        pytest.importorskip("stable_baselines3", reason="SB3 is not installed (the rl extra)")
    if "--backend ray" in text:
        pytest.importorskip("ray", reason="Ray is not installed (the ray extra)")
    if AZURE in text:
        _azure_stand_in(tmp_path / AZURE)
    for folder in FOLDERS:
        if re.search(rf"(^|[\s=']){folder}/", text):
            (tmp_path / folder).symlink_to(ROOT / folder, target_is_directory=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg")
    for command in commands:
        words = shlex.split(command)
        if words[0] == "diloco-gym":
            words = [sys.executable, "-m", "diloco_gym.cli", *words[1:]]
        elif words[0] == "python":
            words[0] = sys.executable
        done = subprocess.run(
            words, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{block.id}: {command}\n{done.stderr[-2000:]}"
