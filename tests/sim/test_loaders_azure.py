"""Tests for diloco_gym/sim/loaders/azure.py: the Azure LLM inference trace (2023) CSV (the
leap second is in test_loader_strictness.py)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from loader_helpers import (
    AZURE_HEADER,
    AZURE_OK,
    FIXTURES,
    assert_error,
    real_file,
    write,
)

from diloco_gym.sim.loaders import (
    load_azure,
    load_trace,
)
from diloco_gym.sim.traces import TraceFormatError


def test_azure_fixture() -> None:
    trace = load_trace(FIXTURES / "azure_small.csv")
    assert trace.meta["format"] == "azure"
    # 7th fractional digit is truncated: .7011459 -> .701145
    np.testing.assert_array_equal(trace.arrival_s, [0.0, 0.5, 2.298855, 6.798855])
    np.testing.assert_array_equal(trace.prompt_tokens, [4100, 2900, 110, 2048])
    np.testing.assert_array_equal(trace.output_tokens, [12, 6, 27, 1])
    assert trace.duration_s == 7.0
    assert trace.name == "azure_small"
    assert trace.meta["rows_read"] == 4
    assert trace.meta["start_time"] == "2023-11-16 18:17:03.2011450"


def test_azure_file_without_trailing_newline(tmp_path: Path) -> None:
    path = write(
        tmp_path, "az.csv", AZURE_HEADER + "2023-11-16 18:17:03.0,5,6\n2023-11-16 18:17:04.25,7,8"
    )
    trace = load_azure(path)
    np.testing.assert_array_equal(trace.arrival_s, [0.0, 1.25])
    np.testing.assert_array_equal(trace.output_tokens, [6, 8])
    assert trace.duration_s == 2.0


def test_azure_crosses_midnight(tmp_path: Path) -> None:
    path = write(
        tmp_path, "az.csv", AZURE_HEADER + "2023-11-16 23:59:59.5,5,6\n2023-11-17 00:00:00.5,7,8\n"
    )
    np.testing.assert_array_equal(load_azure(path).arrival_s, [0.0, 1.0])


AZURE_BAD = [
    # (id, body after the header, row, field, message fragment)
    ("missing-column", None, None, "GeneratedTokens", "missing column"),
    (
        "bad-timestamp",
        AZURE_OK + "2023-11-16 18:17:xx.1,10,1\n",
        2,
        "TIMESTAMP",
        "cannot parse timestamp",
    ),
    (
        "impossible-date",
        AZURE_OK + "2023-02-30 18:17:03.1,10,1\n",
        2,
        "TIMESTAMP",
        "cannot parse timestamp",
    ),
    ("empty-timestamp", AZURE_OK + ",10,1\n", 2, "TIMESTAMP", "empty value"),
    ("empty-tokens", AZURE_OK * 2 + "2023-11-16 18:17:04,,1\n", 3, "ContextTokens", "empty value"),
    ("nan-tokens", AZURE_OK * 2 + "2023-11-16 18:17:04,NaN,1\n", 3, "ContextTokens", "NaN"),
    (
        "text-tokens",
        AZURE_OK + "2023-11-16 18:17:04,ten,1\n",
        2,
        "ContextTokens",
        "cannot parse 'ten'",
    ),
    (
        "negative-tokens",
        AZURE_OK * 3 + "2023-11-16 18:17:04,10,-1\n",
        4,
        "GeneratedTokens",
        "negative",
    ),
    (
        "fractional-tokens",
        AZURE_OK + "2023-11-16 18:17:04,10.5,1\n",
        2,
        "ContextTokens",
        "not an integer",
    ),
    (
        "unsorted",
        AZURE_OK + "2023-11-16 18:17:05,10,1\n2023-11-16 18:17:04,10,1\n",
        3,
        "TIMESTAMP",
        "not sorted",
    ),
    (
        "truncated-last-line",
        AZURE_OK * 2 + "2023-11-16 18:17:04,10",
        3,
        "GeneratedTokens",
        "truncated",
    ),
    ("blank-line-inside", AZURE_OK + "\n" + AZURE_OK, 2, "TIMESTAMP", "blank line"),
    (
        "too-many-fields",
        AZURE_OK + "2023-11-16 18:17:04,10,1,7\n",
        2,
        None,
        "4 fields, header has 3",
    ),
    ("no-data-rows", "", None, None, "no data rows"),
]


@pytest.mark.parametrize(
    ("body", "row", "field", "fragment"),
    [case[1:] for case in AZURE_BAD],
    ids=[case[0] for case in AZURE_BAD],
)
def test_azure_bad_input(
    tmp_path: Path, body: str | None, row: int | None, field: str | None, fragment: str
) -> None:
    text = (
        "TIMESTAMP,ContextTokens\n2023-11-16 18:17:03,1\n" if body is None else AZURE_HEADER + body
    )
    path = write(tmp_path, "bad.csv", text)
    with pytest.raises(TraceFormatError, match=fragment) as info:
        load_trace(path, "azure")
    assert_error(info, path, row, field)


def test_bad_row_message_format(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.csv", AZURE_HEADER + AZURE_OK * 2 + "2023-11-16 18:17:04,-3,1\n")
    with pytest.raises(TraceFormatError, match=r"bad\.csv, row 3, field 'ContextTokens': negative"):
        load_azure(path)


def test_real_azure_conv_loads_fast() -> None:
    path = real_file("AzureLLMInferenceTrace_conv.csv")
    load_azure(path)  # warm-up (imports, caches)
    start = time.perf_counter()
    load_azure(path)
    assert time.perf_counter() - start < 1.0


AZURE_CHUNKED = [
    *[AZURE_HEADER + case[1] for case in AZURE_BAD if case[1] is not None],
    AZURE_HEADER + "".join(f"2023-11-16 18:17:0{i}.5,{i + 1},2\n" for i in range(6)),
    AZURE_HEADER + "2023-11-16 18:17:01,1,1\n2023-11-16 18:17:03,1,1\n2023-11-16 18:17:02,1,1\n",
    AZURE_HEADER + "2023-11-16 18:17:01,1,1\n2023-11-16 18:17:02,1,1\n\n2023-11-16 18:17:03,1,1\n",
    AZURE_HEADER + "2023-11-16 18:17:01,1,1\n2023-11-16 18:17:02,1,1\n2023-11-16 18:17:03,1,x\n",
]


@pytest.mark.parametrize("text", AZURE_CHUNKED)
def test_azure_in_chunks_loads_and_fails_as_in_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    """Read one to three rows at a time, an Azure CSV gives the same trace (and
    ``start_time``) or the same error, rows counted from the file's first data row."""
    from diloco_gym.sim.loaders import csv_table

    path = write(tmp_path, "t.csv", text)

    def outcome() -> object:
        try:
            trace = load_azure(path)
        except TraceFormatError as exc:
            return str(exc)
        return trace, trace.meta

    whole = outcome()
    for rows in (1, 2, 3):
        monkeypatch.setattr(csv_table, "CHUNK_ROWS", rows)
        assert outcome() == whole, rows
