"""Size limits: a small file or one option never makes the package exhaust the machine.

Every case that could allocate without bound runs in a subprocess under an address-space
cap (``resource.setrlimit(RLIMIT_AS)``), so a regression fails here (a ``MemoryError`` or
a kill) instead of taking the shared machine down.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from diloco_gym.sim import limits
from diloco_gym.sim.loaders import load_trace
from diloco_gym.sim.traces import TraceFormatError, tile_starts

ROOT = Path(__file__).resolve().parents[2]
#: Address-space cap of the subprocesses: far above what a refused input needs (importing
#: numpy, pandas and gymnasium), far below what the unbounded cases allocated (21-24 GB).
CAP_BYTES = 3 * 2**30


def _capped(args: list[str], cwd: Path, env: dict | None = None, timeout: float = 120):
    """Run ``python ARGS`` from this checkout under :data:`CAP_BYTES` of address space."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (CAP_BYTES, CAP_BYTES))

    full_env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1")
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=cap,
        check=False,
    )


def _native(path: Path, duration: str, rows: str = "1,10,10\n") -> Path:
    path.write_text(f"# duration_s={duration}\narrival_s,prompt_tokens,output_tokens\n{rows}")
    return path


# ----------------------------------------------------------------- the limit helpers


def test_check_limit_names_value_limit_and_variable(monkeypatch):
    monkeypatch.delenv("DILOCO_GYM_MAX_WINDOWS", raising=False)
    limits.check_limit("WINDOWS", 2_000, "windows")  # at the limit: fine
    with pytest.raises(limits.LimitError) as err:
        limits.check_limit("WINDOWS", 2_001, "the trace's windows")
    msg = str(err.value)
    assert "the trace's windows: 2,001" in msg and "2,000" in msg
    assert "DILOCO_GYM_MAX_WINDOWS" in msg and "\n" not in msg
    with pytest.raises(limits.LimitError):
        limits.check_limit("WINDOWS", float("nan"), "windows")
    monkeypatch.setenv("DILOCO_GYM_MAX_WINDOWS", "5000")
    limits.check_limit("WINDOWS", 2_001, "windows")  # raised by the variable
    monkeypatch.setenv("DILOCO_GYM_MAX_WINDOWS", "lots")
    with pytest.raises(limits.LimitError, match="DILOCO_GYM_MAX_WINDOWS must be a positive"):
        limits.limit("WINDOWS")


def test_tile_starts_refuses_before_building_the_list():
    with pytest.raises(limits.LimitError, match="1,666,666,666 is above the limit"):
        tile_starts(1e12, 600.0)
    with pytest.raises(limits.LimitError, match="DILOCO_GYM_MAX_WINDOWS"):
        tile_starts(3600.0, 600.0, 1e-6)
    with pytest.raises(ValueError, match="not a finite number"):
        tile_starts(float("inf"), 600.0)
    assert len(tile_starts(3600.0, 600.0)) == 6


# ----------------------------------------------------------------- files


def test_fifo_and_devices_are_refused_without_reading(tmp_path):
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)  # opening it would block until a writer comes: it must not be opened
    for fmt in ("auto", "native", "azure", "mooncake", "burstgpt"):
        fifo_error = r"pipe\.csv: cannot read: not a regular file \(a FIFO"
        with pytest.raises(TraceFormatError, match=fifo_error):
            load_trace(fifo, fmt)
    for fmt in ("native", "mooncake"):
        with pytest.raises(TraceFormatError, match="/dev/zero: cannot read: not a regular file"):
            load_trace("/dev/zero", fmt)
    with pytest.raises(TraceFormatError, match="not a regular file \\(a directory"):
        load_trace(tmp_path, "native")


def test_file_size_limit(tmp_path, monkeypatch):
    path = _native(tmp_path / "t.csv", "10", "1,10,10\n" * 100)
    load_trace(path)
    monkeypatch.setenv("DILOCO_GYM_MAX_TRACE_BYTES", "100")
    with pytest.raises(TraceFormatError) as err:
        load_trace(path)
    assert "t.csv" in str(err.value) and "DILOCO_GYM_MAX_TRACE_BYTES" in str(err.value)


