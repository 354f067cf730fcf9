"""Tests for the package diloco_gym.sim.loaders as a whole: format detection and load_trace
(``__init__.py``), the checks every format shares (checks.py, csv_table.py: empty, missing
and unreadable files, the token bound, undecodable bytes, mutated files of every format), the
real traces, and the public import paths.

Each format's own tests: tests/sim/test_loaders_native.py, test_loaders_azure.py,
test_loaders_mooncake.py, test_loaders_burstgpt.py (shared helpers: loader_helpers.py).
The Trace itself and its windowing helpers (diloco_gym/sim/traces.py):
tests/sim/test_traces.py.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loader_helpers import (
    AZURE_HEADER,
    FIXTURES,
    MOON_OK,
    NATIVE_HEADER,
    assert_error,
    real_file,
    write,
)

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
from diloco_gym.sim.traces import Trace, TraceFormatError


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
@pytest.mark.slow
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
