"""Peak memory of loading a native CSV trace, as a multiple of the file's size.

Usage::

    python benchmarks/trace_memory.py /tmp/big.csv              # writes ~150 MB, then loads it
    python benchmarks/trace_memory.py /tmp/big.csv --rows 2000000 --keep

The file is written once (seeded; 8-9 bytes per request less than ``day_trace.py``'s
rows, about 20 bytes a row) unless it exists; the load runs in a fresh child process,
which reports its peak resident set size (``VmHWM`` of ``/proc/self/status``, so
Linux only) before and after
:func:`diloco_gym.sim.loaders.load_native`. The ratio printed is the growth of the peak
over the file's size: what the loader itself needed, imports excluded. It is printed twice:
``cold`` (the first load of the process, which also pays for compiling the trace checks with
numba, a fixed 100-odd MB) and ``warm`` (after loading a one-row file first: what the load
needs in proportion to the file).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CHILD = """
import sys, time
from diloco_gym.sim.loaders import load_native

def peak():  # VmHWM: this process's peak resident set (ru_maxrss survives exec; this not)
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise SystemExit("no VmHWM in /proc/self/status (Linux only)")

if len(sys.argv) > 2:  # warm up on a tiny file: numba's compiled checks, pandas' parser
    load_native(sys.argv[2])
before = peak()
t0 = time.perf_counter()
trace = load_native(sys.argv[1])
seconds = time.perf_counter() - t0
print(before, peak(), trace.num_requests, seconds)
"""


def write_trace(path: Path, rows: int, seed: int = 7) -> None:
    """``rows`` requests: arrivals 0.05 s apart on average (rounded to 1 us), tokens 1-4095."""
    from diloco_gym.sim.loaders.native import save_native
    from diloco_gym.sim.traces import Trace

    rng = np.random.default_rng(seed)
    arrival = np.round(np.cumsum(rng.exponential(0.05, rows)), 6)
    prompt = rng.integers(1, 4096, rows)
    output = rng.integers(1, 4096, rows)
    duration = float(np.ceil(arrival[-1] + 1.0))
    save_native(Trace(arrival, prompt, output, duration, name="mem"), path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", type=Path, help="the CSV file (written when absent)")
    ap.add_argument("--rows", type=int, default=7_500_000, help="requests to write (7.5 M)")
    ap.add_argument("--keep", action="store_true", help="keep the file afterwards")
    args = ap.parse_args()
    if not args.path.exists():
        t0 = time.perf_counter()
        write_trace(args.path, args.rows)
        print(f"wrote {args.path} in {time.perf_counter() - t0:.1f} s")
    size = args.path.stat().st_size
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        tiny = Path(tmp) / "tiny.csv"
        tiny.write_text("# duration_s=10.0\narrival_s,prompt_tokens,output_tokens\n0.5,1,1\n")
        runs = {
            "cold": [str(args.path)],
            "warm": [str(args.path), str(tiny)],
        }
        for name, argv in runs.items():
            out = subprocess.run(
                [sys.executable, "-c", CHILD, *argv],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            before, peak, requests, seconds = out.stdout.split()
            grown = int(peak) - int(before)
            print(
                f"{name}: {args.path}: {size / 1e6:.1f} MB, {int(requests):,} requests, "
                f"loaded in {float(seconds):.1f} s; peak RSS {int(peak) / 1e6:.0f} MB "
                f"({int(before) / 1e6:.0f} MB before the load): the load grew it by "
                f"{grown / 1e6:.0f} MB = {grown / size:.2f}x the file size"
            )
    if not args.keep:
        args.path.unlink()


if __name__ == "__main__":
    main()
