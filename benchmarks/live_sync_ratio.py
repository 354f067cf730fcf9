"""Measure the p95 sync ratio of this machine: built-in sidecar + real merges, ~60 s.

Runs :func:`diloco_gym.live.run_calibration` against the built-in CPU sidecar (a tiny torch
LM on 127.0.0.1) with real gloo all-reduces of a 64 MiB tensor across two local worker
processes plus checkpoint writes, replaying a 30 s window of the sync-heavy regime twice
(with merges, then the no-sync control), and prints the measured effect sizes and the
fitted ``sync_slowdown``.

Usage::

    python benchmarks/live_sync_ratio.py                 # ~60 s of replay plus start-up
    python benchmarks/live_sync_ratio.py --duration 60 --merge-mb 128 --out cal.json
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--duration",
        type=float,
        default=30.0,
        help="trace window, seconds; replayed twice (default 30)",
    )
    parser.add_argument("--regime", default="sync-heavy")
    parser.add_argument("--rate", type=float, default=2.0, help="request rate, req/s")
    parser.add_argument("--merge-mb", type=float, default=64.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--merge-seconds", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="calibration file (default: a temporary file)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args()

    from diloco_gym.live import CalibrationConfig, MergeConfig, run_calibration

    cfg = CalibrationConfig(
        seed=args.seed,
        rate_rps=args.rate,
        merge=MergeConfig(workers=args.workers, merge_mb=args.merge_mb),
        merge_seconds=args.merge_seconds,
        gap_seconds=(args.merge_seconds, 2 * args.merge_seconds),
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out) if args.out else Path(tmp) / "calibration_live.json"
        t0 = time.monotonic()
        result = run_calibration(
            None,
            args.regime,
            args.duration,
            out,
            config=cfg,
            progress=None if args.quiet else print,
        )
        wall = time.monotonic() - t0
        doc = result.document
    m, fit, req = doc["measured"], doc["fitted_sidecar"], doc["requests"]

    def f(x: float | None, unit: str = "") -> str:
        return "n/a" if x is None else f"{x:.3f}{unit}"

    print(
        f"\nlive calibration, {args.regime} window of {args.duration:g} s x 2 phases, "
        f"{args.workers} x {doc['metadata']['merges']['backend']} workers, "
        f"{args.merge_mb:g} MiB all-reduce, {len(doc['merges'])} merges, wall {wall:.0f} s"
    )
    print(
        f"requests ok {req['ok']}/{req['sent']} (sync active {req['sync_active']}, "
        f"inactive {req['sync_inactive']}, control {req['control']})"
    )
    print(
        f"p95 ms: sync active {f(m['p95_sync_active_ms'])}, inactive "
        f"{f(m['p95_sync_inactive_ms'])}, control {f(m['p95_control_ms'])}"
    )
    print(f"p95 sync ratio          {f(m['p95_sync_ratio'])}")
    print(f"p95 high/low ratio      {f(m['p95_high_low'])}")
    print(f"pressure-latency corr   {f(m['pressure_latency_corr'])}")
    print(
        f"fitted sync_slowdown    {f(fit.get('sync_slowdown'))} "
        f"(simulated ratio {f(doc['fit'].get('sim_p95_sync_ratio'))})"
    )
    print(
        f"fitted decode ms/token  {f(fit.get('decode_ms_per_token'))}, ttft ms "
        f"{f(fit.get('ttft_ms'))}, slots {f(fit.get('slots'))}"
    )
    return 0 if result.complete else 1


if __name__ == "__main__":  # required: the workers are spawned processes
    raise SystemExit(main())
