"""The simulated world: request traces and their loaders, workload regimes, the serving
sidecar's latency model, the learners' progress model and merge-schedule combinatorics.

Nothing here knows about Gymnasium; the environments in :mod:`diloco_gym.envs` and the
evaluation in :mod:`diloco_gym.eval` are built on these modules.
"""

import importlib
from functools import lru_cache, partial
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


def compiled_stats():
    """The compiled order statistics and replay summary, :mod:`diloco_gym.sim.jit_stats`
    (imported on first use)."""
    return _compiled_module("jit_stats")


def compiled_plan():
    """The causal planner's compiled filter and dynamic programme,
    :mod:`diloco_gym.sim.jit_plan` (imported on first use)."""
    return _compiled_module("jit_plan")


def compiled_draws():
    """The synthetic traces' compiled draws, :mod:`diloco_gym.sim.jit_draws` (imported on
    first use)."""
    return _compiled_module("jit_draws")


def compiled_checks():
    """The compiled checks of a trace's arrays, :mod:`diloco_gym.sim.jit_checks` (imported
    on first use)."""
    return _compiled_module("jit_checks")


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


class _Bound(partial):
    """A partial of a compiled overload's entry point; pickles and copies as the partial
    of its dispatcher (:func:`bound_call`)."""

    dispatcher: object  # the numba dispatcher whose overload this calls

    def __reduce__(self):
        return (bound_call, (self.dispatcher, self.args))


_ENTRIES: dict = {}  # (dispatcher, the arguments' type keys) -> the overload's entry point


def bound_call(dispatcher, args: tuple) -> partial:
    """``partial(dispatcher, *args)``, calling the compiled overload for exactly these
    arguments' types without numba's type dispatch on each call (the single env's
    per-decision step: about 1.3 us of its 28 arguments' typing saved per call).

    The overload is found once per process and argument types (compiled, or loaded from
    the cache, then); after that a bind costs the arguments' fingerprints (about 5 us for
    28). The arguments are bound, so their types cannot change between calls. Where this
    numba keeps no such entry point (an internal that moved), the plain dispatcher is
    bound instead: the same results.
    """
    try:
        # numba's own typeof cache key (kind, dtype, dimensions, layout, writeability), and
        # an array's alignment, which the key leaves out
        import numpy as np
        from numba._dispatcher import compute_fingerprint as fp

        aligned = [a.flags.aligned if isinstance(a, np.ndarray) else None for a in args]
        key = (dispatcher, tuple(map(fp, args)), tuple(aligned))
        entry = _ENTRIES.get(key)
        if entry is None:
            from numba.core.typing.typeof import Purpose, typeof

            sig = tuple(typeof(a, Purpose.argument) for a in args)
            if sig not in dispatcher.overloads:
                dispatcher.compile(sig)
            entry = _ENTRIES[key] = dispatcher.overloads[sig].entry_point
    except (AttributeError, ImportError, KeyError, TypeError, ValueError):
        entry = dispatcher
    call = _Bound(entry, *args)
    call.dispatcher = dispatcher
    return call


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

    qf = quantile_fractions(tuple(q))
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
def quantile_fractions(q: tuple):
    """``q / 100`` as NumPy divides it (read-only); ``ValueError`` outside [0, 100]."""
    import numpy as np

    qf = np.true_divide(np.asarray(q, dtype=np.float64).reshape(-1), 100)
    if not bool(np.all((qf >= 0.0) & (qf <= 1.0))):
        raise ValueError("Percentiles must be in the range [0, 100]")
    qf.setflags(write=False)
    return qf
