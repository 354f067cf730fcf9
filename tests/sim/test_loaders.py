"""Tests for the package diloco_gym.sim.loaders (and the windowing helpers of
diloco_gym.sim.traces), through its public names.

Where each module's behaviour is tested (test name prefixes): ``native`` (native.py:
``test_native_*``, ``test_save_native_*``), ``azure`` (azure.py: ``test_azure_*``, the leap
second in test_loader_strictness.py), ``mooncake`` (mooncake.py: ``test_mooncake_*``,
``test_real_mooncake_*``), ``burstgpt`` (burstgpt.py: ``test_burstgpt_*``), format
detection and dispatch (``__init__.py``: ``test_detect_format*``, ``test_*_format*``), the
shared checks (checks.py, csv_table.py: ``test_empty_file``, ``test_missing_file``,
``test_unreadable_paths``, ``test_token_bound_*``, the mutated-file property tests).
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diloco_gym.sim.loaders import (
    DEFAULT_MAX_TOKENS,
    FORMATS,
    MAX_TOKENS_ENV,
    TraceFilterWarning,
    detect_format,
    load_azure,
    load_burstgpt,
    load_mooncake,
    load_native,
    load_trace,
    max_tokens_bound,
    save_native,
)
from diloco_gym.sim.traces import Trace, TraceFormatError, random_window, scale_rate, window

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


# ------------------------------------------------------------------------- small fixtures


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


def test_mooncake_fixture() -> None:
    trace = load_trace(FIXTURES / "mooncake_small.jsonl", seed=7)
    assert trace.meta["format"] == "mooncake"
    assert trace.meta["bucket_s"] == 3.0
    assert trace.meta["seed"] == 7
    assert trace.meta["num_buckets"] == 4
    assert trace.meta["rows_read"] == 7
    np.testing.assert_array_equal(trace.prompt_tokens, [100, 200, 300, 400, 500, 600, 700])
    np.testing.assert_array_equal(trace.output_tokens, [10, 20, 30, 40, 50, 60, 70])
    assert trace.duration_s == 15.0  # last bucket 12 s + 3 s
    a = trace.arrival_s
    assert np.all(np.diff(a) >= 0)
    assert np.all((a[:3] >= 0.0) & (a[:3] < 3.0))
    # the 3000 ms bucket ends at the next bucket start (5.999 s), not at 6 s
    assert 3.0 <= a[3] < 5.999
    assert np.all((a[4:6] >= 5.999) & (a[4:6] < 8.999))
    assert 12.0 <= a[6] < 15.0


def test_mooncake_spreading_is_the_sorted_seeded_draws() -> None:
    trace = load_mooncake(FIXTURES / "mooncake_small.jsonl", seed=3)
    u = np.random.default_rng(3).random(7)
    expected = np.concatenate(
        [
            np.sort(u[:3]) * 3.0,
            3.0 + u[3:4] * (5.999 - 3.0),
            5.999 + np.sort(u[4:6]) * 3.0,
            12.0 + u[6:] * 3.0,
        ]
    )
    np.testing.assert_allclose(trace.arrival_s, expected, rtol=0, atol=1e-12)


def test_mooncake_seed_determinism() -> None:
    path = FIXTURES / "mooncake_small.jsonl"
    a, b, c = load_mooncake(path, seed=1), load_mooncake(path, seed=1), load_mooncake(path, seed=2)
    assert a == b
    assert not np.array_equal(a.arrival_s, c.arrival_s)


def test_mooncake_bucket_width_parameter() -> None:
    trace = load_mooncake(FIXTURES / "mooncake_small.jsonl", bucket_s=1.0)
    assert trace.meta["bucket_s"] == 1.0
    assert np.all(trace.arrival_s[:3] < 1.0)
    assert 3.0 <= trace.arrival_s[3] < 4.0
    assert trace.duration_s == 13.0
    with pytest.raises(ValueError, match="bucket_s"):
        load_mooncake(FIXTURES / "mooncake_small.jsonl", bucket_s=0.0)


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


# ------------------------------------------------------------------------- format dispatch


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("native_small.csv", "native"),
        ("native_nometa.csv", "native"),
        ("azure_small.csv", "azure"),
        ("mooncake_small.jsonl", "mooncake"),
        ("burstgpt_small.csv", "burstgpt"),
    ],
)
def test_detect_format(name: str, fmt: str) -> None:
    assert detect_format(FIXTURES / name) == fmt


def test_detect_format_by_content_and_parquet(tmp_path: Path) -> None:
    jsonl = tmp_path / "moon.txt"
    jsonl.write_text((FIXTURES / "mooncake_small.jsonl").read_text())
    assert detect_format(jsonl) == "mooncake"
    trace = load_native(FIXTURES / "native_small.csv")
    save_native(trace, tmp_path / "t.parquet")
    assert detect_format(tmp_path / "t.parquet") == "native"
    (tmp_path / "t.bin").write_bytes((tmp_path / "t.parquet").read_bytes())
    assert detect_format(tmp_path / "t.bin") == "native"


def test_explicit_format_matches_auto() -> None:
    for name, fmt in [("azure_small.csv", "azure"), ("native_small.csv", "native")]:
        assert load_trace(FIXTURES / name, fmt) == load_trace(FIXTURES / name)


def test_unknown_format_name() -> None:
    with pytest.raises(ValueError, match="valid formats: auto, native, azure, mooncake, burstgpt"):
        load_trace(FIXTURES / "azure_small.csv", "splitwise")
    assert FORMATS == ("native", "azure", "mooncake", "burstgpt")


def test_undetectable_format(tmp_path: Path) -> None:
    path = write(tmp_path, "x.csv", "a,b,c\n1,2,3\n")
    with pytest.raises(TraceFormatError, match="cannot detect") as info:
        load_trace(path)
    assert str(path) in str(info.value)


def test_wrong_explicit_format_reports_missing_column() -> None:
    with pytest.raises(TraceFormatError, match="field 'TIMESTAMP'"):
        load_trace(FIXTURES / "native_small.csv", "azure")


# ------------------------------------------------------------------------- native round trip


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


# ------------------------------------------------------------------------- bad input


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


@pytest.mark.parametrize("loader", [load_azure, load_burstgpt, load_native, load_mooncake])
def test_empty_file(tmp_path: Path, loader) -> None:
    path = write(tmp_path, "empty.csv", "")
    with pytest.raises(TraceFormatError, match="empty file") as info:
        loader(path)
    assert_error(info, path, None, None)
    with pytest.raises(TraceFormatError, match="empty file"):
        load_trace(path)


@pytest.mark.parametrize("name", ["missing.csv", "missing.jsonl", "missing.parquet"])
def test_missing_file(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    with pytest.raises(TraceFormatError, match="cannot read: ") as info:
        load_trace(path)
    assert_error(info, path, None, None)


def test_unreadable_paths(tmp_path: Path) -> None:
    for fmt in FORMATS:
        with pytest.raises(TraceFormatError, match="cannot read: "):
            load_trace(tmp_path, fmt)  # a directory
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not a parquet file at all")
    with pytest.raises(TraceFormatError, match="cannot read: "):
        load_trace(junk)
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"TIMESTAMP,ContextTokens,GeneratedTokens\n\xff\xfe\x00,1,2\n")
    with pytest.raises(TraceFormatError, match="cannot read: "):
        load_azure(binary)


MOON_OK = '{"timestamp": 0, "input_length": 10, "output_length": 1}\n'

MOONCAKE_BAD = [
    ("truncated-last-line", MOON_OK * 2 + '{"timestamp": 3000, "input_len', 3, None, "truncated"),
    ("invalid-json-inside", MOON_OK + "{oops}\n" + MOON_OK, 2, None, "invalid JSON"),
    ("not-an-object", MOON_OK + "[1, 2, 3]\n", 2, None, "JSON object"),
    (
        "missing-key",
        MOON_OK + '{"timestamp": 0, "output_length": 1}\n',
        2,
        "input_length",
        "missing key",
    ),
    (
        "string-value",
        MOON_OK + '{"timestamp": "3000", "input_length": 1, "output_length": 1}\n',
        2,
        "timestamp",
        "expected an integer",
    ),
    (
        "null-value",
        MOON_OK + '{"timestamp": 0, "input_length": null, "output_length": 1}\n',
        2,
        "input_length",
        "expected an integer",
    ),
    (
        "nan-value",
        MOON_OK + '{"timestamp": 0, "input_length": NaN, "output_length": 1}\n',
        2,
        "input_length",
        "NaN is not a finite number",
    ),
    (
        "infinity-value",
        MOON_OK + '{"timestamp": 0, "input_length": 1, "output_length": -Infinity}\n',
        2,
        "output_length",
        "-Infinity is not a finite number",
    ),
    (
        "fractional",
        MOON_OK + '{"timestamp": 0, "input_length": 1, "output_length": 2.5}\n',
        2,
        "output_length",
        "not an integer",
    ),
    (
        "negative",
        MOON_OK * 2 + '{"timestamp": 0, "input_length": -4, "output_length": 1}\n',
        3,
        "input_length",
        "negative",
    ),
    (
        "unsorted",
        '{"timestamp": 3000, "input_length": 1, "output_length": 1}\n' + MOON_OK,
        2,
        "timestamp",
        "not sorted",
    ),
    (
        "error-row-counts-blank-lines",
        MOON_OK + "\n\n" + MOON_OK.replace("10", "1.5"),
        4,
        "input_length",
        "1.5 is not an integer",
    ),
    (
        "huge-tokens",
        MOON_OK + '{"timestamp": 0, "input_length": 1000000000000, "output_length": 1}\n',
        2,
        "input_length",
        "1000000000000 is too large",
    ),
    (
        "huge-timestamp",
        MOON_OK + '{"timestamp": 1e300, "input_length": 1, "output_length": 1}\n',
        2,
        "timestamp",
        "timestamp 1e300 is too large",
    ),
    (
        "value-as-written",
        MOON_OK + '{"timestamp": 0, "input_length": 1.0e1, "output_length": 12.50}\n',
        2,
        "output_length",
        "12.50 is not an integer",
    ),
    (
        "string-shown-as-written",
        MOON_OK + '{"timestamp": 0, "input_length": "7", "output_length": 1}\n',
        2,
        "input_length",
        'got "7"',
    ),
    ("only-blank-lines", "\n \n\n", None, None, "empty file"),
]


@pytest.mark.parametrize(
    ("body", "row", "field", "fragment"),
    [case[1:] for case in MOONCAKE_BAD],
    ids=[case[0] for case in MOONCAKE_BAD],
)
def test_mooncake_bad_input(
    tmp_path: Path, body: str, row: int, field: str | None, fragment: str
) -> None:
    path = write(tmp_path, "bad.jsonl", body)
    with pytest.raises(TraceFormatError, match=fragment) as info:
        load_trace(path)
    assert_error(info, path, row, field)


def test_mooncake_integral_floats_and_trailing_blank_lines_are_accepted(tmp_path: Path) -> None:
    path = write(
        tmp_path, "ok.jsonl", '{"timestamp": 0.0, "input_length": 5.0, "output_length": 1}\n\n\n'
    )
    trace = load_mooncake(path)
    assert trace.num_requests == 1 and trace.prompt_tokens[0] == 5


def test_mooncake_blank_lines_are_skipped(tmp_path: Path) -> None:
    """A blank line (inside, or trailing as many writers leave) is skipped, as JSON Lines
    readers do; rows_read counts the records."""
    path = write(tmp_path, "gaps.jsonl", MOON_OK + "\n  \n" + MOON_OK.replace("10", "7") + "\n")
    trace = load_trace(path)
    assert trace.num_requests == 2 and trace.meta["rows_read"] == 2
    assert trace.prompt_tokens.tolist() == [10, 7]


def test_token_bound_is_configurable(tmp_path: Path, monkeypatch) -> None:
    text = NATIVE_HEADER + "0,1,1\n1,100,1\n"
    path = write(tmp_path, "n.csv", text)
    assert max_tokens_bound() == DEFAULT_MAX_TOKENS == 2**24
    with pytest.raises(
        TraceFormatError, match="100 is too large: above the plausible maximum of 99 "
    ) as info:
        load_trace(path, max_tokens=99)
    assert_error(info, path, 2, "prompt_tokens")
    assert load_trace(path, max_tokens=100).prompt_tokens.max() == 100
    monkeypatch.setenv(MAX_TOKENS_ENV, "50")
    assert max_tokens_bound() == 50
    for fmt_path in (path, write(tmp_path, "m.jsonl", MOON_OK.replace("10", "100"))):
        with pytest.raises(TraceFormatError, match="above the plausible maximum of 50 "):
            load_trace(fmt_path)
    monkeypatch.setenv(MAX_TOKENS_ENV, "many")
    with pytest.raises(ValueError, match="DILOCO_GYM_MAX_TOKENS must be an integer"):
        load_trace(path)
    with pytest.raises(ValueError, match="max_tokens must be an integer in"):
        load_trace(path, max_tokens=0)


def test_detection_never_prints_undecoded_bytes(tmp_path: Path) -> None:
    binary = tmp_path / "blob.csv"
    binary.write_bytes(b"TIMESTAMP,\xff\xfeContext\x00\n1,2\n")
    with pytest.raises(
        TraceFormatError, match=r"not UTF-8 text \(byte 0xff at offset 10\)"
    ) as info:
        load_trace(binary)
    assert "\ufffd" not in str(info.value) and "\xff" not in str(info.value)
    gz = tmp_path / "trace.csv.gz"
    gz.write_bytes(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff")
    with pytest.raises(TraceFormatError, match="gzip-compressed file; decompress it first"):
        load_trace(gz)
    control = write(tmp_path, "ctl.csv", "a\x07b,c\n1,2\n")
    with pytest.raises(TraceFormatError, match=r"header 'a\\x07b,c'"):
        load_trace(control)
    # A multi-byte character cut at the end of the 64 KiB head is not "binary".
    cut = tmp_path / "cut.csv"
    cut.write_bytes(AZURE_HEADER.encode() + b"x" * (65536 - len(AZURE_HEADER) - 1) + "é".encode())
    assert detect_format(cut) == "azure"


def test_trace_with_nan_tokens_says_not_finite() -> None:
    """NaN used to be cast to int64 first and reported as a negative token count."""
    with pytest.raises(TraceFormatError, match="token count nan is not a finite number") as info:
        Trace([0.0, 1.0], [1.0, float("nan")], [1, 1], 2.0)
    assert (info.value.row, info.value.field) == (2, "prompt_tokens")
    with pytest.raises(TraceFormatError, match="inf is not a finite number"):
        Trace([0.0], [1], [float("inf")], 2.0)
    with pytest.raises(TraceFormatError, match="not an integer"):
        Trace([0.0], [1.5], [1], 2.0)
    with pytest.raises(TraceFormatError, match="fit int64"):
        Trace([0.0], [10**30], [1], 2.0)


NATIVE_HEADER = "arrival_s,prompt_tokens,output_tokens\n"

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


# ------------------------------------------------------------------------- real traces


REAL_CASES = [
    ("AzureLLMInferenceTrace_code.csv", "azure", 8819, 2.57),
    ("AzureLLMInferenceTrace_conv.csv", "azure", 19366, 5.53),
    ("mooncake_conversation_trace.jsonl", "mooncake", 12031, 3.40),
]


@pytest.mark.parametrize(
    ("name", "fmt", "rows", "rate"), REAL_CASES, ids=[case[0] for case in REAL_CASES]
)
def test_real_trace(name: str, fmt: str, rows: int, rate: float) -> None:
    path = real_file(name)
    start = time.perf_counter()
    trace = load_trace(path)
    elapsed = time.perf_counter() - start
    assert trace.meta["format"] == fmt
    assert trace.num_requests == rows == trace.meta["rows_read"]
    assert trace.mean_rate_rps == pytest.approx(rate, rel=0.05)
    assert trace.arrival_s[0] >= 0.0 and np.all(np.diff(trace.arrival_s) >= 0)
    assert trace.prompt_tokens.min() >= 0 and trace.output_tokens.min() >= 0
    assert elapsed < 2.0  # generous bound for slow CI; typically well under 0.2 s


def test_real_azure_conv_loads_fast() -> None:
    path = real_file("AzureLLMInferenceTrace_conv.csv")
    load_azure(path)  # warm-up (imports, caches)
    start = time.perf_counter()
    load_azure(path)
    assert time.perf_counter() - start < 1.0


def test_real_mooncake_spreading_stays_in_buckets() -> None:
    path = real_file("mooncake_conversation_trace.jsonl")
    a, b = load_mooncake(path, seed=0), load_mooncake(path, seed=1)
    assert a == load_mooncake(path, seed=0)
    assert not np.array_equal(a.arrival_s, b.arrival_s)
    np.testing.assert_array_equal(a.prompt_tokens, b.prompt_tokens)
    stamps = (
        np.array(
            [
                int(line.split('"timestamp": ')[1].split(",")[0])
                for line in path.read_text().splitlines()
            ]
        )
        / 1000.0
    )
    starts = np.unique(stamps)
    nxt = np.append(starts[1:], np.inf)[np.searchsorted(starts, stamps)]
    for trace in (a, b):
        assert np.all(trace.arrival_s >= stamps)
        assert np.all(trace.arrival_s < np.minimum(stamps + 3.0, nxt))
    assert a.meta["num_buckets"] == 1180


# ------------------------------------------------------------------------- windowing


def test_window_of_fixture() -> None:
    trace = load_native(FIXTURES / "native_small.csv")  # arrivals 0, 0.5, 2.25, 7.75 in 10 s
    cut = window(trace, 0.5, 5.0)
    np.testing.assert_array_equal(cut.arrival_s, [0.0, 1.75])
    np.testing.assert_array_equal(cut.prompt_tokens, [200, 300])
    np.testing.assert_array_equal(cut.output_tokens, [20, 30])
    assert cut.duration_s == 5.0
    assert cut.meta["window_start_s"] == 0.5
    assert cut.meta["path"] == trace.meta["path"]


def test_empty_window_raises() -> None:
    trace = load_native(FIXTURES / "native_small.csv")
    with pytest.raises(TraceFormatError, match="is empty") as info:
        window(trace, 3.0, 4.0)
    assert trace.meta["path"] in str(info.value)
    with pytest.raises(TraceFormatError, match="not inside"):
        window(trace, 8.0, 5.0)


def test_random_window_is_seeded_and_inside() -> None:
    trace = load_azure(FIXTURES / "azure_small.csv")
    a = random_window(trace, 3.0, np.random.default_rng(5))
    b = random_window(trace, 3.0, np.random.default_rng(5))
    assert a == b
    assert a.duration_s == 3.0 and a.num_requests >= 1
    assert np.all((a.arrival_s >= 0) & (a.arrival_s < 3.0))
    assert 0.0 <= a.meta["window_start_s"] <= trace.duration_s - 3.0
    with pytest.raises(TraceFormatError, match="shorter"):
        random_window(trace, 30.0, np.random.default_rng(0))


@pytest.mark.parametrize("target", [0.25, 1.0, 40.0])
def test_scale_rate_keeps_requests_and_hits_target(target: float) -> None:
    trace = load_mooncake(FIXTURES / "mooncake_small.jsonl")
    scaled = scale_rate(trace, target)
    assert scaled.num_requests == trace.num_requests
    np.testing.assert_array_equal(scaled.prompt_tokens, trace.prompt_tokens)
    np.testing.assert_array_equal(scaled.output_tokens, trace.output_tokens)
    assert scaled.mean_rate_rps == pytest.approx(target, rel=1e-12)
    assert np.all(np.diff(scaled.arrival_s) >= 0)
    assert scaled.arrival_s[-1] < scaled.duration_s
    with pytest.raises(ValueError):
        scale_rate(trace, 0.0)


# ------------------------------------------------------------------------- property test

# Fragments that tend to break parsers: special numbers, huge values, separators, quotes,
# control and non-UTF-8 bytes, JSON syntax.
_NASTY = [
    b"nan",
    b"NaN",
    b"-inf",
    b"Infinity",
    b"1e999",
    b"-1",
    b"1.5",
    b"99999999999999999999",
    b"1000000000000",
    b"",
    b",",
    b",,",
    b'"',
    b"\n",
    b"\r\n",
    b"\r",
    b"\x00",
    b"\xff",
    b"\xc3",
    b"{",
    b"}",
    b"[",
    b"]",
    b":",
    b"null",
    b"true",
    b"# duration_s=0\n",
    b"# duration_s=nan\n",
    b"\xef\xbb\xbf",
    b"2023-02-30 25:61:61.1",
    b" ",
    b"\t",
    b"0",
]


@st.composite
def _mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` with a few random edits: replace, insert or delete a slice, truncate,
    duplicate or swap lines."""
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["replace", "insert", "delete", "truncate", "lines"]))
        n = len(data)
        at = draw(st.integers(0, n))
        if kind == "truncate":
            data = data[:at]
            continue
        if kind == "lines":
            lines = data.split(b"\n")
            i = draw(st.integers(0, len(lines) - 1))
            j = draw(st.integers(0, len(lines) - 1))
            if draw(st.booleans()):
                lines.insert(j, lines[i])
            else:
                lines[i], lines[j] = lines[j], lines[i]
            data = b"\n".join(lines)
            continue
        piece = draw(st.one_of(st.sampled_from(_NASTY), st.binary(max_size=6)))
        end = min(n, at + draw(st.integers(0, 8)))
        if kind == "replace":
            data = data[:at] + piece + data[end:]
        elif kind == "insert":
            data = data[:at] + piece + data[at:]
        else:
            data = data[:at] + data[end:]
    return data