def test_huge_field_and_nul_byte_are_quoted_short_and_escaped(tmp_path):
    huge = tmp_path / "huge.csv"
    huge.write_text("arrival_s,prompt_tokens,output_tokens\n" + "9" * 2_000_000 + "x,1,1\n")
    with pytest.raises(TraceFormatError) as err:
        load_trace(huge, "native")
    msg = str(err.value)
    assert len(msg) < 400 and "2,000,001 characters" in msg and "huge.csv" in msg
    nul = tmp_path / "nul.csv"
    nul.write_text("arrival_s,prompt_tokens,output_tokens\n1\x00,1,1\n")
    with pytest.raises(TraceFormatError) as err:
        load_trace(nul, "native")
    assert "\x00" not in str(err.value) and "\\x00" in str(err.value)
    azure = tmp_path / "az.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "2" * 500_000 + ",1,1\n")
    with pytest.raises(TraceFormatError) as err:
        load_trace(azure, "azure")
    assert len(str(err.value)) < 400 and "500,000 characters" in str(err.value)
    moon = tmp_path / "m.jsonl"
    moon.write_text(
        '{"timestamp": "' + "a" * 300_000 + '", "input_length": 1, "output_length": 1}\n'
    )
    with pytest.raises(TraceFormatError) as err:
        load_trace(moon, "mooncake")
    assert len(str(err.value)) < 400


# ----------------------------------------------------------------- the command line, capped


