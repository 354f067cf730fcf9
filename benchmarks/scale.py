"""Wall time of the protocol on 1 and 2 workers: speedup and overhead of each backend.

Usage::

    python benchmarks/scale.py                      # default report + 200-seed bursty report
    python benchmarks/scale.py --quick              # a smoke run (seconds)
    python benchmarks/scale.py --json out.json      # also save every number
    python benchmarks/scale.py --sweep              # also a sweep's throughput (cells/s)

For each workload it times ``run_protocol`` serially (the reference) and with the
``processes`` backend (and ``ray`` when Ray is installed: a local instance started for the
run, its start-up timed separately) on 1 and 2 workers, checks that every run's rows equal
the serial ones, and prints wall time, speedup (serial time / time) and overhead (time on
1 worker / serial time - 1: what process start-up, pickling and result transfer cost).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diloco_gym.backends import default_jobs  # noqa: E402
from diloco_gym.eval.report import ReportConfig, run_protocol  # noqa: E402

WORKLOADS = {
    "default report": {},
    "bursty, 200 seeds": {"regimes": ["bursty"], "seeds": 200},
}
QUICK = {
    "quick report": {
        "regimes": ["bursty"],
        "seeds": 4,
        "draws": 50,
        "agents": ["fixed-512", "wa-diloco"],
    },
}


def _cpu() -> float:
    """CPU seconds of this process and of its reaped children (pool workers; not Ray's)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _time(config: ReportConfig, **backend) -> tuple[float, float, object]:
    c0, t0 = _cpu(), time.perf_counter()
    res = run_protocol(config, progress=False, **backend)
    return time.perf_counter() - t0, _cpu() - c0, res


def bench(workloads: dict, with_ray: bool) -> list[dict]:
    """Time every workload on every backend; rows of the results table."""
    runs: list[tuple[str, dict]] = [("serial", {})]
    for jobs in (1, 2):
        runs.append((f"processes x{jobs}", {"backend": "processes", "jobs": jobs}))
    ray_start = None
    if with_ray:
        import ray

        from diloco_gym.backends import init_ray

        t0 = time.perf_counter()
        init_ray(jobs=2)
        ray_start = time.perf_counter() - t0
        # A local instance has 2 CPUs; one worker is Ray limited to one task at a time.
        runs.append(("ray x2", {"backend": "ray"}))
    out = []
    for name, kwargs in workloads.items():
        config = ReportConfig(**kwargs)
        cells = None
        serial_t = serial_rows = None
        for label, backend in runs:
            t, cpu, res = _time(config, **backend)
            if serial_rows is None:
                serial_t, serial_rows = t, res["rows"]
                cells = len(res["rows"]) // len(config.agents) + len(res["calibration"])
            same = res["rows"].equals(serial_rows)
            # CPU of Ray's workers is not visible here (they are not our children).
            cpu_s = None if label.startswith("ray") else cpu
            out.append(
                {
                    "workload": name,
                    "cells": cells,
                    "run": label,
                    "wall_s": t,
                    "cpu_s": cpu_s,
                    "speedup": serial_t / t,
                    "same_rows_as_serial": bool(same),
                    "load_average": os.getloadavg()[0],
                }
            )
            cpu_txt = "" if cpu_s is None else f"  cpu {cpu_s:7.2f} s"
            print(
                f"{name:20s} {label:14s} {t:8.2f} s{cpu_txt}  speedup {serial_t / t:5.2f}  "
                f"identical {same}  load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    if with_ray:
        out.append(
            {"workload": "ray local start-up", "run": "ray.init(num_cpus=2)", "wall_s": ray_start}
        )
        print(f"ray.init(num_cpus=2): {ray_start:.2f} s")
        ray.shutdown()
    return out


def bench_sweep(backend: str, jobs: int) -> dict:
    """Cells per second of a small sweep (2 regimes x 2 merge budgets x 6 seeds)."""
    from diloco_gym.scale.sweep import load_sweep, run_sweep

    spec = (
        "name = 'bench'\nagents = ['fixed-512', 'wa-diloco']\nseeds = 6\ndraws = 200\n"
        "[grid]\nregime = ['bursty', 'sync-heavy']\nmerge_budget = [8, 16]\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "s.toml"
        cfg.write_text(spec)
        t0 = time.perf_counter()
        res = run_sweep(
            load_sweep(cfg), Path(tmp) / "out", backend=backend, jobs=jobs, progress=False
        )
        t = time.perf_counter() - t0
    n = res["cells"]
    print(f"sweep {backend} x{jobs}: {n} cells in {t:.2f} s = {n / t:.2f} cells/s")
    return {
        "workload": "sweep",
        "run": f"{backend} x{jobs}",
        "cells": n,
        "wall_s": t,
        "cells_per_s": n / t,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run (seconds)")
    ap.add_argument("--json", help="also save every number to this file")
    ap.add_argument("--no-ray", action="store_true", help="skip Ray even when installed")
    ap.add_argument("--sweep", action="store_true", help="also time a small sweep")
    args = ap.parse_args()
    try:
        import ray  # noqa: F401

        with_ray = not args.no_ray
    except ImportError:
        with_ray = False
    print(
        f"{platform.platform()}, Python {platform.python_version()}, "
        f"{default_jobs()} CPUs available, load average {os.getloadavg()[0]:.2f}"
    )
    rows = bench(QUICK if args.quick else WORKLOADS, with_ray)
    if args.sweep:
        for jobs in (1, 2):
            rows.append(bench_sweep("processes", jobs))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
