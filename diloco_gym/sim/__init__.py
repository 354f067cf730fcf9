"""The simulated world: request traces and their loaders, workload regimes, the serving
sidecar's latency model, the learners' progress model and merge-schedule combinatorics.

Nothing here knows about Gymnasium; the environments in :mod:`diloco_gym.envs` and the
evaluation in :mod:`diloco_gym.eval` are built on these modules.
"""

_JIT = None


def compiled():
    """The compiled rules, :mod:`diloco_gym.sim.jit` (imported on first use: it imports
    numba, which ``import diloco_gym`` must not pay for)."""
    global _JIT
    if _JIT is None:
        from diloco_gym.sim import jit as module

        _JIT = module
    return _JIT
