"""Small output helpers any layer may use (a leaf: it imports nothing of the project).

* :func:`save_atomic` / :func:`write_text_atomic`: a file is written beside its destination
  under a hidden temporary name, flushed to disk and renamed into place, so that a kill
  leaves either the old file or the complete new one, never a torn one (POSIX ``rename``
  replaces a file atomically; :func:`os.replace` does the same on Windows);
* :func:`json_default` / :func:`json_strict`: ``json.dumps(default=...)`` for numpy scalars
  and arrays;
* :func:`free_port`: a free TCP port on the loopback interface;
* :func:`owned_entries`: the rule every command that writes a directory (a report, a
  frontier, a sweep, a training run) applies first: it writes only into a new or empty
  directory or one that its own marker file says is its own.
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
    "owned_entries",
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


def owned_entries(out: str | os.PathLike[str], marker: str, what: str, hint: str) -> list[str]:
    """The entries of an output directory that a command may write into.

    A command writing a directory never writes among someone else's files: ``out`` must be
    missing, empty, or hold ``marker`` (the file by which the command recognises a directory
    it wrote: a report's marker, a sweep's ``cells.jsonl``, a training run's ``meta.json``).
    What the command then does with its own directory (replace it with ``--force``, resume
    it) is its own rule.

    Args:
        marker: the file name that marks the command's own directory.
        what: the directory's kind in messages ("a diloco-gym report", "a sweep's
            directory").
        hint: what to do instead, appended to the message ("choose another --out").

    Returns:
        ``out``'s entry names, sorted (empty: a new or empty directory).

    Raises:
        FileExistsError: ``out`` is not a directory, or is a non-empty directory without
            ``marker`` (the message names ``out``, a few of its entries and the marker).
    """
    out = Path(out)
    if not out.exists() and not out.is_symlink():
        return []
    if not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a directory; {hint}")
    entries = sorted(p.name for p in out.iterdir())
    if entries and not (out / marker).is_file():
        shown = ", ".join(repr(n) for n in entries[:5])
        more = f" and {len(entries) - 5} more" if len(entries) > 5 else ""
        raise FileExistsError(
            f"{out} is not {what}: it holds {len(entries)} entr"
            f"{'y' if len(entries) == 1 else 'ies'} ({shown}{more}) but no {marker}; {hint}"
        )
    return entries
