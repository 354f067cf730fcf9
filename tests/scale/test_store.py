"""A sweep's store of finished cells (``cells.jsonl``): a line that is not a cell record,
anywhere in the file, costs only its own cell. The cells after it are kept, the line is
moved to ``cells.rejected.jsonl`` with a warning naming the file and the line, and a
resumed sweep runs the rejected line's cell again."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from diloco_gym.cli import main
from diloco_gym.scale import sweep
from diloco_gym.scale.sweep import CellStore

REJECTED_FILE = "cells.rejected.jsonl"


def _rec(i: int) -> dict:
    return {"key": f"unit/{i:04d}", "ok": True, "result": {"rows": [{"seed": i}]}}


def _lines(*recs: object) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in recs)


def _load(path: Path) -> tuple[CellStore, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = CellStore(path)
    kind = getattr(sweep, "SweepStoreWarning", Warning)  # Warning: the code before the fix
    return store, [str(w.message) for w in caught if issubclass(w.category, kind)]


def test_a_corrupted_middle_line_keeps_every_other_cell_and_names_the_line(tmp_path):
    path = tmp_path / "cells.jsonl"
    bad = b'{"key": "unit/0002", "ok": tr'
    path.write_bytes(_lines(_rec(1), bad, _rec(3), _rec(4)))
    store, msgs = _load(path)
    assert sorted(store.records) == ["unit/0001", "unit/0003", "unit/0004"]
    assert len(msgs) == 1
    assert msgs[0].startswith(f"{path} line 2: not a cell record: not JSON")
    assert "runs again" in msgs[0] and "\n" not in msgs[0]
    # The line is kept aside, not lost; the store holds only records, so appends go on.
    assert (tmp_path / REJECTED_FILE).read_bytes() == bad + b"\n"
    assert path.read_bytes() == _lines(_rec(1), _rec(3), _rec(4))
    store.add(_rec(2))
    again, msgs = _load(path)
    assert sorted(again.records) == [f"unit/{i:04d}" for i in (1, 2, 3, 4)] and msgs == []


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ({}, "no cell key"),
        ([1, 2], "a JSON list, not an object"),
        ({"key": "unit/x", "ok": "yes"}, "'ok' must be true or false"),
        ({"key": "unit/x", "ok": True}, "without its result (rows)"),
        ({"key": "unit/x", "ok": True, "result": {"rows": [1]}}, "rows are not objects"),
        ({"key": "cal/x", "ok": True, "result": {"rows": []}}, "without its result (sim)"),
        ({"key": "unit/x", "ok": False}, "without its 'error'"),
        ({"key": "other/x", "ok": True, "result": {}}, "no cell key"),
    ],
)
def test_a_line_that_is_json_but_no_cell_record_is_set_aside(tmp_path, line, why):
    """``{}`` used to end the sweep with ``diloco-gym: key``; a record without what the
    outputs read would fail later, when the outputs are written."""
    path = tmp_path / "cells.jsonl"
    path.write_bytes(_lines(_rec(1), line, _rec(3)))
    store, msgs = _load(path)
    assert sorted(store.records) == ["unit/0001", "unit/0003"]
    assert len(msgs) == 1 and msgs[0].startswith(f"{path} line 2: not a cell record: ")
    assert why in msgs[0]


def test_a_half_written_last_line_is_cut_off_with_a_warning(tmp_path):
    path = tmp_path / "cells.jsonl"
    path.write_bytes(_lines(_rec(1), _rec(2)) + b'{"key": "unit/0003", "ok": tr')
    store, msgs = _load(path)
    assert sorted(store.records) == ["unit/0001", "unit/0002"]
    assert path.read_bytes() == _lines(_rec(1), _rec(2))
    assert msgs == [
        f"{path} line 3: a half-written last record (an interrupted run) was dropped; "
        f"its cell runs again"
    ]
    assert not (tmp_path / REJECTED_FILE).exists()


SPEC = """
name = "t"
agents = ["fixed-512"]
seeds = 3
draws = 10
[grid]
regime = ["bursty"]
merge_budget = [8]
"""


@pytest.mark.slow
def test_a_resumed_sweep_reruns_only_the_rejected_cells(tmp_path, capsys):
    cfg = tmp_path / "s.toml"
    cfg.write_text(SPEC)
    out = tmp_path / "out"
    assert main(["sweep", str(cfg), "--out", str(out), "--no-progress"]) == 0
    whole = {n: (out / n).read_bytes() for n in ("results.csv", "summary.csv", "summary.md")}
    lines = (out / "cells.jsonl").read_bytes().splitlines(keepends=True)
    assert len(lines) == 4  # a calibration cell and three units
    lines[1] = lines[1][:40] + b"\n"  # a record cut in the middle of the file
    lines[2] = b"{}\n"
    (out / "cells.jsonl").write_bytes(b"".join(lines))
    capsys.readouterr()
    assert main(["sweep", str(cfg), "--out", str(out), "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "2 run now, 2 stored before, 0 failed; complete" in captured.out
    warned = [ln for ln in captured.err.splitlines() if ln.startswith("diloco-gym: warning:")]
    assert [w.split(": not a cell record")[0] for w in warned] == [
        f"diloco-gym: warning: {out / 'cells.jsonl'} line 2",
        f"diloco-gym: warning: {out / 'cells.jsonl'} line 3",
    ]
    assert {n: (out / n).read_bytes() for n in whole} == whole
    assert len((out / "cells.jsonl").read_bytes().splitlines()) == 4


def test_the_rejected_file_name_is_the_modules():
    assert sweep.REJECTED_FILE == REJECTED_FILE
