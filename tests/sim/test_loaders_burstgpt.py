"""Tests for diloco_gym/sim/loaders/burstgpt.py: the BurstGPT CSV and its failed-request
filter."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from loader_helpers import (
    BURST_HEADER,
    FIXTURES,
    assert_error,
    write,
)

from diloco_gym.sim.loaders import (
    TraceFilterWarning,
    load_burstgpt,
    load_trace,
)
from diloco_gym.sim.traces import TraceFormatError


def test_burstgpt_fixture_filters_failed_with_warning() -> None:
    with pytest.warns(TraceFilterWarning, match="filtered 1 failed"):
        trace = load_trace(FIXTURES / "burstgpt_small.csv")
    assert trace.meta["format"] == "burstgpt"
    assert trace.meta["filtered_failed"] == 1
    assert trace.meta["rows_read"] == 4
    np.testing.assert_array_equal(trace.arrival_s, [0.0, 7.0, 15.25])
    np.testing.assert_array_equal(trace.prompt_tokens, [472, 330, 95])
    np.testing.assert_array_equal(trace.output_tokens, [18, 129, 62])
    assert trace.duration_s == 16.0


def test_burstgpt_without_failures_does_not_warn(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "b.csv",
        BURST_HEADER + "1,1,1,ChatGPT,5,6,11,API log\n2,1,1,ChatGPT,5,6,11,API log\n",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace = load_burstgpt(path)
    assert trace.meta["filtered_failed"] == 0
    np.testing.assert_array_equal(trace.arrival_s, [0.0, 1.0])


def test_burstgpt_first_row_failed_rebases_on_first_kept(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "b.csv",
        BURST_HEADER + "10,1,1,ChatGPT,5,0,5,API log\n12.5,1,1,ChatGPT,5,6,11,API log\n",
    )
    with pytest.warns(TraceFilterWarning):
        trace = load_burstgpt(path)
    np.testing.assert_array_equal(trace.arrival_s, [0.0])
    assert trace.meta["first_timestamp_s"] == 12.5


BURST_BAD = [
    (
        "bad-timestamp",
        "1,1,1,ChatGPT,5,6,11,API log\nsoon,1,1,ChatGPT,5,6,11,API log\n",
        2,
        "Timestamp",
        "cannot parse 'soon'",
    ),
    (
        "unsorted",
        "2,1,1,ChatGPT,5,6,11,API log\n1,1,1,ChatGPT,5,6,11,API log\n",
        2,
        "Timestamp",
        "not sorted",
    ),
    (
        "negative-response",
        "1,1,1,ChatGPT,5,6,11,API log\n2,1,1,ChatGPT,5,-6,11,API log\n",
        2,
        "Response tokens",
        "negative",
    ),
    ("empty-request", "1,1,1,ChatGPT,,6,11,API log\n", 1, "Request tokens", "empty value"),
    (
        "truncated-last-line",
        "1,1,1,ChatGPT,5,6,11,API log\n2,1,1,ChatGPT,5",
        2,
        "Response tokens",
        "truncated",
    ),
    (
        "all-failed",
        "1,1,1,ChatGPT,5,0,5,API log\n2,1,1,ChatGPT,5,0,5,API log\n",
        None,
        "Response tokens",
        "no successful request",
    ),
]


@pytest.mark.parametrize(
    ("body", "row", "field", "fragment"),
    [case[1:] for case in BURST_BAD],
    ids=[case[0] for case in BURST_BAD],
)
def test_burstgpt_bad_input(
    tmp_path: Path, body: str, row: int | None, field: str | None, fragment: str
) -> None:
    path = write(tmp_path, "bad.csv", BURST_HEADER + body)
    with pytest.raises(TraceFormatError, match=fragment) as info:
        load_trace(path, "burstgpt")
    assert_error(info, path, row, field)


def test_burstgpt_missing_column(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.csv", "Timestamp,Request tokens,Log Type\n1,2,API log\n")
    with pytest.raises(TraceFormatError, match="missing column") as info:
        load_trace(path)
    assert_error(info, path, None, "Response tokens")


BURST_CHUNKED = [
    *[BURST_HEADER + case[1] for case in BURST_BAD],
    BURST_HEADER
    + "".join(f"{i}.5,1,1,ChatGPT,5,{i % 3},11,API log\n" for i in range(7)),  # failed rows
    BURST_HEADER + "".join(f"{i},1,1,ChatGPT,5,0,5,API log\n" for i in range(4)),  # all failed
    BURST_HEADER + "1,1,1,ChatGPT,5,6,11,API log\n3,1,1,ChatGPT,5,6,11,API log\n"
    "2,1,1,ChatGPT,5,6,11,API log\n",  # unsorted across a boundary
]


@pytest.mark.parametrize("text", BURST_CHUNKED)
def test_burstgpt_in_chunks_loads_and_fails_as_in_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    """Read one to three rows at a time, a BurstGPT CSV gives the same trace, the same
    count of failed requests left out (and warning), or the same error."""
    from diloco_gym.sim.loaders import csv_table

    path = write(tmp_path, "t.csv", text)

    def outcome() -> object:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                trace = load_burstgpt(path)
            except TraceFormatError as exc:
                return str(exc), [str(w.message) for w in caught]
        return trace, trace.meta, [str(w.message) for w in caught]

    whole = outcome()
    for rows in (1, 2, 3):
        monkeypatch.setattr(csv_table, "CHUNK_ROWS", rows)
        assert outcome() == whole, rows
