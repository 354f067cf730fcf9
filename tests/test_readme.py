"""The README stays true to the code: quickstart commands and the observation table."""

from __future__ import annotations

import re
from pathlib import Path

from diloco_gym.envs.core import OBS_FEATURES

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