def _native_parquet_bytes() -> bytes:
    sink = pa.BufferOutputStream()
    table = pa.table(
        {"arrival_s": [0.0, 1.5, 2.25], "prompt_tokens": [10, 20, 30], "output_tokens": [1, 2, 3]}
    )
    pq.write_table(table.replace_schema_metadata({"duration_s": "5.0"}), sink)
    return sink.getvalue().to_pybytes()


_SEEDS = {
    "native": ("native_small.csv", ".csv"),
    "azure": ("azure_small.csv", ".csv"),
    "mooncake": ("mooncake_small.jsonl", ".jsonl"),
    "burstgpt": ("burstgpt_small.csv", ".csv"),
}


def _load_or_format_error(path: Path, fmt: str) -> None:
    """Load ``path`` both as ``fmt`` and auto-detected: a Trace or a TraceFormatError only."""
    for choice in (fmt, "auto"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TraceFilterWarning)
            try:
                trace = load_trace(path, choice)
            except TraceFormatError as exc:
                assert str(exc).startswith(str(path)), exc
                assert "\ufffd" not in str(exc), exc  # never undecoded bytes
                continue
        assert isinstance(trace, Trace) and trace.num_requests >= 1


@pytest.mark.parametrize(
    ("blob", "fragment"),
    [
        (
            b"20\r23-11-16 18:17:05.5,110,27\n2023-11-16 18:17:03.2011450,4808,10\n",
            "cannot detect the trace format",
        ),
        (b"T\rimestamp,Request tokens,Response tokens\n5,472,18\n", "missing column 'Timestamp'"),
    ],
    ids=["cr-in-first-field", "cr-in-header"],
)
def test_carriage_return_in_first_line_is_a_format_error(
    tmp_path: Path, blob: bytes, fragment: str
) -> None:
    """Found by the property test: the csv module raised its own error on a bare CR."""
    path = tmp_path / "cr.csv"
    path.write_bytes(blob)
    with pytest.raises(TraceFormatError, match=fragment):
        load_trace(path)


