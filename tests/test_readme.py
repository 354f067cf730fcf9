"""The README stays true to the code: quickstart commands and the observation table."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from diloco_gym.envs.observation import OBS_FEATURES

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_observation_table_matches_the_code():
    rows = re.findall(
        r"^\| (\d+) \| `([a-z_]+)` \| (.+?) \| \[(-?\d+), (-?\d+)\] \|", README, flags=re.M
    )
    assert [(int(i), n) for i, n, *_ in rows] == [(i, f[0]) for i, f in enumerate(OBS_FEATURES)]
    for (_, _, unit, lo, hi), f in zip(rows, OBS_FEATURES, strict=True):
        assert (unit, float(lo), float(hi)) == (f[1], f[2], f[3])


def test_ci_runs_the_readme_test_command():
    blocks = re.findall(r"```bash\n(.+?)\n```", README, flags=re.S)
    test_cmd = blocks[1].strip()
    assert "pytest" in test_cmd
    # CI runs the command's steps in its order, with the lint, format and type checks
    # between the install and the tests.
    ci = (ROOT / ".ci" / "run").read_text()
    at = 0
    for step in (part.strip() for part in test_cmd.split("&&")):
        found = ci.find(f"\n{step}", at)
        assert found >= 0, f".ci/run does not run {step!r} (after the previous step)"
        at = found + 1 + len(step)
    assert blocks[0].strip().startswith("python -m pip install .")
    assert "diloco-gym report" in blocks[0]


#: Files the snippets name, stood in for by the repository's small fixtures.
SNIPPET_FILES = {
    "my_sidecar.json": "tests/fixtures/live_cpu_calibration.json",
    "AzureLLMInferenceTrace_code.csv": "tests/fixtures/azure_small.csv",
}


def _python_snippets() -> list[tuple[str, int, str]]:
    """Every ```python block of the README and docs/*.md that has no block comment before it
    (tests/test_doc_blocks.py): (file, line, code). The TorchRL and RLlib training examples
    say ``run-by: tests/rl/test_libraries.py``, which runs them with a tiny budget."""
    from test_doc_blocks import doc_blocks  # tests/ is on sys.path (pytest's rootdir)

    return [(b.page, b.line, b.code) for b in doc_blocks() if b.lang == "python" and not b.kind]


@pytest.mark.slow
@pytest.mark.parametrize("name, line, code", _python_snippets(), ids=lambda v: str(v)[:30])
def test_every_python_snippet_runs_on_its_own(name, line, code, tmp_path):
    """Each snippet in a fresh interpreter (nothing imported for it), in a directory that
    holds the files it names."""
    import shutil
    import subprocess
    import sys

    for wanted, fixture in SNIPPET_FILES.items():
        if wanted in code:
            shutil.copy(ROOT / fixture, tmp_path / wanted)
    for folder in ("traces",):
        if f"{folder}/" in code:
            shutil.copytree(ROOT / folder, tmp_path / folder)
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg")
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{name}:{line}: {done.stderr[-1500:]}"
