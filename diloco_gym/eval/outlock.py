"""One writer per output directory: a lock file beside it.

``report``, ``frontier`` and ``sweep`` take an exclusive lock on ``.NAME.lock`` next to
their output directory ``NAME`` (beside the link's target when ``NAME`` is a symbolic link)
before they check or write it, and hold it until the output is complete; a second process
aiming at the same directory meanwhile is refused with a message naming the holder, instead
of silently replacing the first one's output or mixing with it. The lock is an advisory
``flock`` (POSIX), released by the operating system when its process dies, so a killed
run never blocks the next one; the file is removed when the lock is released normally.
"""

from __future__ import annotations

import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no locking
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "lock_path",
    "lock_out_dir",
    "out_target",
    "release_out_lock",
    "release_out_locks",
    "remove_stale_lock",
]

#: Locks this process holds: lock file -> open descriptor.
_HELD: dict[Path, int] = {}


def out_target(out: str | Path) -> Path:
    """The directory that is written for ``out``: its absolute path, or the target of a
    symbolic link (the link itself is kept and keeps pointing at the new output)."""
    full = Path(os.path.abspath(out))
    return Path(os.path.realpath(full)) if full.is_symlink() else full


def lock_path(out: str | Path) -> Path:
    """The lock file of output directory ``out``: ``.NAME.lock`` beside it."""
    full = out_target(out)
    return full.parent / f".{full.name}.lock"


def lock_out_dir(out: str | Path, what: str = "output") -> Path:
    """Take the lock of ``out`` for this process (again: a no-op); returns the lock file.

    Raises:
        FileExistsError: another process holds it (the message names its PID).
    """
    lock = lock_path(out)
    if lock in _HELD or fcntl is None:
        return lock
    lock.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(3):
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise FileExistsError(
                f"refusing to write the {what} to {out}: another diloco-gym process "
                f"(PID {holder}) is writing it now (lock file {lock}); wait for it to "
                f"finish or choose another directory"
            ) from None
        try:
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            _HELD[lock] = fd
            return lock
        os.close(fd)  # the holder released and removed it meanwhile: take the new file
    raise FileExistsError(
        f"refusing to write the {what} to {out}: its lock file {lock} keeps changing"
    )


def release_out_lock(out: str | Path) -> None:
    """Release (and remove) the lock of ``out`` if this process holds it."""
    _release(lock_path(out))


def release_out_locks() -> None:
    """Release every output lock this process holds (the command line does at exit)."""
    for lock in list(_HELD):
        _release(lock)


def _release(lock: Path) -> None:
    fd = _HELD.pop(lock, None)
    if fd is None:
        return
    try:
        os.unlink(lock)  # while still locked: a waiting opener then sees a new file
    except FileNotFoundError:
        pass
    os.close(fd)


def remove_stale_lock(out: str | Path) -> bool:
    """Remove the lock file of ``out`` that a killed process left (nobody holds it);
    returns whether it did. A lock this process or another live one holds is kept."""
    lock = lock_path(out)
    if lock in _HELD or fcntl is None:
        return False
    try:
        fd = os.open(lock, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False  # held by a live process
    try:
        os.unlink(lock)
    except FileNotFoundError:
        pass
    os.close(fd)
    return True
