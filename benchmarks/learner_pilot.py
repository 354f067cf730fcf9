"""The pilot behind the learner calibration's design: how many seeds the paired comparison
of the corridor's ends needs, from a few real DiLoCo runs.

Runs fixed H = H_min / 2, H_min, H_max and 2 H_max (2, 4, 16, 32 inner steps at the default
mapping of 32 env steps per inner step) with each pilot seed, at the budget that covers one
env episode (160 inner steps), for one or more model sizes; then prints, per model, the
paired differences fixed H_max - fixed H_min (same seed: same initial model and batches),
their standard deviation, the seeds a paired t-test needs to detect the target effect with
80 % power at alpha 0.05, and the smallest effect the calibration's seed count detects.

    python benchmarks/learner_pilot.py                       # default model, 3 seeds (~4 min)
    python benchmarks/learner_pilot.py --models default,small --seeds 4 --target 0.01

Every finished run is appended to ``--log`` (JSON lines) and reused when the pilot is run
again with the same model, budget, seed and interval, so a killed pilot continues.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

MODELS = {
    "default": {},  # 834,304 parameters: d_model 128, 4 blocks
    "small": {"d_model": 64, "n_layers": 2},  # 120,576 parameters
}


def main(argv: list[str] | None = None) -> int:
    from diloco_gym.lm.calibrate import _corridor, covering_steps
    from diloco_gym.lm.data import load_corpus
    from diloco_gym.lm.power import detectable_effect, seeds_needed
    from diloco_gym.lm.trainer import TrainConfig, fixed_schedule, run_diloco

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="default", help="comma-separated: default, small")
    p.add_argument("--seeds", type=int, default=3, help="pilot seeds (>= 2)")
    p.add_argument("--target", type=float, default=0.01, help="relative effect to detect")
    p.add_argument("--calibration-seeds", type=int, default=10, help="seeds of the design")
    p.add_argument("--mapping", type=float, default=32.0, help="env steps per inner step")
    p.add_argument("--log", default="learner_pilot.jsonl", help="run log (JSON lines)")
    args = p.parse_args(argv)
    if args.seeds < 2:
        p.error("--seeds must be >= 2 (a paired spread needs two seeds)")
    lo, hi, _ = _corridor(args.mapping)
    total = covering_steps(args.mapping)
    hs = sorted({max(1, lo // 2), lo, hi, 2 * hi})
    corpus = load_corpus(None)
    log = Path(args.log)
    done = {}
    if log.exists():
        for line in log.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            done[(r["model"], r["total"], r["seed"], r["h"])] = r["final"]
    for model in args.models.split(","):
        if model not in MODELS:
            p.error(f"--models: unknown model {model!r}; choose from {', '.join(MODELS)}")
        cfg = TrainConfig(total_steps=total, **MODELS[model])
        finals: dict[tuple[int, int], float] = {}
        for seed in range(args.seeds):
            for h in hs:
                key = (model, total, seed, h)
                if key not in done:
                    r = run_diloco(corpus, cfg, fixed_schedule(h, total), seed=seed)
                    done[key] = r.final_loss
                    with log.open("a", encoding="utf-8") as fh:
                        rec = {"model": model, "total": total, "seed": seed, "h": h}
                        fh.write(json.dumps({**rec, "final": r.final_loss}) + "\n")
                    print(
                        f"{model} seed {seed} fixed-{h}: {r.final_loss:.4f} ({r.seconds:.1f} s)",
                        file=sys.stderr,
                        flush=True,
                    )
                finals[(seed, h)] = done[key]
        _summary(model, finals, args, lo, hi, hs, seeds_needed, detectable_effect)
    return 0


def _summary(model, finals, args, lo, hi, hs, seeds_needed, detectable_effect) -> None:
    seeds = range(args.seeds)
    print(f"\n{model}: final validation loss (nats/byte) per seed")
    for h in hs:
        print(f"  fixed-{h:<3} " + "  ".join(f"{finals[(s, h)]:.4f}" for s in seeds))
    d = np.array([finals[(s, hi)] - finals[(s, lo)] for s in seeds])
    ref = float(np.mean([finals[(s, lo)] for s in seeds]))
    sd = float(d.std(ddof=1))
    target = args.target * ref
    print(
        f"  fixed-{hi} - fixed-{lo}: {' '.join(f'{x:+.4f}' for x in d)}; mean {d.mean():+.4f} "
        f"({100 * d.mean() / ref:+.2f} %), sd {sd:.4f}"
    )
    print(
        f"  target {100 * args.target:.1f} % = {target:.4f} nats/byte: "
        f"{seeds_needed(target, sd)} seeds for 80 % power at alpha 0.05; with "
        f"{args.calibration_seeds} seeds the smallest detectable effect is "
        f"{detectable_effect(sd, args.calibration_seeds):.4f} nats/byte "
        f"({100 * detectable_effect(sd, args.calibration_seeds) / ref:.2f} %)"
    )


if __name__ == "__main__":
    raise SystemExit(main())