@pytest.mark.slow
@pytest.mark.parametrize(
    ("make", "extra", "expect"),
    [
        (lambda d: _native(d / "long.csv", "1e12"), [], "1,666,666,666 is above the limit"),
        (lambda d: _native(d / "huge.csv", "1e300"), [], "DILOCO_GYM_MAX_WINDOWS"),
        (
            lambda d: (
                (d / "m.jsonl").write_text(
                    '{"timestamp": 4611686018427387904, "input_length": 5, "output_length": 5}\n'
                )
                and d / "m.jsonl"
            ),
            [],
            "DILOCO_GYM_MAX_WINDOWS",
        ),
        (lambda d: _native(d / "s.csv", "3600"), ["--stride-s", "1e-6"], "DILOCO_GYM_MAX_WINDOWS"),
        (lambda d: _native(d / "s.csv", "3600"), ["--stride-s", "0.01"], "DILOCO_GYM_MAX_WINDOWS"),
        (lambda d: _native(d / "r.csv", "3600"), ["--rate-scale", "1e-300"], "MAX_WINDOWS"),
        (lambda d: _native(d / "r.csv", "3600"), ["--rate-scale", "1e-305"], "not a finite"),
        (
            lambda d: _native(d / "r.csv", "3600"),
            ["--rate-scale", "1e-9"],
            "DILOCO_GYM_MAX_WINDOWS",
        ),
        (lambda d: Path("/dev/zero"), ["--format", "native"], "not a regular file"),
        (lambda d: Path("/dev/urandom"), ["--format", "mooncake"], "not a regular file"),
    ],
)
def test_cli_refuses_sizes_under_a_memory_cap(tmp_path, make, extra, expect):
    """``run`` on inputs that implied 21-24 GB: a one-line error naming the file and the
    limit, well inside the cap."""
    path = make(tmp_path)
    proc = _capped(
        ["-m", "diloco_gym.cli", "run", "--agent", "fixed-256", "--trace", str(path), *extra],
        tmp_path,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode in (1, 2), proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("diloco-gym: "), proc.stderr[-2000:]
    assert str(path) in lines[0] and expect in lines[0], lines[0]
    assert "MemoryError" not in proc.stderr and "internal error" not in proc.stderr


@pytest.mark.slow
def test_cli_fifo_does_not_hang(tmp_path):
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    proc = _capped(
        ["-m", "diloco_gym.cli", "run", "--agent", "fixed-256", "--trace", str(fifo)],
        tmp_path,
        timeout=60,
    )
    assert proc.returncode == 1 and "not a regular file (a FIFO" in proc.stderr


@pytest.mark.slow
def test_run_streams_windows(tmp_path, monkeypatch, capsys):
    """``run`` holds one window's episode at a time (it kept every window's, about 5 MB a
    window on the real traces): once the next window runs, the previous episode is gone."""
    import gc
    import weakref

    from diloco_gym import cli
    from diloco_gym.eval import rollout

    rows = "".join(f"{t * 0.5:.1f},100,100\n" for t in range(2400))
    path = _native(tmp_path / "t.csv", "1200", rows)
    alive_before: list[int] = []
    refs: list[weakref.ref] = []
    real = rollout.run_episode

    def spy(env, agent, seed, *args, **kwargs):
        gc.collect()
        alive_before.append(sum(r() is not None for r in refs))
        out = real(env, agent, seed, *args, **kwargs)
        refs.append(weakref.ref(env.episode))
        return out

    monkeypatch.setattr(rollout, "run_episode", spy)
    assert cli.main(["run", "--agent", "fixed-256", "--trace", str(path), "--window-s", "60"]) == 0
    assert "20 episodes" in capsys.readouterr().out
    assert len(alive_before) == 20 and max(alive_before) == 0, alive_before


# ----------------------------------------------------------------- the env API, capped

_API_CASES = textwrap.dedent(
    """
    import json
    from diloco_gym.envs.env import DiLoCoSyncEnv
    from diloco_gym.envs.vector import DiLoCoSyncVectorEnv
    from diloco_gym.sim.regimes import REGIMES
    from dataclasses import replace

    cases = {
        "h_max": lambda: DiLoCoSyncEnv(h_max_steps=10**9),
        "budget": lambda: DiLoCoSyncEnv(merge_budget=10**6),
        "budget_reset": lambda: DiLoCoSyncEnv(merge_budget=60_000).reset(seed=0),
        "num_envs": lambda: DiLoCoSyncVectorEnv(num_envs=100_000),
        "batch": lambda: DiLoCoSyncVectorEnv(num_envs=50_000),
        "window": lambda: DiLoCoSyncEnv(regime=replace(REGIMES["bursty"], duration_s=1e9)),
        "seed": lambda: DiLoCoSyncEnv().reset(seed=2**64),
        "vseed": lambda: DiLoCoSyncVectorEnv(num_envs=2).reset(seed=2**63 - 1),
        "options_type": lambda: DiLoCoSyncEnv().reset(seed=0, options="x"),
        "options_key": lambda: DiLoCoSyncEnv().reset(seed=0, options={"merge_budget": 5}),
        "voptions": lambda: DiLoCoSyncVectorEnv(num_envs=2).reset(options={"episode": 1}),
        "pool": lambda: DiLoCoSyncVectorEnv(num_envs=2, episode_pool=10**9),
    }
    out = {}
    for name, case in cases.items():
        try:
            case()
            out[name] = "accepted"
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out))
    """
)


@pytest.mark.slow
def test_env_api_refuses_sizes_under_a_memory_cap(tmp_path):
    proc = _capped(["-c", _API_CASES], tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    expect = {
        "h_max": ("LimitError", "DILOCO_GYM_MAX_H_MAX_DECISIONS"),
        "budget": ("LimitError", "DILOCO_GYM_MAX_MERGE_BUDGET"),
        "budget_reset": ("ValueError", "infeasible"),
        "num_envs": ("LimitError", "DILOCO_GYM_MAX_ENVS"),
        "batch": ("LimitError", "DILOCO_GYM_MAX_BATCH_DECISIONS"),
        "window": ("LimitError", "DILOCO_GYM_MAX_DECISIONS"),
        "seed": ("ValueError", "[0, 2**63 - 1], got 18446744073709551616"),
        "vseed": ("ValueError", "seed (+ env index)"),
        "options_type": ("ValueError", "options must be a dict or None, got str"),
        "options_key": ("ValueError", "unknown option(s) 'merge_budget'"),
        "voptions": ("ValueError", "unknown option(s) 'episode'"),
        "pool": ("LimitError", "episode_pool: 1,000,000,000 is above"),
    }
    for name, (kind, text) in expect.items():
        assert out[name].startswith(kind + ":") and text in out[name], (name, out[name])
        assert "MemoryError" not in out[name]


def test_limits_are_documented_and_the_readme_links_them():
    """Every limit's variable is on docs/limits.md, which the README links (the README
    itself stays short)."""
    assert "(docs/limits.md)" in (ROOT / "README.md").read_text()
    page = (ROOT / "docs" / "limits.md").read_text()
    for name in limits.LIMITS:
        assert limits.limit_env_var(name) in page, name


def test_out_of_memory_while_loading_names_the_file(tmp_path, monkeypatch):
    """A ``MemoryError`` while a trace loads becomes a data error naming the file (it was
    ``internal error: MemoryError`` with no file named)."""
    from diloco_gym import cli
    from diloco_gym.sim import loaders

    path = _native(tmp_path / "t.csv", "1200")

    def exhausted(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(loaders, "load_trace", exhausted)
    with pytest.raises(SystemExit) as err:
        cli.main(["run", "--agent", "fixed-256", "--trace", str(path)])
    assert err.value.code == 1
    assert str(err.value) == f"diloco-gym: {path}: out of memory while loading the trace"
    assert cli.exit_status(MemoryError())[0] == 1


_LOAD_UNDER_A_CAP = """
import os, resource, sys, warnings
from diloco_gym.sim.loaders import load_trace

def vm_size():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise SystemExit("no VmSize")

warnings.simplefilter("ignore")
path, tiny, fmt, times = sys.argv[1:]
load_trace(tiny, fmt)  # imports, numba's compiled checks, pandas' parser: not counted
cap = vm_size() + int(float(times) * os.path.getsize(path))
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
trace = load_trace(path, fmt)
print("loaded", trace.num_requests)
"""


def _csv_trace(fmt: str, n: int) -> tuple[str, str]:
    """A seeded trace of ``n`` requests in CSV format ``fmt`` (its text), and a one-row file
    of the same format."""
    rng = np.random.default_rng(3)
    arrival = np.round(np.cumsum(rng.exponential(0.05, n)), 6)
    tokens = rng.integers(1, 4096, (n, 2)).tolist()
    rows = zip(arrival.tolist(), tokens, strict=True)
    if fmt == "native":
        head = f"# duration_s={float(np.ceil(arrival[-1] + 1))}\n"
        head += "arrival_s,prompt_tokens,output_tokens\n"
        return head + "".join(f"{a!r},{p},{o}\n" for a, (p, o) in rows), head + "0.5,1,1\n"
    if fmt == "azure":
        head = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        stamps = np.datetime64("2023-11-16T18:17:03") + (arrival * 1e6).astype("timedelta64[us]")
        text = "".join(
            f"{str(t).replace('T', ' ')},{p},{o}\n"
            for t, (p, o) in zip(stamps, tokens, strict=True)
        )
        return head + text, head + "2023-11-16 18:17:03.5,1,1\n"
    head = "Timestamp,Model,Request tokens,Response tokens\n"
    text = "".join(f"{a!r},ChatGPT,{p},{o}\n" for a, (p, o) in rows)
    return head + text, head + "0.5,ChatGPT,1,1\n"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("fmt", ["native", "azure", "burstgpt"])
def test_a_csv_trace_loads_within_a_few_times_its_size(tmp_path, fmt):
    """A CSV trace of 10-20 MB loads with address space for 8 times its size above what the
    process had (the typed columns are 24 bytes a request, 0.7-1.4 times these files). The
    loaders that held every field of the file as a Python string needed about 64 times a
    native file and failed here (a ``MemoryError``, or ``std::bad_alloc`` aborting the
    process)."""
    n = 600_000
    text, one_row = _csv_trace(fmt, n)
    path, tiny = tmp_path / "big.csv", tmp_path / "tiny.csv"
    path.write_text(text)
    tiny.write_text(one_row)
    assert path.stat().st_size > 10_000_000
    env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", _LOAD_UNDER_A_CAP, str(path), str(tiny), fmt, "8"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0 and out.stdout.split() == ["loaded", str(n)], out.stderr[-2000:]


_LOAD_ALL_UNDER_A_CAP = """
import resource, sys
from diloco_gym.sim.loaders import load_trace

def vm_size():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise SystemExit("no VmSize")

pairs = list(zip(sys.argv[1::2], sys.argv[2::2]))
for path, fmt in pairs:  # imports and first-use compilation: not counted
    load_trace(path, fmt)
cap = vm_size() + 2**28
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
for path, fmt in pairs:
    print(fmt, load_trace(path, fmt).num_requests)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_small_traces_load_without_reserving_the_size_limit():
    """A file of a few hundred bytes loads with 256 MiB of address space to spare: reading
    it reserved ``DILOCO_GYM_MAX_TRACE_BYTES`` + 1 bytes (2 GiB) up front, since
    ``read(n)`` allocates ``n`` before it reads."""
    fixtures = ROOT / "tests" / "fixtures"
    args = []
    for name, fmt in [
        ("azure_small.csv", "azure"),
        ("burstgpt_small.csv", "burstgpt"),
        ("mooncake_small.jsonl", "mooncake"),
        ("native_small.csv", "native"),
    ]:
        args += [str(fixtures / name), fmt]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _LOAD_ALL_UNDER_A_CAP, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert [line.split()[0] for line in out.stdout.splitlines()] == args[1::2]


def test_docs_limits_page_is_the_registry():
    """docs/limits.md holds the table generated from LIMITS (every limit, its default, its
    variable and what it bounds), verbatim."""
    page = (ROOT / "docs" / "limits.md").read_text()
    assert limits.markdown_table() in page
    for name, (default, what) in limits.LIMITS.items():
        row = next(line for line in page.splitlines() if line.startswith(f"| `{name}` |"))
        assert f"{default:,}" in row and limits.limit_env_var(name) in row and what in row
