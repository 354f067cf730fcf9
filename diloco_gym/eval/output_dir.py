"""Output directories: the one rule every command that writes a directory applies first
(:func:`owned_entries`: a new or empty directory, or one its marker file says is the
command's own; never a directory of someone else's files), used by the report, the
frontier, the fleet protocol, sweeps and training runs; and the report-like directories'
own rules: the marker that says a directory is one, the checks before ``--force`` replaces
it, and the atomic write (a complete sibling renamed into place; a killed run's leftovers
are cleaned next time). Single files are written with :func:`diloco_gym.io.save_atomic`."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from diloco_gym.eval.outlock import (
    lock_out_dir,
    out_target,
    release_out_lock,
    remove_stale_lock,
)

__all__ = [
    "MARKER",
    "owned_entries",
    "is_report_dir",
    "clean_leftovers",
    "prepare_out_dir",
    "write_output_dir",
]

#: The file every report directory holds; ``--force`` replaces only directories that have it.
MARKER = ".diloco-gym-report"
#: The marker's text, followed by the list of the files written.
_MARKER_TEXT = "diloco-gym report directory: `diloco-gym report --force` may replace it.\n"
#: The marker's line before the names of the files the report wrote (one a line).
_MARKER_FILES = "files written:\n"
#: The files a report or a frontier writes (a directory of only these, from a version that
#: wrote no marker or a marker without the file list, is also recognised as one; without a
#: marker, ``--force`` still refuses to replace it: see :func:`prepare_out_dir`).
_REPORT_FILE = re.compile(
    r"^(report\.md|report\.json|results\.csv|(fig|timeline|frontier)_.+\.png"
    r"|frontier\.(md|csv|json)|curves\.csv)$"
)
#: Sibling directories of a report being written (``partial``) or replaced (``old``).
_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?P<kind>partial|old)-(?P<pid>\d+)$")


def owned_entries(
    out: str | os.PathLike[str],
    marker: str,
    what: str,
    hint: str,
    *,
    marker_label: str | None = None,
    recognise: Callable[[list[str]], bool] | None = None,
) -> list[str]:
    """The entries of an output directory that a command may write into.

    A command writing a directory never writes among someone else's files: ``out`` must be
    missing, empty, or hold the file ``marker`` (by which the command recognises a directory
    it wrote: a report's :data:`MARKER`, a sweep's ``cells.jsonl``, a training run's
    ``meta.json``), or be recognised by ``recognise`` (a directory of an older release,
    written before the marker). What the command then does with its own directory (replace
    it with ``--force``, resume it) is its own rule.

    Args:
        what: the directory's kind in messages ("a diloco-gym report").
        hint: what to do instead, appended to the message ("choose another --out").
        marker_label: the marker as messages name it (default: its file name).
        recognise: ``entries -> bool``, whether an unmarked directory is the command's own.

    Returns:
        ``out``'s entry names, sorted (empty: a new or empty directory).

    Raises:
        FileExistsError: ``out`` is not a directory, or is a non-empty directory that is not
            the command's (the message names ``out``, a few of its entries and the marker).
    """
    out = Path(out)
    if not out.exists() and not out.is_symlink():
        return []
    if not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a directory; {hint}")
    entries = sorted(p.name for p in out.iterdir())
    ours = (out / marker).is_file() or (recognise is not None and recognise(entries))
    if entries and not ours:
        shown = ", ".join(repr(n) for n in entries[:5])
        more = f" and {len(entries) - 5} more" if len(entries) > 5 else ""
        raise FileExistsError(
            f"{out} is not {what}: it holds {len(entries)} entr"
            f"{'y' if len(entries) == 1 else 'ies'} ({shown}{more}) but no "
            f"{marker_label or marker}; {hint}"
        )
    return entries


def _old_report(entries: list[str]) -> bool:
    """An unmarked directory written by a release before the marker: a report's or a
    frontier's documents."""
    names = set(entries)
    return {"report.md", "results.csv"} <= names or "frontier.md" in names


