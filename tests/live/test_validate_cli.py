"""``diloco-gym validate``'s options and usage errors (:mod:`diloco_gym.live.validate_cli`):
each bad value is one line and exit 2, before an engine or a merge worker starts."""

from __future__ import annotations

import argparse
import json

import pytest

from diloco_gym.cli import main
from diloco_gym.live.validate_cli import held_out_setting


def test_held_out_settings_parse():
    assert held_out_setting("bursty:0.5") == ("bursty", 0.5)
    assert held_out_setting("traces/a:b.csv:0.3") == ("traces/a:b.csv", 0.3)
    for bad in ("bursty", "bursty:", ":0.5", "bursty:x", "bursty:0", "bursty:-1"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected SOURCE:U"):
            held_out_setting(bad)


def _fails(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return exc.value.code, err


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--windows", "0"], "ValidateConfig.windows must be an int >= 1"),
        (["--draws", "0"], "ValidateConfig.draws must be an int >= 1"),
        (["--window-seconds", "-5"], "ValidateConfig.window_s must be > 0"),
        (["--slo-ms", "0"], "ValidateConfig.slo_ms must be > 0"),
        (["--held-out", "no-such-file.csv:0.5"], "no-such-file.csv is neither a regime"),
        (["--agent", "no-such-agent"], "--agent 'no-such-agent' is unknown"),
        (["--held-out", "bursty"], "expected SOURCE:U"),
    ],
)
def test_bad_values_are_one_line_usage_errors(argv, words, capsys, tmp_path):
    code, err = _fails(["validate", "--out", str(tmp_path / "v.json"), *argv], capsys)
    assert code == 2 and words in err
    assert not list(tmp_path.iterdir())  # nothing started, nothing written


def test_a_calibration_file_without_a_fit_is_refused(capsys, tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"source": "a test", "regimes": {"ordinary": {
        "p95_high_low": 1.0, "p95_sync_ratio": 1.0}}}))  # fmt: skip
    code, err = _fails(["validate", "--calibration", str(path)], capsys)
    assert code == 2 and "fitted_sidecar" in err and str(path) in err
