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


def test_ci_runs_the_readme_quickstart_as_written():
    """.ci/run reads the README's two quickstart commands and its first Python snippet with
    .ci/readme_block.py (which gives exactly the README's blocks) and runs them in the
    README's order: command 1, command 2's install, the snippet from outside the checkout,
    then (after the checks) command 2's tests, with pytest's exit 5 reported."""
    import subprocess
    import sys

    from test_doc_blocks import doc_blocks  # tests/ is on sys.path (pytest's rootdir)

    blocks = doc_blocks()
    want = {b.arg: b.code.strip() for b in blocks if b.kind == "quickstart"}
    want["python"] = next(b.code.strip() for b in blocks if b.lang == "python")
    for name, code in want.items():
        got = subprocess.run(
            [sys.executable, str(ROOT / ".ci" / "readme_block.py"), name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert got == code, name
    ci = (ROOT / ".ci" / "run").read_text()
    steps = [
        "install_run=$(python3 .ci/readme_block.py install-run)",
        "test_command=$(python3 .ci/readme_block.py test)",
        "snippet=$(python3 .ci/readme_block.py python)",
        "rm -rf .venv-ci",
        'eval "$install_run"',
        'eval "$test_install"',
        '(cd "$outside" && python -c "$snippet")',
        "ruff check .",
        "ruff format --check .",
        "mypy diloco_gym",
        "mkdocs build --strict",
        'eval "$test_run" || status=$?',
        'if [ "$status" -eq 5 ]; then',
    ]
    at = 0
    for step in steps:
        found = ci.find(step, at)
        assert found >= 0, f".ci/run does not run {step!r} (after the previous step)"
        at = found + len(step)
    assert want["install-run"].startswith("python -m pip install . && diloco-gym report")
    extras = re.search(r'pip install -e "\.\[([a-z,]+)\]"', want["test"])
    assert extras and "docs" not in extras.group(1).split(",")
    assert 'python -m pip install -e ".[docs]"' in ci  # CI adds the docs extra


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
