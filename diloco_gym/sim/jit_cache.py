"""Where the compiled modules' machine code is cached: a per-user cache directory, never the
installed package's own folder.

Every compiled module (:mod:`diloco_gym.sim.jit` and its siblings) decorates its functions
with this module's :func:`njit` instead of numba's: ``njit(cache=True)`` then caches the
machine code in ``platformdirs.user_cache_dir("diloco-gym") / <version> / "numba"``
(``~/.cache/diloco-gym/0.5.0/numba`` on Linux, under ``$XDG_CACHE_HOME`` when that is set),
and a later process loads it instead of compiling it again. Left to itself, numba writes
its cache into the ``__pycache__`` folder beside the sources whenever that is writable, that
is into ``site-packages/diloco_gym`` after ``pip install .``: files that pip did not install
and does not uninstall, which a later ``pip install -e .`` leaves behind as a folder without
``__init__.py`` that Python imports as a namespace package in place of the editable one.

A ``NUMBA_CACHE_DIR`` set in the environment still wins (numba's own setting). When the
directory cannot be created or written (a read-only home, a sandbox), the functions are
compiled without an on-disk cache (one warning says so): the package works, each process
compiles what it runs.

The directory is given to numba only while a function is decorated (numba picks a
function's cache location then), through ``numba.config.CACHE_DIR``: the process
environment is left alone, so the caller's own numba functions keep numba's defaults.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Callable
from functools import lru_cache
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

#: The application name of the per-user cache directory.
APP_NAME = "diloco-gym"


def default_cache_dir() -> str:
    """The per-user directory of the compiled code of this version of the package,
    ``user_cache_dir("diloco-gym") / <version> / "numba"`` (not created here)."""
    from importlib.metadata import PackageNotFoundError, version

    from platformdirs import user_cache_dir

    try:  # the installed distribution's version, as ``diloco_gym.__version__`` gives it
        release = version("diloco-gym")
    except PackageNotFoundError:  # a source tree on sys.path that was never installed
        release = "0+unknown"
    return os.path.join(user_cache_dir(APP_NAME, appauthor=False), release, "numba")


def _writable(path: str) -> bool:
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


@lru_cache(maxsize=1)
def cache_dir() -> str | None:
    """The directory numba caches the package's compiled code in: ``NUMBA_CACHE_DIR`` when
    set, else :func:`default_cache_dir`; created if missing. ``None`` (with a warning) when
    it cannot be created or written: the functions are then compiled without a cache."""
    override = os.environ.get("NUMBA_CACHE_DIR", "")
    path = override or default_cache_dir()
    if _writable(path):
        return path
    source = "NUMBA_CACHE_DIR" if override else "the per-user cache directory"
    warnings.warn(
        f"diloco-gym: {source} {path!r} cannot be written; the compiled kernel is compiled "
        "in every process (set NUMBA_CACHE_DIR to a writable directory to cache it)",
        RuntimeWarning,
        stacklevel=2,
    )
    return None


def njit(**options: Any) -> Callable[[F], F]:
    """``numba.njit(**options)`` with ``cache=True`` pointed at :func:`cache_dir` (or turned
    off when there is none), so that nothing is ever written beside the package's
    sources. Used as ``@njit(cache=True)``, ``@njit(cache=True, parallel=True)``."""
    import numba
    from numba.core import config as numba_config

    config: Any = numba_config  # its settings are set at run time, unknown to mypy

    def decorate(func: F) -> F:
        if not options.get("cache"):
            return numba.njit(**options)(func)
        path = cache_dir()
        if path is None:
            return numba.njit(**{**options, "cache": False})(func)
        before = config.CACHE_DIR
        config.CACHE_DIR = path  # read by numba's cache locator as it decorates
        try:
            return numba.njit(**options)(func)
        finally:
            config.CACHE_DIR = before

    return decorate
