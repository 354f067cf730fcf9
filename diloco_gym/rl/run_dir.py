"""A training run's directory: what it holds, the checks before a run writes into it, the
checkpoints ``--resume`` continues from, and the atomic write of a model file.

A run writes :data:`RUN_ARTEFACTS` in its directory; ``meta.json`` is written first (status
``training``), so that an interrupted run is recognised, resumed or replaced later, and
``--force`` removes only these files.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from diloco_gym.eval.output_dir import owned_entries
from diloco_gym.io import save_atomic

__all__ = [
    "RUN_ARTEFACTS",
    "check_run_dir",
    "latest_checkpoint",
    "checkpoints_newest_first",
    "model_file_problem",
    "read_meta",
    "write_start_meta",
    "save_atomic",
]

#: What a training run writes in its directory (``--force`` removes these and nothing else).
RUN_ARTEFACTS = (
    "model.zip",
    "best_model.zip",
    "meta.json",
    "checkpoints",
    "tb",
    "validation.csv",
    "validation.png",
)

_CHECKPOINT_RE = re.compile(r"_(\d+)_steps\.zip$")


def latest_checkpoint(out: str | Path) -> Path | None:
    """The checkpoint in ``out/checkpoints`` with the most timesteps, or ``None``."""
    found = checkpoints_newest_first(out)
    return found[0] if found else None


def checkpoints_newest_first(out: str | Path) -> list[Path]:
    """The checkpoints in ``out/checkpoints``, the one with the most timesteps first."""
    ckpt_dir = Path(out) / "checkpoints"
    found: list[tuple[int, Path]] = []
    for p in ckpt_dir.glob("*_steps.zip") if ckpt_dir.is_dir() else []:
        m = _CHECKPOINT_RE.search(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found, key=lambda t: t[0], reverse=True)]


def model_file_problem(path: Path) -> str | None:
    """Why ``path`` is not a complete saved model (a truncated or torn zip), or ``None``.

    A Stable-Baselines3 model file is a zip archive holding ``data`` (the parameters of
    the algorithm) and the policy weights; every member's CRC is checked.
    """
    import zipfile

    from diloco_gym.agents.safe_model import UnsafeModelError, check_model_archive

    try:
        check_model_archive(path)  # sizes within MODEL_BYTES before any member is read
    except UnsafeModelError as exc:
        return exc.what or str(exc)
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            if "data" not in names or not any(n.endswith(".pth") for n in names):
                return "not a complete Stable-Baselines3 model (no data or weights)"
            bad = archive.testzip()
            if bad is not None:
                return f"member {bad!r} is corrupt (CRC mismatch)"
    except (OSError, zipfile.BadZipFile, EOFError, ValueError) as exc:
        return f"not a readable zip archive ({exc})"
    return None


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook``: a key given twice in one object is an error, not the last."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key[:60]!r}")
        out[key] = value
    return out


def read_meta(path: Path) -> dict[str, Any]:
    """A run's ``meta.json``, read strictly (UTF-8 with or without a byte-order mark, a key
    given twice is an error) and within the settings files' limits (``SETTINGS_BYTES``,
    ``NESTING``: :mod:`diloco_gym.sim.limits`).

    Raises:
        ValueError: unreadable, too large or deep, not JSON, or not a JSON object (one line
            naming the file).
    """
    from diloco_gym.sim import parsing
    from diloco_gym.sim.limits import LimitError

    try:  # at most DILOCO_GYM_MAX_SETTINGS_BYTES, DILOCO_GYM_MAX_NESTING levels deep
        text = parsing.read_text(path, encoding="utf-8-sig", what="metadata size in bytes")
        meta = parsing.parse_json(text, str(path), object_pairs_hook=_no_duplicate_keys)
    except LimitError:
        raise
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read the run's metadata: {exc}") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: the run's metadata is not a JSON object")
    return meta


def write_start_meta(out: Path, algo: str, label: str, seed: int, command: str | None) -> None:
    """meta.json of a run that has started: written first, so that an interrupted run can
    be resumed (and checked) later."""
    start = {
        "algo": algo,
        "regime": label,
        "seed": int(seed),
        "status": "training",
        "command": command,
        "name": f"learned:{algo}-{label}",
    }
    (out / "meta.json").write_text(json.dumps(start, indent=2) + "\n")


def _has_saved_model(out: Path) -> bool:
    """Whether the run in ``out`` saved a checkpoint or a final model."""
    return bool(checkpoints_newest_first(out)) or (out / "model.zip").is_file()


def check_run_dir(
    out: str | Path,
    algo: str,
    regime: str,
    resume: bool = False,
    force: bool = False,
    apply: bool = True,
    learners: str | None = None,
) -> Path | None:
    """Check the output directory of a training run before anything is written.

    A missing or empty directory starts a new run. An existing run (a directory with
    ``meta.json``, written when a run starts) is continued only with ``resume`` and the
    same algorithm and regime as its metadata, or replaced with ``force`` (which removes
    the files in :data:`RUN_ARTEFACTS` and nothing else). A non-empty directory that is
    not a run is never used.

    Args:
        apply: with ``force``, remove the previous run's files (``False``: only check).
        learners: with ``resume``, the SHA-256 of the learner calibration the run goes on
            with (``""``: the default learners; ``None``: not checked); the run's
            ``meta.json`` must record the same (none recorded: the default learners).

    With ``resume``, the latest checkpoint is verified first (:func:`model_file_problem`);
    a damaged one (truncated by a kill, say) is skipped with a warning on stderr for the
    previous one. A run killed before its first checkpoint (``meta.json`` says
    ``training`` and nothing was saved) is resumed as a fresh start.

    Returns:
        With ``resume``, the file to continue from (the latest intact checkpoint, else
        ``model.zip``; ``None``: nothing was saved, start afresh); otherwise ``None``.

    Raises:
        FileExistsError: ``out`` holds a run (without ``resume`` / ``force``), is not a
            directory, or is a non-empty directory that is not a run.
        FileNotFoundError: ``resume`` and there is no run (or nothing to continue from).
        ValueError: ``resume`` with another algorithm, regime or learner calibration than
            the run's, or both ``resume`` and ``force``.
    """
    out = Path(out)
    if resume and force:
        raise ValueError(
            "--resume and --force exclude each other: --resume continues the "
            "run in OUT, --force replaces it"
        )
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a directory")
    if resume:
        return _resume_from(out, algo, regime, learners)
    if not owned_entries(out, "meta.json", "a diloco-gym training run", "choose another --out"):
        return None
    _refuse_unless_forced(out, force)
    for name in RUN_ARTEFACTS if apply else ():
        target = out / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
    return None


def _resume_from(out: Path, algo: str, regime: str, learners: str | None = None) -> Path | None:
    """The file ``--resume`` continues from (see :func:`check_run_dir`)."""
    meta_path = out / "meta.json"
    if not meta_path.is_file():
        raise FileNotFoundError(
            f"--resume: there is no training run in {out} (no "
            f"meta.json); leave out --resume to start a new run"
        )
    meta = read_meta(meta_path)
    for key, want in (("algo", algo), ("regime", regime)):
        if meta.get(key) != want:
            flag = "--algo" if key == "algo" else "--regime"
            raise ValueError(
                f"--resume: {out} is a {meta.get('algo')} run on "
                f"{meta.get('regime')}; it cannot continue with {flag} "
                f"{want} (pass {flag} {meta.get(key)}, or --force to "
                f"start over)"
            )
    _check_learners(out, meta, learners)
    candidates = checkpoints_newest_first(out)
    if (out / "model.zip").is_file():
        candidates.append(out / "model.zip")
    for i, candidate in enumerate(candidates):
        problem = model_file_problem(candidate)
        if problem is None:
            return candidate
        after = candidates[i + 1] if i + 1 < len(candidates) else None
        print(
            f"diloco-gym: warning: {candidate} is damaged ({problem}); "
            + (f"continuing from {after.name} instead" if after else "no earlier one"),
            file=sys.stderr,
        )
    if not candidates and meta.get("status") == "training":
        return None  # stopped before its first checkpoint: resumed as a fresh start
    raise FileNotFoundError(
        f"--resume: {out} has no intact checkpoint and no model.zip to continue from; "
        f"--force replaces the run (it removes only the run's own files)"
    )


def _check_learners(out: Path, meta: dict, learners: str | None) -> None:
    """``ValueError`` when ``--resume`` would continue with other learners than the run
    was trained with (``learners``: the new config's learner calibration SHA-256, ``""``
    for the default learners, ``None``: not checked)."""
    if learners is None:
        return
    recorded = (meta.get("config") or {}).get("learner_calibration_file")
    was = recorded.get("sha256") if isinstance(recorded, dict) else ""
    if was == learners:
        return

    def name(sha: str | None) -> str:
        return f"the learner calibration with sha256 {sha[:12]}" if sha else "the default learners"

    raise ValueError(
        f"--resume: {out} was trained with {name(was)}; it cannot continue with "
        f"{name(learners)} (give [env] learner_calibration the run's file, or --force to "
        "start over)"
    )


def _refuse_unless_forced(out: Path, force: bool) -> None:
    """A non-empty ``out`` holding a run (:func:`~diloco_gym.eval.output_dir.owned_entries` checked
    its ``meta.json``) is used only when ``force`` replaces it."""
    meta_path = out / "meta.json"
    if force:
        return
    meta = read_meta(meta_path)
    if meta.get("status") == "training" and not _has_saved_model(out):
        raise FileExistsError(
            f"{out} holds a {meta.get('algo')} run on {meta.get('regime')} that stopped "
            f"before its first checkpoint (nothing saved to continue from): --resume "
            f"starts it afresh, and --force is safe (it removes only the run's own files)"
        )
    raise FileExistsError(
        f"{out} already holds a training run ({meta.get('algo')} on "
        f"{meta.get('regime')}, {meta.get('status', 'complete')}); "
        f"pass --resume to continue it or --force to replace it"
    )
