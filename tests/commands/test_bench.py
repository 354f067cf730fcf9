"""The ``bench`` command (:mod:`diloco_gym.commands.bench`): its option checks fail with one
line and their exit status before any episode runs, and a bad submission file is a data
error naming the file and the field."""

from __future__ import annotations

import json

import pytest


@pytest.fixture
def out(tmp_path):
    """The output directory of a refused bench: it must not exist afterwards."""
    path = tmp_path / "b"
    yield ["--out", str(path)]
    assert not path.exists()


def test_usage_errors_are_one_line(out, fails):
    assert fails(["bench", *out], 2) == (
        "diloco-gym: give entrants: --baselines, --agent AGENT or --group NAME AGENT..."
    )
    assert "unknown agent 'nope'" in fails(["bench", *out, "--agent", "nope"], 2)
    assert "unknown agent 'nope'" in fails(["bench", *out, "--group", "g", "wa-diloco", "nope"], 2)
    assert fails(["bench", *out, "--group", "g"], 2) == (
        "diloco-gym: --group g: give NAME then at least one agent"
    )
    twice = ["--agent", "wa-diloco", "--agent", "wa-diloco"]
    assert "entrant 'wa-diloco' given twice" in fails(["bench", *out, *twice], 2)
    assert fails(["bench", *out, "--agent", "wa-diloco", "--tasks", "bursty@70/h"], 2).startswith(
        "diloco-gym: unknown task 'bursty@70/h'; valid: a setting"
    )
    assert fails(["bench", *out, "--agent", "wa-diloco", "--tolerance", "0.1"], 2) == (
        "diloco-gym: --tolerance goes with --validate"
    )
    line = fails(["bench", *out, "--validate", "x.json", "--agent", "wa-diloco"], 2)
    assert line.startswith("diloco-gym: --validate takes the entrants and the mode from")
    line = fails(["bench", *out, "--agent", "wa-diloco", "--baseline", "wa"], 2)
    assert line.startswith("diloco-gym: baseline 'wa' is not an entrant; entrants: wa-diloco,")
    assert "must be >= 2" in fails(["bench", *out, "--agent", "wa-diloco", "--seeds", "1"], 2)


def test_a_bad_submission_is_a_data_error_naming_file_and_field(tmp_path, out, fails):
    from diloco_gym.eval.bench import suite_hash

    path = tmp_path / "sub.json"
    entrant = {"name": "x", "agents": ["wa-diloco"], "scores": {"bursty@72/h": ["high"]}}
    doc = {"suite": "diloco-bench-v1", "suite_hash": suite_hash(), "mode": "quick"}
    path.write_text(json.dumps({**doc, "entrants": [entrant]}))
    assert fails(["bench", *out, "--validate", str(path)], 1) == (
        f"diloco-gym: {path}: field 'entrants[0].scores.bursty@72/h[0]': must be a number or "
        f'null, got "high"'
    )
    missing = tmp_path / "missing.json"
    assert fails(["bench", *out, "--validate", str(missing)], 1).startswith(
        f"diloco-gym: {missing}: cannot read it"
    )
    assert fails(["bench", *out, "--validate", str(path), "--tolerance", "-1"], 2) == (
        "diloco-gym: --tolerance must be >= 0, got -1.0"
    )


def test_baselines_leave_out_the_agents_that_run_on_no_task():
    """``--baselines`` takes every registered agent that runs on some task; the cap-aware
    agent needs a capped fleet, which the suite has not, so it is left out (a bench of
    it alone is refused: it runs on none of the tasks)."""
    import argparse

    from diloco_gym.commands.bench import _entrants

    args = argparse.Namespace(baselines=True, agent=[], group=[])
    names = [e.name for e in _entrants(args)]
    assert "online-forecast" in names and "cap-aware-forecast" not in names
