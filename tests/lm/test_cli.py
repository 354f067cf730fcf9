"""The ``calibrate-learners`` command (``diloco_gym/lm/cli.py``): the refusals of an
existing ``--out`` and of bad values."""

from __future__ import annotations

import pytest

from diloco_gym.cli import main


def test_cli_refuses_to_overwrite_and_bad_values(tmp_path, capsys):
    out = tmp_path / "lc.json"
    out.write_text("{}")
    with pytest.raises(SystemExit) as info:
        main(["calibrate-learners", "--tiny", "--out", str(out)])
    assert info.value.code == 2
    assert "exists; pass --force" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["calibrate-learners", "--seeds", "1", "--out", str(tmp_path / "x.json")])
    assert info.value.code == 2
    assert "--seeds" in capsys.readouterr().err