def is_report_dir(path: str | Path) -> bool:
    """Whether ``path`` is a directory holding a diloco-gym report or frontier and nothing
    else: it has the :data:`MARKER` file and only the files the marker lists (or, for a
    marker without the list, only files a report writes), or, with no marker, it holds
    only files a report writes."""
    return _foreign_entries(Path(path)) == []


def _written_files(path: Path) -> set[str] | None:
    """The names the marker of ``path`` lists (``None``: no marker or no list)."""
    try:
        text = (path / MARKER).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if not text.startswith(_MARKER_TEXT[:24]) or _MARKER_FILES not in text:
        return None
    return {line for line in text.split(_MARKER_FILES, 1)[1].splitlines() if line}


def _foreign_entries(path: Path) -> list[str] | None:
    """The entries of ``path`` that no report wrote (``[]``: it is a report directory and
    nothing else), or ``None`` when ``path`` is no report directory at all."""
    if not path.is_dir():
        return None
    entries = sorted(path.iterdir())
    marked = (path / MARKER).is_file()
    listed = _written_files(path) if marked else None

    def foreign(p: Path) -> bool:
        if p.name == MARKER and marked:
            return False
        if p.is_symlink() or not p.is_file():
            return True  # a report writes plain files only
        return p.name not in listed if listed is not None else not _REPORT_FILE.match(p.name)

    out = [
        p.name + ("/" if p.is_dir() and not p.is_symlink() else "") for p in entries if foreign(p)
    ]
    if not marked and not _old_report([p.name for p in entries]):
        return None
    return out


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # our own leftovers (an earlier call in this process) are stale
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def clean_leftovers(out: str | Path) -> list[Path]:
    """Remove what an interrupted or killed ``write_report`` to ``out`` left beside it.

    These are the hidden siblings ``.NAME.partial-PID`` (a report being written) and
    ``.NAME.old-PID`` (the previous report being replaced) of a process that is no longer
    running, and a lock file ``.NAME.lock`` nobody holds; only directories that are
    empty or carry the report marker are removed.

    Returns:
        The directories removed.
    """
    out = Path(os.path.abspath(out))
    remove_stale_lock(out)  # the lock file of a killed run (nobody holds it)
    parent = out.parent
    removed: list[Path] = []
    if not parent.is_dir():
        return removed
    for p in parent.iterdir():
        m = _LEFTOVER.match(p.name)
        if not m or m["name"] != out.name or not p.is_dir() or p.is_symlink():
            continue
        if _pid_alive(int(m["pid"])):
            continue  # another report run is writing there right now
        if (p / MARKER).is_file() or not any(p.iterdir()):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def prepare_out_dir(out: str | Path, force: bool) -> Path:
    """Check ``out`` before any work, and clean a killed earlier run's leftovers.

    A missing or empty directory is fine. An existing report needs ``force``; ``force``
    never replaces the current directory, the home directory, a filesystem root, a
    directory that contains the current one, a directory that is not a diloco-gym
    report, a report directory that also holds anything the report did not write (the
    marker lists its files; the message names the others), or a directory without the
    :data:`MARKER` even when its files look like a report's (one of a release before the
    marker: nothing tells its files from a user's ``fig_mine.png``; the message names the
    directory and its entries), so that no user file can be lost. Takes the output's lock
    (:mod:`diloco_gym.eval.outlock`): a second process writing the same directory is
    refused.

    Raises:
        FileExistsError: ``out`` exists and may not be replaced (the message says why).
    """
    out = Path(out)
    full = out_target(out)
    cwd = Path.cwd().resolve()
    special = {cwd: "the current directory", Path.home().resolve(): "the home directory"}
    if out.exists():
        resolved = out.resolve()
        why = special.get(resolved)
        if why is None and resolved.parent == resolved:
            why = "a filesystem root"
        if why is None and resolved in cwd.parents:
            why = "a directory that contains the current directory"
        if why is not None:
            raise FileExistsError(
                f"refusing to write the report to {out}: it is {why}; "
                f"choose a new directory with --out"
            )
        if not out.is_dir():
            raise FileExistsError(
                f"refusing to write the report to {out}: it exists and is not a directory"
            )
    lock_out_dir(out)  # one writer at a time: a second process is refused here
    clean_leftovers(full)
    try:
        entries = owned_entries(
            out,
            MARKER,
            "a diloco-gym report",
            "--force replaces only a previous report; choose another --out",
            marker_label=f"diloco-gym report marker ({MARKER})",
            recognise=_old_report,
        )
    except FileExistsError as exc:
        raise FileExistsError(f"refusing to replace {out}: {exc}") from None
    if not entries:
        return out
    foreign = _foreign_entries(out) or []
    if foreign:
        shown = ", ".join(repr(n) for n in foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        raise FileExistsError(
            f"refusing to replace {out}: besides a previous report it holds {len(foreign)} "
            f"entr{'y' if len(foreign) == 1 else 'ies'} no report wrote ({shown}); "
            f"--force replaces only a report's own files: move them out or choose another --out"
        )
    if not (out / MARKER).is_file():
        # A report of a release before the marker: nothing says which of these files a
        # report wrote (a figure of the user's looks like one), so none is deleted.
        shown = ", ".join(repr(n) for n in entries[:5]) + (" ..." if len(entries) > 5 else "")
        raise FileExistsError(
            f"refusing to replace {out}: it has no diloco-gym report marker ({MARKER}), so "
            f"--force cannot tell the files a report wrote from yours ({len(entries)} "
            f"entr{'y' if len(entries) == 1 else 'ies'}: {shown}); move or delete them "
            f"yourself, or choose another --out"
        )
    if not force:
        raise FileExistsError(f"report directory {out} already exists; pass --force to replace it")
    return out


def write_output_dir(out: str | Path, force: bool, fill: Callable[[Path], None]) -> Path:
    """Fill a new output directory with ``fill(tmp)`` and put it at ``out`` atomically.

    The directory is written completely to the hidden sibling ``.OUT.partial-PID`` (the
    marker file first, then ``fill``); only then is an existing output renamed aside to
    ``.OUT.old-PID``, the new one renamed into place, and the old one deleted. An
    interrupted run removes its partial directory and puts the old output back; a killed
    one leaves marked siblings that the next run (:func:`clean_leftovers`) removes, and
    ``out`` itself is always either the old or the new complete output. The marker lists
    the files written, so that a later ``force`` replaces only a directory holding nothing
    else. The lock file ``.OUT.lock`` (:mod:`diloco_gym.eval.outlock`) is held from the
    check to the end, so a concurrent second writer is refused. When ``out`` is a symbolic
    link, the link is kept and its target is replaced. Used by the report and the
    frontier.

    Raises:
        FileExistsError: see :func:`prepare_out_dir`.
    """
    out = Path(out)
    try:
        prepare_out_dir(out, force)
        _write_output_dir(out_target(out), fill)
    finally:
        release_out_lock(out)
    return out


def _write_output_dir(full: Path, fill: Callable[[Path], None]) -> None:
    """Write ``full`` through its ``.partial-PID`` sibling (see :func:`write_output_dir`)."""
    full.parent.mkdir(parents=True, exist_ok=True)
    tmp = full.parent / f".{full.name}.partial-{os.getpid()}"
    old = full.parent / f".{full.name}.old-{os.getpid()}"
    for stale in (tmp, old):
        if stale.exists():
            shutil.rmtree(stale)
    tmp.mkdir()
    moved_aside = False
    try:
        (tmp / MARKER).write_text(_MARKER_TEXT)  # first: a killed run's leftover is marked
        fill(tmp)
        written = sorted(p.name for p in tmp.iterdir() if p.name != MARKER)
        (tmp / MARKER).write_text(_MARKER_TEXT + _MARKER_FILES + "".join(n + "\n" for n in written))
        if full.exists():
            os.replace(full, old)
            moved_aside = True
        os.replace(tmp, full)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if moved_aside and not full.exists():
            os.replace(old, full)
        raise
    if moved_aside:
        shutil.rmtree(old, ignore_errors=True)
