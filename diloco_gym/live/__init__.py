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
  local worker processes plus a checkpoint write;
* :mod:`~diloco_gym.live.replay`: open-loop replay of a trace window over HTTP;
* :mod:`~diloco_gym.live.fit`: the measured effect sizes and the sidecar-model fit;
* :mod:`~diloco_gym.live.calibrate`: :func:`run_calibration`, which ties them together
  and writes a file :func:`diloco_gym.eval.calibration.load_calibration` reads;
* :mod:`~diloco_gym.live.cli`: the ``diloco-gym calibrate`` command.

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
