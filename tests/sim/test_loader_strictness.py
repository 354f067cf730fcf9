"""Loader corner cases: a leap second, a huge span, a duplicated column or JSON key, and the
one-line warning for filtered rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from diloco_gym.sim.loaders import load_trace
from diloco_gym.sim.traces import TraceFormatError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_a_leap_second_keeps_its_place(tmp_path):
    """``23:59:60.2`` was reported as "not sorted" (it rolled over into the next minute)."""
    path = tmp_path / "leap.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2016-12-31 23:59:59.5,1,1\n2016-12-31 23:59:60.2,2,2\n2017-01-01 00:00:00.1,3,3\n"
    )
    tr = load_trace(path, "azure")
    np.testing.assert_allclose(tr.arrival_s, [0.0, 0.499999, 0.6])
    assert list(tr.prompt_tokens) == [1, 2, 3]


def test_a_huge_span_loads_and_says_how_long_it_is(tmp_path):
    """A 977-year Azure span blamed ``arrival_s`` through a float-precision artefact (the
    window end rounded onto the last arrival)."""
    path = tmp_path / "span.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "1046-01-01 00:00:00,1,1\n2023-11-16 18:17:03,1,1\n"
    )
    tr = load_trace(path, "azure")
    assert tr.duration_s > tr.arrival_s[-1] == pytest.approx(3.0858776223e10)
    from diloco_gym.sim.limits import LimitError
    from diloco_gym.sim.traces import tile_starts

    with pytest.raises(LimitError, match=r"a trace of 3\.08588e\+10 s"):
        tile_starts(tr.duration_s, 600.0)


@pytest.mark.parametrize(
    ("header", "fmt", "column"),
    [
        ("arrival_s,prompt_tokens,output_tokens,arrival_s", "native", "arrival_s"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens", "azure", "ContextTokens"),
    ],
)
def test_a_duplicated_column_is_refused(tmp_path, header, fmt, column):
    row = "1,1,1,5" if fmt == "native" else "2023-11-16 18:17:03,1,1,7"
    path = tmp_path / "dup.csv"
    path.write_text(f"{header}\n{row}\n")
    with pytest.raises(TraceFormatError) as err:
        load_trace(path, fmt)
    assert err.value.field == column and "appears 2 times in the header" in str(err.value)


def test_a_duplicated_jsonl_key_is_refused(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 5, "output_length": 5}\n'
        '{"timestamp": 3000, "input_length": 5, "input_length": 9, "output_length": 5}\n'
    )
    with pytest.raises(TraceFormatError, match="row 2: invalid JSON.*duplicate key 'input_length'"):
        load_trace(path, "mooncake")


def test_filtered_rows_warn_in_one_line(tmp_path, capsys):
    """BurstGPT's TraceFilterWarning reached the terminal as a raw two-line warning."""
    from diloco_gym import cli

    with pytest.raises(SystemExit):  # the 16 s fixture holds no window; the warning comes first
        cli.main(["run", "--agent", "fixed-256", "--trace", str(FIXTURES / "burstgpt_small.csv")])
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == (
        f"diloco-gym: warning: {FIXTURES / 'burstgpt_small.csv'}: filtered 1 failed "
        "request(s) ('Response tokens' == 0) out of 4 rows"
    )
    assert len(err) == 2 and "TraceFilterWarning" not in "\n".join(err)
