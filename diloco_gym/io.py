"""Small output helpers any layer may use (a leaf: it imports nothing of the project).

* :func:`save_atomic` / :func:`write_text_atomic`: a file is written beside its destination
  under a hidden temporary name, flushed to disk and renamed into place, so that a kill
  leaves either the old file or the complete new one, never a torn one (POSIX ``rename``
  replaces a file atomically; :func:`os.replace` does the same on Windows);
* :func:`json_default` / :func:`json_strict`: ``json.dumps(default=...)`` for numpy scalars
  and arrays;
* :func:`free_port`: a free TCP port on the loopback interface.

The rules for output directories (whose a directory is, ``--force``, the atomic swap) are in
:mod:`diloco_gym.eval.output_dir`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "free_port",
    "json_default",
    "json_strict",
    "save_atomic",
    "write_text_atomic",
]


def save_atomic(save: Callable[[str], object], path: str | os.PathLike[str]) -> None:
    """Write a file with ``save(tmp)`` beside ``path`` and rename it into place.

    The temporary file is ``.STEM.partial-PID.SUFFIX`` in the destination's folder (same
    file system, so the rename is atomic; the suffix is kept for writers that add their
    own, such as Stable-Baselines3's ``.zip``). It is flushed to disk before the rename and
    removed when ``save`` fails.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.partial-{os.getpid()}{path.suffix}")
    try:
        save(str(tmp))
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`save_atomic`)."""
    save_atomic(lambda tmp: Path(tmp).write_text(text, encoding="utf-8"), path)


def json_strict(x: Any) -> Any:
    """``json.dumps(default=json_strict)``: numpy booleans, integers and floats as Python
    values, arrays as lists.

    Raises:
        TypeError: any other type (naming it), so that nothing is stored by accident.
    """
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"cannot store {type(x).__name__} as JSON")


def json_default(x: Any) -> Any:
    """``json.dumps(default=json_default)``: as :func:`json_strict`, and any other value as
    its ``str`` (for documents that record what they were given, such as a report's
    configuration)."""
    try:
        return json_strict(x)
    except TypeError:
        return str(x)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
