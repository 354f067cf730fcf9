"""Regenerate the shipped example traces: ``python -m diloco_gym.sim.make_traces [DIR]``.

Writes ``<regime>.csv`` (the project's native format: ``arrival_s, prompt_tokens,
output_tokens`` with a ``# duration_s=`` line) for every synthetic regime, seed 0, 600 s.
The pressure series are not stored (the native format holds requests only); replaying a
file through ``ReplayRegime`` draws them from the regime's processes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from diloco_gym.sim.loaders import save_native
from diloco_gym.sim.regimes import REGIMES
from diloco_gym.sim.traces import Trace

SEED = 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else "traces")
    out.mkdir(parents=True, exist_ok=True)
    for name, gen in REGIMES.items():
        tr = gen(np.random.default_rng(SEED))
        path = out / f"{name}.csv"
        save_native(
            Trace(tr.arrival_s, tr.prompt_tokens, tr.output_tokens, tr.duration_s, name=name), path
        )
        print(
            f"{path}: {tr.num_requests} requests, {tr.duration_s:.0f} s, "
            f"{tr.mean_rate_rps:.2f} req/s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