@pytest.mark.parametrize("fmt", list(_SEEDS))
@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_mutated_files_load_or_raise_trace_format_error(
    tmp_path: Path, fmt: str, data: st.DataObject
) -> None:
    """Random mutations of a valid file in each format either load or raise the documented
    TraceFormatError, never any other exception."""
    name, suffix = _SEEDS[fmt]
    original = (FIXTURES / name).read_bytes()
    path = tmp_path / f"mutant{suffix}"
    path.write_bytes(data.draw(_mutated(original)))
    _load_or_format_error(path, fmt)


@settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_mutated_parquet_files_load_or_raise_trace_format_error(
    tmp_path: Path, data: st.DataObject
) -> None:
    path = tmp_path / "mutant.parquet"
    path.write_bytes(data.draw(_mutated(_native_parquet_bytes())))
    _load_or_format_error(path, "native")


def test_every_public_name_is_importable_from_the_package_and_its_module() -> None:
    """The package re-exports each format's reader from that format's module (the old
    single-module import paths keep working)."""
    from diloco_gym.sim import loaders
    from diloco_gym.sim.loaders import azure, burstgpt, checks, mooncake, native

    assert loaders.load_native is native.load_native
    assert loaders.save_native is native.save_native
    assert loaders.load_azure is azure.load_azure
    assert loaders.load_mooncake is mooncake.load_mooncake
    assert loaders.load_burstgpt is burstgpt.load_burstgpt
    assert loaders.max_tokens_bound is checks.max_tokens_bound
    assert loaders.TraceFilterWarning is checks.TraceFilterWarning
    for name in loaders.__all__:
        assert hasattr(loaders, name), name
