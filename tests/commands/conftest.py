"""Shared helpers of the command tests: a command that must fail with one line."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from diloco_gym.cli import main


@pytest.fixture
def fails(capsys) -> Callable[[list[str], int], str]:
    """``fails(argv, code)``: run ``main(argv)``, check that it exits with ``code`` after
    exactly one ``diloco-gym...`` line on stderr and prints nothing on stdout; return the line."""

    def check(argv: list[str], code: int) -> str:
        with pytest.raises(SystemExit) as exc:
            main(argv)
        captured = capsys.readouterr()
        assert exc.value.code == code, (exc.value.code, captured)
        lines = [ln for ln in captured.err.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("diloco-gym"), captured.err
        assert "Traceback" not in captured.err and captured.out == ""
        return lines[0]

    return check
