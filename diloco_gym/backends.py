"""Backends that run independent cells: in this process, in a local process pool, or on Ray.

A *cell* is a call ``fn(arg)`` of a module-level function on a picklable argument whose
result depends only on that argument. :func:`run_cells` runs a list of them on a backend and
returns the results in the order of the list, whatever order they finished in, so that a
caller that assembles its output from them writes the same bytes on every backend and for any
number of workers.

Backends:
    ``serial``: one after the other in this process (the reference order).
    ``processes``: a :class:`concurrent.futures.ProcessPoolExecutor` of ``jobs`` workers
        started with the ``spawn`` method (the same behaviour on Linux, macOS and Windows;
        no state forked from the parent).
    ``ray``: Ray tasks, on a running cluster (``ray_address``: ``"auto"`` or
        ``"ray://host:10001"`` / ``"host:6379"``) or on a new local instance started with
        ``ray.init(address="local", num_cpus=jobs)``. Ray is the optional extra ``diloco-gym[ray]``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BACKENDS",
    "CellError",
    "RAY_EXTRA_HINT",
    "default_jobs",
    "require_ray",
    "run_cells",
    "init_ray",
    "progress_bar",
    "register_worker_setting",
]

#: The backends :func:`run_cells` knows.
BACKENDS = ("serial", "processes", "ray")

#: The one-line hint a missing Ray gives.
RAY_EXTRA_HINT = 'Ray is not installed; install the extra: pip install "diloco-gym[ray]"'


@dataclass
class CellError:
    """A cell that raised, recorded instead of its result (``capture_errors=True``).

    Attributes:
        error_type: the exception's class name.
        message: its message (one line).
    """

    error_type: str
    message: str

    def __str__(self) -> str:
        return f"{self.error_type}: {self.message}"


def default_jobs() -> int:
    """The CPUs this process may use (its affinity where the platform tells it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return max(1, os.cpu_count() or 1)


def require_ray():
    """Import Ray, or raise :class:`ModuleNotFoundError` with a one-line hint naming the
    extra that brings it."""
    try:
        import ray
    except ImportError:
        raise ModuleNotFoundError(RAY_EXTRA_HINT) from None
    return ray


def init_ray(jobs: int | None = None, address: str | None = None):
    """Connect to a Ray cluster (``address``) or start a local one of ``jobs`` CPUs; an
    instance already initialised in this process is reused as it is.

    Returns:
        The ``ray`` module.
    """
    ray = require_ray()
    if not ray.is_initialized():
        # Workers must import this package. On a local instance pass the driver's import
        # path on, so that a source checkout run with PYTHONPATH works like an installed
        # package; a cluster's workers need the package installed (docs/scale-out.md).
        kwargs: dict[str, Any] = {
            "include_dashboard": False,
            "log_to_driver": False,
            "logging_level": "ERROR",
        }
        if address:
            ray.init(address=address, **kwargs)
        else:
            env = {"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}}
            # "local" starts a new instance: without it Ray attaches to the cluster that
            # RAY_ADDRESS or its current-cluster file in the temporary directory names (left
            # behind by any earlier `ray start`), and then refuses num_cpus.
            ray.init(address="local", num_cpus=jobs or default_jobs(), runtime_env=env, **kwargs)
    return ray


#: Settings of this process that a worker must share, as ``(capture, enter)`` pairs:
#: ``capture()`` gives the setting's (picklable) value here, ``enter(value)`` is a context
#: manager that sets it in the worker. Registered by the module that owns the setting (the
#: model-file trust of ``--trust-model-file``, :mod:`diloco_gym.agents.learned`).
_WORKER_SETTINGS: list[tuple[Callable[[], Any], Callable[[Any], Any]]] = []


def register_worker_setting(capture: Callable[[], Any], enter: Callable[[Any], Any]) -> None:
    """Pass a per-process setting to the workers of the ``processes`` and ``ray`` backends
    explicitly, as an argument of each cell (a spawned worker shares nothing of its
    parent's state, and the environment is not used for it). ``capture`` and ``enter``
    must be module-level functions (they are pickled by name)."""
    if (capture, enter) not in _WORKER_SETTINGS:
        _WORKER_SETTINGS.append((capture, enter))


def _settings() -> list[tuple[Callable[[Any], Any], Any]]:
    """The registered settings' values in this process, with their ``enter``."""
    return [(enter, capture()) for capture, enter in _WORKER_SETTINGS]


def _call(
    fn: Callable[[Any], Any],
    arg: Any,
    capture: bool,
    settings: Sequence[tuple[Callable[[Any], Any], Any]] = (),
) -> Any:
    """``fn(arg)`` (a :class:`CellError` for its exception with ``capture``), inside the
    parent's ``settings`` (:func:`register_worker_setting`)."""
    if settings:
        with contextlib.ExitStack() as stack:
            for enter, value in settings:
                stack.enter_context(enter(value))
            return _call(fn, arg, capture)
    if not capture:
        return fn(arg)
    try:
        return fn(arg)
    except Exception as exc:  # noqa: BLE001 - recorded with the cell, the run goes on
        return CellError(type(exc).__name__, " ".join(str(exc).split()))


class _LineProgress:
    """Progress for a log: a few flushed summary lines (``desc: 27/105 cells done``), at
    each quarter of the total (every item when there are at most :data:`LOG_LINES`),
    instead of a bar's carriage-return redraws or a line per item."""

    def __init__(self, total: int, desc: str, unit: str, stream: Any) -> None:
        self.total, self.desc, self.unit, self.stream, self.n = total, desc, unit, stream, 0
        self._marks = {-(-total * k // LOG_LINES) for k in range(1, LOG_LINES + 1)}

    def update(self, n: int = 1) -> None:
        before, self.n = self.n, self.n + n
        if not any(before < mark <= self.n for mark in self._marks):
            return
        units = self.unit if self.total == 1 else f"{self.unit}s"
        print(f"{self.desc}: {self.n}/{self.total} {units} done", file=self.stream, flush=True)

    def close(self) -> None:
        pass


#: Progress lines a run writes at most when stderr is not a terminal (a log, a pipe).
LOG_LINES = 4


def progress_bar(total: int, enabled: bool, desc: str, unit: str = "cell"):
    """The progress display every command uses (``None`` when not ``enabled``): a tqdm bar
    on a terminal, at most :data:`LOG_LINES` summary lines when stderr is a file or a pipe
    (a log)."""
    if not enabled:
        return None
    if not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty()):
        return _LineProgress(total, desc, unit, sys.stderr)
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, desc=desc, file=sys.stderr, disable=None)


def _progress(total: int, enabled: bool, desc: str):
    return progress_bar(total, enabled, desc, "cell")


def run_cells(
    fn: Callable[[Any], Any],
    cells: Sequence[Any],
    backend: str = "serial",
    jobs: int | None = None,
    ray_address: str | None = None,
    progress: bool = False,
    desc: str = "cells",
    on_result: Callable[[int, Any], None] | None = None,
    capture_errors: bool = False,
) -> list[Any]:
    """Run ``fn(cell)`` for every cell on ``backend``; results in the order of ``cells``.

    Args:
        fn: a module-level function (workers import it by name).
        cells: picklable arguments, one per call.
        backend: one of :data:`BACKENDS`.
        jobs: workers (``processes``; ``ray`` when it starts a local instance); default:
            the CPUs available.
        ray_address: a Ray cluster to connect to (``"auto"``: the one ``ray start`` runs
            here); ``None`` starts a local instance.
        progress: a progress bar of cells done / total on stderr.
        desc: the bar's label.
        on_result: called in this process as ``on_result(index, result)`` when each cell
            finishes (in finishing order): a sweep stores finished cells as they come.
        capture_errors: a raising cell gives a :class:`CellError` as its result instead of
            stopping the run.

    Raises:
        ValueError: an unknown backend or ``jobs < 1``.
        ModuleNotFoundError: ``backend="ray"`` without Ray installed.
        Exception: the first exception a cell raised (without ``capture_errors``).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if jobs is not None and jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    if ray_address and backend != "ray":
        raise ValueError(f"a Ray address ({ray_address!r}) needs backend 'ray', not {backend!r}")
    results: list[Any] = [None] * len(cells)
    bar = _progress(len(cells), progress, desc)

    def done(i: int, res: Any) -> None:
        results[i] = res
        if on_result is not None:
            on_result(i, res)
        if bar is not None:
            bar.update(1)

    try:
        if not cells:
            return results
        if backend == "serial":
            for i, cell in enumerate(cells):
                done(i, _call(fn, cell, capture_errors))
        elif backend == "processes":
            _run_processes(fn, cells, jobs or default_jobs(), capture_errors, done)
        else:
            _run_ray(fn, cells, jobs, ray_address, capture_errors, done)
    finally:
        if bar is not None:
            bar.close()
    return results


def _run_processes(fn, cells, jobs, capture, done) -> None:
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    workers = min(jobs, len(cells))
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
    try:
        settings = _settings()
        pending = {
            pool.submit(_call, fn, cell, capture, settings): i for i, cell in enumerate(cells)
        }
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                done(pending.pop(fut), fut.result())
    finally:
        # An error or an interrupt: drop the cells not started, do not wait for them.
        pool.shutdown(wait=True, cancel_futures=True)


def _run_ray(fn, cells, jobs, address, capture, done) -> None:
    ray = init_ray(jobs, address)
    remote = ray.remote(_call).options(num_cpus=1, max_retries=0)
    fn_ref = ray.put(fn)
    settings = _settings()
    pending = {remote.remote(fn_ref, cell, capture, settings): i for i, cell in enumerate(cells)}
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                i = pending.pop(ref)
                try:
                    res = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:
                    # The cell's own exception, not Ray's wrapper, so callers handle it as
                    # they would on the other backends.
                    cause = getattr(exc, "cause", None)
                    if isinstance(cause, BaseException):
                        raise cause from None
                    raise
                done(i, res)
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
