"""What the trace-loader tests share (tests/sim/test_loaders*.py): the fixture and real-trace
folders, small file writers and the check of a :class:`TraceFormatError`'s location."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from diloco_gym.sim.traces import TraceFormatError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _real_traces_dir() -> Path:
    """``shared/traces/real`` beside the repository (or beside a folder holding it, as for
    a git worktree); ``$DILOCO_GYM_REAL_TRACES`` overrides."""
    if os.environ.get("DILOCO_GYM_REAL_TRACES"):
        return Path(os.environ["DILOCO_GYM_REAL_TRACES"])
    parents = Path(__file__).resolve().parents[3:]
    for parent in parents:
        if (parent / "shared" / "traces" / "real").is_dir():
            return parent / "shared" / "traces" / "real"
    return parents[1] / "shared" / "traces" / "real"


REAL = _real_traces_dir()


AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


BURST_HEADER = (
    "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def real_file(name: str) -> Path:
    path = REAL / name
    if not path.is_file():
        pytest.skip(f"real trace {name} not present under {REAL}")
    return path


def assert_error(
    info: pytest.ExceptionInfo[TraceFormatError], path: Path, row: int | None, field: str | None
) -> None:
    err = info.value
    message = str(err)
    assert str(path) in message
    assert err.path == str(path)
    assert err.row == row
    assert err.field == field
    if row is None:
        assert ", row " not in message
    else:
        assert f"row {row}" in message
    if field is not None:
        assert f"field {field!r}" in message


AZURE_OK = "2023-11-16 18:17:03.2011450,10,1\n"


MOON_OK = '{"timestamp": 0, "input_length": 10, "output_length": 1}\n'


NATIVE_HEADER = "arrival_s,prompt_tokens,output_tokens\n"
