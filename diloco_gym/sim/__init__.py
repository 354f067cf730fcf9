"""The simulated world: request traces and their loaders, workload regimes, the serving
sidecar's latency model, the learners' progress model and merge-schedule combinatorics.

Nothing here knows about Gymnasium; the environments in :mod:`diloco_gym.envs` and the
evaluation in :mod:`diloco_gym.eval` are built on these modules.
"""
