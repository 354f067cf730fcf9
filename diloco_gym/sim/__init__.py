"""The simulated world: request traces and their loaders, workload regimes, the serving
sidecar's latency model, the learners' progress model and merge-schedule combinatorics.

Nothing here knows about Gymnasium; the environments in :mod:`diloco_gym.envs` and the
evaluation in :mod:`diloco_gym.eval` are built on these modules.
"""

import importlib
from functools import lru_cache
from types import ModuleType

_COMPILED: dict[str, ModuleType] = {}


def _compiled_module(name: str) -> ModuleType:
    """``diloco_gym.sim.<name>``, imported on first use: the compiled modules import numba,
    which ``import diloco_gym`` must not pay for."""
    module = _COMPILED.get(name)
    if module is None:
        module = _COMPILED[name] = importlib.import_module(f"diloco_gym.sim.{name}")
    return module


def compiled():
    """The compiled rules, :mod:`diloco_gym.sim.jit` (imported on first use)."""
    return _compiled_module("jit")


def compiled_step():
    """The compiled decision step, :mod:`diloco_gym.sim.jit_step` (imported on first use)."""
    return _compiled_module("jit_step")


def compiled_eval():
    """The evaluation's compiled loops, :mod:`diloco_gym.sim.jit_eval` (imported on first
    use)."""
    return _compiled_module("jit_eval")


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


def percentiles(x, q) -> list[float]:
    """Linear-interpolation percentiles ``q`` (a sequence, each in [0, 100]) of all the values
    of ``x`` as Python floats: the compiled :func:`diloco_gym.sim.jit_stats.percentiles_linear`,
    each value bit-identical to ``float(np.percentile(x, q_j))`` for float64 ``x``; NaN for
    every ``q`` when ``x`` is empty."""
    import numpy as np

    qf = _fractions(tuple(q))
    a = np.ascontiguousarray(x, dtype=np.float64)
    if a.ndim != 1:
        a = a.reshape(-1)
    if not a.size:
        return [float("nan")] * qf.size
    from diloco_gym.sim.jit_stats import percentiles_linear

    out = np.empty(qf.size)
    percentiles_linear(a, qf, out)
    return out.tolist()


@lru_cache(maxsize=64)
def _fractions(q: tuple):
    """``q / 100`` as NumPy divides it (read-only); ``ValueError`` outside [0, 100]."""
    import numpy as np

    qf = np.true_divide(np.asarray(q, dtype=np.float64).reshape(-1), 100)
    if not bool(np.all((qf >= 0.0) & (qf <= 1.0))):
        raise ValueError("Percentiles must be in the range [0, 100]")
    qf.setflags(write=False)
    return qf
