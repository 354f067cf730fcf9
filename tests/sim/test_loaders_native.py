"""Tests for diloco_gym/sim/loaders/native.py: the native CSV and Parquet format, read and
written."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from loader_helpers import (
    FIXTURES,
    NATIVE_HEADER,
    assert_error,
    write,
)

from diloco_gym.sim.loaders import (
    load_native,
    load_trace,
    save_native,
)
from diloco_gym.sim.traces import Trace, TraceFormatError


def test_native_csv_fixture() -> None:
    trace = load_trace(FIXTURES / "native_small.csv")
    np.testing.assert_array_equal(trace.arrival_s, [0.0, 0.5, 2.25, 7.75])
    np.testing.assert_array_equal(trace.prompt_tokens, [100, 200, 300, 400])
    np.testing.assert_array_equal(trace.output_tokens, [10, 20, 30, 40])
    assert trace.duration_s == 10.0
    assert trace.name == "native_small"
    assert trace.network is None and trace.checkpoint is None
    assert trace.meta["format"] == "native"
    assert trace.meta["rows_read"] == 4
    assert trace.meta["path"] == str(FIXTURES / "native_small.csv")
    assert trace.meta["duration_source"] == "file"


def test_native_csv_without_metadata_infers_duration_and_ignores_extra_columns() -> None:
    trace = load_native(FIXTURES / "native_nometa.csv")
    np.testing.assert_array_equal(trace.arrival_s, [0.0, 1.5, 4.2])
    np.testing.assert_array_equal(trace.prompt_tokens, [11, 22, 33])
    np.testing.assert_array_equal(trace.output_tokens, [1, 2, 3])
    assert trace.duration_s == 5.0
    assert trace.network is None
    assert trace.meta["duration_source"] == "inferred"


def test_native_inferred_duration_when_last_arrival_is_whole(tmp_path: Path) -> None:
    path = write(tmp_path, "whole.csv", "arrival_s,prompt_tokens,output_tokens\n0,1,1\n3,1,1\n")
    assert load_native(path).duration_s == 4.0


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_native_round_trip(tmp_path: Path, suffix: str) -> None:
    rng = np.random.default_rng(0)
    arrival = np.sort(rng.uniform(0.0, 123.456, size=500))
    trace = Trace(
        arrival,
        rng.integers(0, 100_000, 500),
        rng.integers(0, 4000, 500),
        duration_s=123.456789,
        name="rt",
    )
    path = tmp_path / f"rt{suffix}"
    save_native(trace, path)
    back = load_trace(path)
    assert back == trace
    assert back.duration_s == trace.duration_s
    assert back.meta["duration_source"] == "file"
    assert back.name == "rt"


def test_native_round_trip_of_a_loaded_trace(tmp_path: Path) -> None:
    trace = load_trace(FIXTURES / "azure_small.csv")
    for name in ("a.csv", "a.parquet"):
        save_native(trace, tmp_path / name)
        assert load_native(tmp_path / name) == trace


def test_native_parquet_without_metadata_infers_duration(tmp_path: Path) -> None:
    path = tmp_path / "plain.parquet"
    pq.write_table(
        pa.table({"arrival_s": [0.0, 2.5], "prompt_tokens": [1, 2], "output_tokens": [3, 4]}), path
    )
    trace = load_native(path)
    assert trace.duration_s == 3.0
    np.testing.assert_array_equal(trace.output_tokens, [3, 4])


def test_save_native_refuses_pressure_series(tmp_path: Path) -> None:
    trace = Trace([0.0, 1.0], [1, 2], [3, 4], 2.0, network=np.array([0.1, 0.2]))
    with pytest.raises(ValueError, match="pressure"):
        save_native(trace, tmp_path / "p.csv")
    save_native(dataclasses.replace(trace, network=None), tmp_path / "p.csv")


NATIVE_BAD = [
    (
        "bad-metadata-line",
        "# length=5\n" + NATIVE_HEADER + "0,1,1\n",
        None,
        "duration_s",
        "metadata line",
    ),
    (
        "bad-duration",
        "# duration_s=-2\n" + NATIVE_HEADER + "0,1,1\n",
        None,
        "duration_s",
        "positive",
    ),
    ("negative-arrival", NATIVE_HEADER + "0,1,1\n-0.5,1,1\n", 2, "arrival_s", "negative"),
    (
        "inf-arrival",
        NATIVE_HEADER + "0,1,1\ninf,1,1\n",
        2,
        "arrival_s",
        "value inf is not a finite number",
    ),
    (
        "inf-tokens",
        NATIVE_HEADER + "0,1,1\n1,-Infinity,1\n",
        2,
        "prompt_tokens",
        "token count -Infinity is not a finite number",
    ),
    (
        "value-as-written",
        NATIVE_HEADER + "0,1,1\n1,12.50,1\n",
        2,
        "prompt_tokens",
        "token count 12.50 is not an integer",
    ),
    (
        "implausible-tokens",
        NATIVE_HEADER + "0,1,1\n1,1000000000000,1\n",
        2,
        "prompt_tokens",
        "token count 1000000000000 is too large: above the plausible maximum of 16777216",
    ),
    (
        "sorted-as-written",
        NATIVE_HEADER + "0,1,1\n2.50,1,1\n1.0e0,1,1\n",
        3,
        "arrival_s",
        "not sorted: 1.0e0 comes after 2.50",
    ),
    ("unsorted", NATIVE_HEADER + "0,1,1\n2,1,1\n1,1,1\n", 3, "arrival_s", "not sorted"),
    (
        "arrival-past-duration",
        "# duration_s=2.0\n" + NATIVE_HEADER + "0,1,1\n1.5,1,1\n2.0,1,1\n",
        3,
        "arrival_s",
        "not before duration_s",
    ),
    (
        "row-numbers-skip-metadata",
        "# duration_s=9\n" + NATIVE_HEADER + "0,1,1\n1,x,1\n",
        2,
        "prompt_tokens",
        "cannot parse 'x'",
    ),
    (
        "truncated-after-metadata",
        "# duration_s=9\n" + NATIVE_HEADER + "0,1,1\n1,1",
        2,
        "output_tokens",
        "truncated",
    ),
    (
        "too-many-fields-after-metadata",
        "# duration_s=9\n" + NATIVE_HEADER + "0,1,1\n1,1,1,1\n",
        2,
        None,
        "4 fields, header has 3",
    ),
    (
        "huge-token-count",
        NATIVE_HEADER + "0,1,1\n1,99999999999999999999,1\n",
        2,
        "prompt_tokens",
        "too large",
    ),
    ("missing-column", "arrival_s,prompt_tokens\n0,1\n", None, "output_tokens", "missing column"),
    ("metadata-only", "# duration_s=9\n", None, None, "no header"),
]


@pytest.mark.parametrize(
    ("text", "row", "field", "fragment"),
    [case[1:] for case in NATIVE_BAD],
    ids=[case[0] for case in NATIVE_BAD],
)
def test_native_csv_bad_input(
    tmp_path: Path, text: str, row: int | None, field: str | None, fragment: str
) -> None:
    path = write(tmp_path, "bad.csv", text)
    with pytest.raises(TraceFormatError, match=fragment) as info:
        load_native(path)
    assert_error(info, path, row, field)


def test_native_parquet_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"arrival_s": [0.0, 1.0], "prompt_tokens": [1, 2]}), path)
    with pytest.raises(TraceFormatError, match="missing column") as info:
        load_native(path)
    assert_error(info, path, None, "output_tokens")

    pq.write_table(
        pa.table(
            {
                "arrival_s": [0.0, 1.0, 2.0],
                "prompt_tokens": pa.array([1, 2, None], type=pa.int64()),
                "output_tokens": [1, 2, 3],
            }
        ),
        path,
    )
    with pytest.raises(TraceFormatError, match="value is missing") as info:
        load_native(path)
    assert_error(info, path, 3, "prompt_tokens")

    pq.write_table(
        pa.table({"arrival_s": [0.0, 1.0], "prompt_tokens": [1, -2], "output_tokens": [1, 2]}), path
    )
    with pytest.raises(TraceFormatError, match="negative") as info:
        load_native(path)
    assert_error(info, path, 2, "prompt_tokens")

    pq.write_table(
        pa.table({"arrival_s": ["0", "1"], "prompt_tokens": [1, 2], "output_tokens": [1, 2]}), path
    )
    with pytest.raises(TraceFormatError, match="expected a number") as info:
        load_native(path)
    assert_error(info, path, None, "arrival_s")

    table = pa.table({"arrival_s": [0.0, 3.0], "prompt_tokens": [1, 2], "output_tokens": [1, 2]})
    pq.write_table(table.replace_schema_metadata({"duration_s": "3.0"}), path)
    with pytest.raises(TraceFormatError, match="not before duration_s") as info:
        load_native(path)
    assert_error(info, path, 2, "arrival_s")

    pq.write_table(
        pa.table(
            {
                "arrival_s": pa.array([], pa.float64()),
                "prompt_tokens": pa.array([], pa.int64()),
                "output_tokens": pa.array([], pa.int64()),
            }
        ),
        path,
    )
    with pytest.raises(TraceFormatError, match="no data rows"):
        load_native(path)


CHUNKED = [
    *[case[1] for case in NATIVE_BAD],
    NATIVE_HEADER + "0,1,1\n1,1,1\n\n3,1,1\n",  # a blank line in the third chunk of one row
    NATIVE_HEADER + "0,1,1\n1,1,1\n2,1\n",  # a truncated line, read back from the file
    NATIVE_HEADER + "0,1,1\n2,1,1\n1.50,1,1\n3,1,1\n",  # unsorted across a chunk boundary
    "\ufeff# duration_s=4\n" + NATIVE_HEADER + "0,1,1\n1,1,1\n2,1,1\n5,1,1\n",  # late, BOM
    NATIVE_HEADER + "0,1,1\n1,1,1\n2,1,1\n3,1,1,\n",  # too many fields late in the file
    NATIVE_HEADER + "0,1,1\n1,1,1\n2,1,1\n3,1,1\n\n\n  \n",  # trailing blank lines: fine
    NATIVE_HEADER + "0,1,1\n1,1,1\n2,1,1\n3,1,-1\n",
    NATIVE_HEADER + "0,1,1\r\n1,1,1\r\n2,1,1\r\n3,x,1\r\n",
]


@pytest.mark.parametrize("text", CHUNKED)
def test_native_csv_in_chunks_loads_and_fails_as_in_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    """Read one or two rows at a time, a native CSV gives the same trace or the same error
    (file, row counted from the file's first data row, field and words) as in one chunk."""
    from diloco_gym.sim.loaders import csv_table

    path = write(tmp_path, "t.csv", text)

    def outcome() -> object:
        try:
            trace = load_native(path)
        except TraceFormatError as exc:
            return str(exc)
        return trace

    whole = outcome()
    for rows in (1, 2, 3):
        monkeypatch.setattr(csv_table, "CHUNK_ROWS", rows)
        assert outcome() == whole, rows


def test_native_csv_not_utf8_far_into_the_file(tmp_path: Path) -> None:
    """The UTF-8 check reads the file in blocks: a bad byte past the first block, or a
    character cut by a block's end, is placed by its offset in the text (after a BOM)."""
    from diloco_gym.sim.loaders import csv_table

    head = "\ufeff" + NATIVE_HEADER
    rows = "".join(f"{i},1,1\n" for i in range(300_000))
    path = tmp_path / "t.csv"
    offset = len((NATIVE_HEADER + rows).encode())
    path.write_bytes(head.encode() + rows.encode() + b"9\xff,1,1\n")
    with pytest.raises(TraceFormatError, match=rf"byte 0xff at offset {offset + 1}\)"):
        load_native(path)
    assert offset > 2 * csv_table._BLOCK  # past the first blocks
    # "é" (two bytes) across the first block's end is UTF-8: the row is read and refused
    text = "\ufeff" + NATIVE_HEADER + "0,1,1\n"
    pad = csv_table._BLOCK - len(text.encode()) - 1
    path.write_bytes(text.encode() + b" " * pad + "é,1,1\n".encode())
    with pytest.raises(TraceFormatError, match="cannot parse 'é' as a number") as info:
        load_native(path)
    assert info.value.row == 2
