"""Tests for diloco_gym/sim/loaders/mooncake.py: the Mooncake JSON Lines trace and its
bucket spreading."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from loader_helpers import (
    FIXTURES,
    MOON_OK,
    assert_error,
    real_file,
    write,
)

from diloco_gym.sim.loaders import (
    load_mooncake,
    load_trace,
)
from diloco_gym.sim.traces import TraceFormatError


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
