"""A sweep's store of finished cells, ``OUT/cells.jsonl`` (:mod:`diloco_gym.scale.sweep`).

One JSON record a line, appended (and synced to disk) the moment a cell finishes: its
``key`` (the fingerprint of what it depends on), ``ok``, and its ``result`` or ``error``.
Reading the store keeps every valid record: a half-written last line (a killed run) is
cut off, and any other line that is not a cell record (corrupted, edited, cut in the
middle of the file) is moved to :data:`REJECTED_FILE` with a :class:`SweepStoreWarning`
naming the file and the line. The cells after such a line are kept; its own cell is
missing, so a resumed sweep runs it again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from diloco_gym.io import json_strict, save_atomic

__all__ = ["REJECTED_FILE", "SweepStoreWarning", "CellStore"]


class SweepStoreWarning(UserWarning):
    """A line of a sweep's ``cells.jsonl`` that is not a cell record was set aside (the
    message names the file and the line); its cell runs again."""


#: Where the lines of ``cells.jsonl`` that are not cell records are moved (kept, not lost).
REJECTED_FILE = "cells.rejected.jsonl"
#: The keys' kinds: a unit cell (a fleet point's episode too), a calibration cell, a fleet
#: point's calibration cell, and a fleet point of sweeps before 0.6 (one cell per point;
#: such a record is read, not used).
_KEY_KINDS = ("unit/", "cal/", "fleet-cal/", "fleet/")


def _record_problem(rec: Any) -> str | None:
    """Why ``rec`` (a parsed line of ``cells.jsonl``) is not a cell record, or ``None``:
    a ``key`` of a known kind, ``ok`` a boolean, an ``error`` string for a failed cell and
    for a finished one the ``result`` its outputs read."""
    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not an object"
    key = rec.get("key")
    if not isinstance(key, str) or not key.startswith(_KEY_KINDS):
        return f"no cell key (got {key!r:.60})"
    ok = rec.get("ok")
    if not isinstance(ok, bool):
        return f"'ok' must be true or false, got {ok!r:.60}"
    if not ok:
        return None if isinstance(rec.get("error"), str) else "a failed cell without its 'error'"
    res = rec.get("result")
    kinds: dict[str, dict[str, type]] = {
        "unit/": {"rows": list},
        "cal/": {"sim": dict},
        "fleet-cal/": {"verdict": str, "rows": list},
        "fleet/": {
            "rows": list,
            "summary": list,
            "calibration_verdict": str,
            "agent_sealing": str,
        },
    }
    need = kinds[key[: key.index("/") + 1]]
    if not isinstance(res, dict) or any(not isinstance(res.get(k), t) for k, t in need.items()):
        return f"a finished cell without its result ({', '.join(need)})"
    if key.startswith(("unit/", "fleet/")) and not all(isinstance(r, dict) for r in res["rows"]):
        return "a result whose rows are not objects"
    return None


class CellStore:
    """The append-only record of finished cells (``cells.jsonl``).

    Reading it keeps every valid record. A half-written last line (a killed run) is cut
    off; any other line that is not a cell record (corrupted, edited, truncated in the
    middle) is moved to :data:`REJECTED_FILE` beside it, with a
    :class:`SweepStoreWarning` naming the file and the line: the cells after it are kept,
    and the rejected line's cell is missing, so a resumed sweep runs it again.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: dict[str, dict] = {}
        if path.exists():
            self._load()

    def _load(self) -> None:
        import warnings

        raw = self.path.read_bytes()
        kept: list[bytes] = []
        rejected: list[bytes] = []
        lines = raw.splitlines(keepends=True)
        for n, line in enumerate(lines, 1):
            if not line.endswith(b"\n"):  # the last line of a killed run, half written
                warnings.warn(
                    f"{self.path} line {n}: a half-written last record (an interrupted "
                    f"run) was dropped; its cell runs again",
                    SweepStoreWarning,
                    stacklevel=3,
                )
                break
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
                why: str | None = f"not JSON ({' '.join(str(exc).split())})"
            else:
                why = _record_problem(rec)
            if why is not None:
                rejected.append(line)
                warnings.warn(
                    f"{self.path} line {n}: not a cell record: {why}; moved to "
                    f"{self.path.parent / REJECTED_FILE}, its cell runs again",
                    SweepStoreWarning,
                    stacklevel=3,
                )
                continue
            self.records[rec["key"]] = rec
            kept.append(line)
        if rejected:
            with open(self.path.parent / REJECTED_FILE, "ab") as f:
                f.write(b"".join(rejected))
                f.flush()
                os.fsync(f.fileno())
        if rejected or sum(map(len, kept)) < len(raw):
            data = b"".join(kept)
            save_atomic(lambda tmp: Path(tmp).write_bytes(data), self.path)

    def add(self, rec: dict) -> None:
        line = json.dumps(rec, default=json_strict) + "\n"
        with open(self.path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.records[rec["key"]] = rec
