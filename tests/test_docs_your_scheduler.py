"""docs/your-scheduler.md runs: its first Python block is the scheduler file the others
import; each other block runs as a script of its own beside it, in a fresh interpreter,
with the page's settings made tiny (each replacement checked to match the page)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "your-scheduler.md"

#: The page's settings and their tiny stand-ins (each must occur in the page).
TINY = {
    'regimes=["bursty", "sync-heavy"], seeds=20': 'regimes=["bursty"], seeds=2, draws=50',
    'regimes=["bursty"], seeds=20': 'regimes=["bursty"], seeds=2, draws=50',
    "draws=1000": "draws=50",
    "total_timesteps=100_000": "total_timesteps=256",
    "n_steps=256,": "n_steps=64, batch_size=64, n_epochs=1,",
    '"online-forecast"],\n        seeds=20,': '"online-forecast"],\n        seeds=3,',
    'fleet="docs/examples/fleet-v1.toml"': f'fleet="{ROOT / "docs/examples/fleet-v1.toml"}"',
}


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.+?)```", PAGE.read_text(), flags=re.S)


def test_the_page_has_its_scheduler_file_and_examples():
    blocks = _blocks()
    assert blocks[0].startswith("# my_scheduler.py\n")
    assert len(blocks) >= 6
    text = PAGE.read_text()
    for old in TINY:
        assert old in text, f"docs/your-scheduler.md no longer says {old!r}"


def _tiny(code: str) -> str:
    for old, new in TINY.items():
        code = code.replace(old, new)
    return code


@pytest.mark.slow
@pytest.mark.parametrize("index", range(1, len(_blocks())))
def test_every_python_block_runs_beside_the_scheduler_file(index, tmp_path):
    blocks = _blocks()
    (tmp_path / "my_scheduler.py").write_text(blocks[0])
    script = tmp_path / f"block_{index}.py"
    script.write_text(_tiny(blocks[index]))
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg")
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"block {index}:\n{blocks[index]}\n{done.stderr[-3000:]}"
    assert done.stdout.strip(), f"block {index} printed nothing"
