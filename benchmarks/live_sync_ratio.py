"""Measure the p95 sync ratio of this machine with its interval: a real engine + merges.

Runs :func:`diloco_gym.live.run_calibration` against transformers' continuous-batching
server on a small local Llama (or ``--engine builtin-fallback``) with real gloo all-reduces
of a 64 MiB tensor across two local worker processes plus checkpoint writes: a warm-up, a
capacity probe, then ``--repeats`` pairs of a sync phase and a no-sync control phase over a
window of the sync-heavy regime replayed at ``--target-utilization`` of the probed
capacity. Prints the capacity, the effect sizes with their bootstrap intervals over repeats,
and the fitted ``sync_slowdown``.

With ``--link-shares 1 0.5 0.25`` every repeat adds a sync phase per share below 1 (its
merges all-reduce at that share of the full rate) and the fleet model's interference
function is fitted (:mod:`diloco_gym.live.intensity`); its block is printed too.

Usage::

    python benchmarks/live_sync_ratio.py                       # ~5 min on 2 cores
    python benchmarks/live_sync_ratio.py --target-utilization 0.6 --out cal.json
    python benchmarks/live_sync_ratio.py --link-shares 1 0.5 0.25 --duration 20
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--duration",
        type=float,
        default=30.0,
        help="trace window, seconds; replayed twice per repeat (default 30)",
    )
    parser.add_argument("--regime", default="sync-heavy")
    parser.add_argument(
        "--engine", default="transformers", choices=("transformers", "builtin-fallback")
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="request rate, req/s (default: utilization x probed capacity)",
    )
    parser.add_argument("--target-utilization", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--probe-step-seconds", type=float, default=8.0)
    parser.add_argument("--merge-mb", type=float, default=64.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--merge-seconds", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--link-shares", type=float, nargs="+", default=[1.0], help="sync intensities (1 only)"
    )
    parser.add_argument("--out", help="calibration file (default: a temporary file)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args()

    from diloco_gym.live import CalibrationConfig, MergeConfig, run_calibration
    from diloco_gym.live.errors import CalibrationError
    from diloco_gym.live.probe import ProbeConfig

    cfg = CalibrationConfig(
        seed=args.seed,
        rate_rps=args.rate,
        merge=MergeConfig(workers=args.workers, merge_mb=args.merge_mb),
        merge_seconds=args.merge_seconds,
        gap_seconds=(args.merge_seconds, 2 * args.merge_seconds),
        engine=args.engine,
        target_utilization=args.target_utilization,
        repeats=args.repeats,
        probe=ProbeConfig(step_s=args.probe_step_seconds),
        link_shares=tuple(args.link_shares),
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out) if args.out else Path(tmp) / "calibration_live.json"
        t0 = time.monotonic()
        try:
            result = run_calibration(
                None,
                args.regime,
                args.duration,
                out,
                config=cfg,
                progress=None if args.quiet else print,
            )
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: the partial file is saved
            saved = getattr(exc, "path", None)
            print(f"interrupted; measurements so far: {saved or 'none saved'}", file=sys.stderr)
            return 130
        except CalibrationError as exc:  # overload stop, dead worker, ...: one line, no trace
            saved = getattr(exc, "path", None)
            print(f"calibration stopped: {exc}", file=sys.stderr)
            if saved:
                print(f"measurements so far: {saved}", file=sys.stderr)
            return 1
        wall = time.monotonic() - t0
        doc = result.document
    m, fit, req = doc["measured"], doc["fitted_sidecar"], doc["requests"]

    def f(x: float | None, unit: str = "") -> str:
        return "n/a" if x is None else f"{x:.3f}{unit}"

    cap = doc.get("capacity", {})
    iv = m.get("intervals", {})

    def ci(name: str) -> str:
        bounds = iv.get(name)
        return "" if not bounds else f" [{bounds[0]:.3f}, {bounds[1]:.3f}]"

    print(
        f"\nlive calibration, {args.regime} window of {args.duration:g} s x 2 phases x "
        f"{args.repeats} repeats, engine {doc['metadata']['endpoint'].get('engine')}, "
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
    print(
        f"capacity {f(cap.get('capacity_rps'))} req/s, replayed at {f(cap.get('rate_rps'))} "
        f"req/s (utilization {f(cap.get('utilization'))})"
    )
    per_repeat = iv.get("per_repeat", {}).get("p95_sync_ratio", [])
    print(
        f"p95 sync ratio          {f(m['p95_sync_ratio'])}{ci('p95_sync_ratio')} "
        f"(per repeat: {', '.join(f(v) for v in per_repeat)})"
    )
    print(f"p95 sync vs control     {f(m.get('p95_sync_vs_control'))}{ci('p95_sync_vs_control')}")
    print(f"p95 high/low ratio      {f(m['p95_high_low'])}{ci('p95_high_low')}")
    print(f"pressure-latency corr   {f(m['pressure_latency_corr'])}")
    print(
        f"fitted sync_slowdown    {f(fit.get('sync_slowdown'))} "
        f"{doc['fit'].get('sync_slowdown_interval')} "
        f"(simulated ratio {f(doc['fit'].get('sim_p95_sync_ratio'))})"
    )
    print(
        f"fitted decode ms/token  {f(fit.get('decode_ms_per_token'))}, ttft ms "
        f"{f(fit.get('ttft_ms'))}, slots {f(fit.get('slots'))}"
    )
    if "interference" in doc:
        from diloco_gym.live.document import summary_lines

        print(
            "\n".join(ln for ln in summary_lines(doc) if "interference" in ln or "link share" in ln)
        )
    return 0 if result.complete else 1


if __name__ == "__main__":  # required: the workers are spawned processes
    raise SystemExit(main())
