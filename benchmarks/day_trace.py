"""Write the day-long synthetic trace of the benchmark's long-trace row: 24 h of Poisson
arrivals at 20 req/s with log-normal prompt and output tokens, in the native CSV format.

Usage::

    python benchmarks/day_trace.py /tmp/day.csv            # about 1.73 M requests
    /usr/bin/time -v diloco-gym report --trace /tmp/day.csv --format native --out day --force

The same seed always writes the same file (``numpy.random.default_rng(seed)``; arrivals as
cumulative sums of exponential gaps, cut at the end of the day; tokens rounded, at least 1).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from diloco_gym.sim.loaders.native import save_native
from diloco_gym.sim.traces import Trace


def day_trace(seed: int, hours: float, rate_rps: float) -> Trace:
    """The trace: Poisson arrivals at ``rate_rps`` over ``hours``; prompt tokens
    log-normal(6.5, 1.0), output tokens log-normal(5.0, 0.8) (natural-log mean and sigma)."""
    rng = np.random.default_rng(seed)
    duration = hours * 3600.0
    expected = rate_rps * duration
    gaps = rng.exponential(1.0 / rate_rps, int(expected + 10.0 * np.sqrt(expected)) + 100)
    arrivals = np.cumsum(gaps)
    if arrivals[-1] < duration:
        raise RuntimeError("day_trace: too few gaps drawn (cannot happen at these sizes)")
    arrivals = arrivals[arrivals < duration]
    n = arrivals.size
    prompt = np.maximum(1, np.rint(rng.lognormal(6.5, 1.0, n))).astype(np.int64)
    output = np.maximum(1, np.rint(rng.lognormal(5.0, 0.8, n))).astype(np.int64)
    return Trace(arrivals, prompt, output, duration, name="day")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="destination (.csv, or .parquet with the parquet extra)")
    ap.add_argument("--seed", type=int, default=24, help="generator seed (24)")
    ap.add_argument("--hours", type=float, default=24.0, help="trace length in hours (24)")
    ap.add_argument("--rate", type=float, default=20.0, help="mean request rate, req/s (20)")
    args = ap.parse_args()
    if not (args.hours > 0 and args.rate > 0):
        ap.error("--hours and --rate must be positive")
    t0 = time.perf_counter()
    trace = day_trace(args.seed, args.hours, args.rate)
    save_native(trace, args.out)
    print(
        f"wrote {args.out}: {trace.num_requests:,} requests over {trace.duration_s:,.0f} s "
        f"(seed {args.seed}) in {time.perf_counter() - t0:.1f} s"
    )


if __name__ == "__main__":
    main()
