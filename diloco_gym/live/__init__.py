"""Live calibration against a real serving endpoint with real merges.

The simulator's effect sizes are only as good as the real measurements they are fitted
to (docs/calibration.md). This subpackage measures them on the machine at hand:

* :mod:`~diloco_gym.live.engine`: the built-in serving engine, transformers'
  continuous-batching OpenAI-compatible server on a small Llama built locally from a seed
  (the ``live`` extra), with KV-cache settings sized for the longest request;
* :mod:`~diloco_gym.live.server`: the dependency-free fallback server (a tiny torch LM
  behind ``http.server`` on 127.0.0.1, one thread per request, no batching);
* :mod:`~diloco_gym.live.probe`: the warm-up and the capacity probe;
* :mod:`~diloco_gym.live.merges`: real merges, ``torch.distributed`` all-reduces across
  local worker processes plus a checkpoint write, at the full rate or throttled to a link
  share;
* :mod:`~diloco_gym.live.replay`: open-loop replay of a trace window over HTTP (threads or
  an aiohttp event loop);
* :mod:`~diloco_gym.live.fit`: the measured effect sizes and the sidecar-model fit;
* :mod:`~diloco_gym.live.fidelity`: the fitted model against measurements on held-out
  settings (measured and predicted latency percentiles and SLO violations, their errors
  and bootstrap intervals over repeats, the Markdown section and the figure);
* :mod:`~diloco_gym.live.intensity`: the slowdown at several link shares and the fit of the
  fleet model's interference function;
* :mod:`~diloco_gym.live.calibrate`: :func:`run_calibration`, the steps of a run in order,
  with one module per role: :mod:`~diloco_gym.live.config` (the configuration),
  :mod:`~diloco_gym.live.plan` (what is replayed and when), :mod:`~diloco_gym.live.state`
  (the run's state), :mod:`~diloco_gym.live.resources` (what it starts and releases),
  :mod:`~diloco_gym.live.rate` (warm-up, probe and rate), :mod:`~diloco_gym.live.phases`
  (the measured phases and their guards), :mod:`~diloco_gym.live.document` (the
  calibration file's content) and :mod:`~diloco_gym.live.output` (atomic and partial
  writes); the file is what :func:`diloco_gym.eval.calibration.load_calibration` reads;
* :mod:`~diloco_gym.live.cli`: the ``diloco-gym calibrate`` command.
* :mod:`~diloco_gym.live.verdicts` and :mod:`~diloco_gym.live.verdict_stats`: the
  simulator's side of a live verdict (a trace window's episode, the agent's and the
  matched-random schedules, their planned merge windows and predicted excess) and the
  statistics that compare the live agent-minus-random difference with the prediction.

torch is needed only when a run starts (``pip install diloco-gym[rl]``); the built-in
engine needs ``pip install "diloco-gym[live]"``.
"""

from __future__ import annotations

from diloco_gym.live.calibrate import (
    CalibrationConfig,
    CalibrationResult,
    plan_merges,
    prepare_trace,
    run_calibration,
)
from diloco_gym.live.errors import CalibrationError, EndpointUnavailableError, MergeWorkerError
from diloco_gym.live.merges import MergeCluster, MergeConfig
from diloco_gym.live.server import SidecarModelConfig, start_sidecar

__all__ = [
    "run_calibration",
    "CalibrationConfig",
    "CalibrationResult",
    "CalibrationError",
    "EndpointUnavailableError",
    "MergeWorkerError",
    "MergeCluster",
    "MergeConfig",
    "SidecarModelConfig",
    "start_sidecar",
    "plan_merges",
    "prepare_trace",
]
