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


def compiled_rows(name: str, parallel: bool, items: int, at_least: int):
    """The compiled per-row rule ``name`` of :mod:`diloco_gym.sim.jit`, or, when
    ``parallel`` is asked for and pays for a batch of ``items`` rows
    (:func:`diloco_gym.sim.jit_parallel.parallel_ok` with ``at_least``), its parallel
    variant of :mod:`diloco_gym.sim.jit_parallel` with the block count bound: either way a
    function of the serial rule's arguments, with the same result."""
    if parallel:
        from diloco_gym.sim import jit_parallel as par

        if par.parallel_ok(items, at_least):
            rule, nc = getattr(par, name), par.blocks(items)
            return lambda *args: rule(*args, nc)
    return getattr(compiled(), name)


def iir1(b0: float, a1: float, x):
    """``y[n] = b0 * x[n] - a1 * y[n - 1]`` from ``y[-1] = 0`` along the last axis of ``x``
    (float64): the compiled :func:`diloco_gym.sim.jit.iir1_rows`, bit-identical to
    ``scipy.signal.lfilter([b0], [1, a1], x, axis=-1)``."""
    import numpy as np

    x = np.asarray(x, dtype=np.float64)
    rows = np.ascontiguousarray(x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1))
    out = np.empty_like(rows)
    compiled().iir1_rows(float(b0), float(a1), rows, out)
    return out.reshape(x.shape)
