"""Size limits: what a file or a parameter may make the package allocate.

Every size an input implies (trace windows, decisions per episode, envs times episode
size, the merge corridor, a merge budget, a trace or settings file's bytes, a file's nesting
depth, a YAML file's values with its aliases expanded, a sweep's grid points, a fleet's
sites) is checked against a limit
*before* anything of that size is allocated, so that a 60-byte file or one option never
exhausts the machine. A value over its limit raises :class:`LimitError` (a ``ValueError``)
with one line naming the value, the limit and how to raise it: each limit can be changed
with an environment variable, ``DILOCO_GYM_MAX_<NAME>`` (see :data:`LIMITS`).

The defaults are far above anything the package needs for its own protocol (600 s
episodes of 536 decisions, a few hundred windows of a week-long trace, 1,024 vector envs)
and far below what would exhaust a laptop.

Model files (``model.zip``, a training run's checkpoints) are checked before anything in them
is read (:mod:`diloco_gym.agents.safe_model`): the file's size and every member's declared
uncompressed size, each and in total, against ``MODEL_BYTES`` (256 MiB; the members are then
read with a reader that stops at the limit, so a header that understates a member's size
cannot get past it), and the policy's parameter count, computed from the recorded
``net_arch`` and the spaces before the policy is built, against ``MODEL_PARAMS`` (16.8
million; the shipped models have under 20,000). The ``meta.json`` beside a model is read
only up to ``META_BYTES`` (16 MiB; a run directory's is a settings file:
``SETTINGS_BYTES``), and JSON nested deeper than
``JSON_DEPTH`` levels (a model's ``data`` entry, a ``meta.json``) is refused before it is
parsed. docs/limits.md lists every limit (generated from :data:`LIMITS`).

Parsing a file within these limits (its size, its nesting depth, a YAML file's aliases) is
:mod:`diloco_gym.sim.parsing`, which every settings and calibration loader calls.
"""

from __future__ import annotations

import os

__all__ = ["LIMITS", "LimitError", "check_limit", "limit", "limit_env_var", "markdown_table"]

#: ``name: (default, what it bounds)``; the environment variable is ``DILOCO_GYM_MAX_<NAME>``.
LIMITS: dict[str, tuple[int, str]] = {
    "WINDOWS": (2_000, "trace windows per replay (one episode each)"),
    "DECISIONS": (2**20, "decisions per episode (about 13.6 days at 1.12 s per decision)"),
    "BATCH_DECISIONS": (2**23, "envs x decisions per episode of a vector env"),
    "ENVS": (65_536, "envs of one vector env"),
    "MERGE_BUDGET": (2**16, "merges per episode of a merge budget"),
    "H_MAX_DECISIONS": (2**20, "decisions of the merge corridor's upper bound H_max"),
    "TRACE_BYTES": (2**31, "bytes of one trace file"),
    "CALIBRATION_BYTES": (2**26, "bytes of one calibration file"),
    "AGENT_SECONDS": (600, "seconds a sealed agent's worker may take to answer one message"),
    "MODEL_BYTES": (2**28, "bytes of one model file, and of its members uncompressed"),
    "MODEL_PARAMS": (2**24, "parameters (weights and biases) of one model's policy"),
    "META_BYTES": (2**24, "bytes of one meta.json beside a model file"),
    "JSON_DEPTH": (64, "nesting levels of a model's JSON (its data entry, its meta.json)"),
    "SETTINGS_BYTES": (
        2**24,
        "bytes of one settings or metadata file (sweep, tune, train config, fleet, link trace, "
        "meta.json)",
    ),
    "NESTING": (
        100,
        "levels of nested tables and lists in a settings, calibration or metadata file",
    ),
    "YAML_NODES": (100_000, "values of one YAML settings file, each alias expanded"),
    "GRID_POINTS": (10_000, "points of a sweep's grid (the product of its axes' lengths)"),
    "FLEET_SITES": (256, "sites of one fleet (about 2 MB of memory each)"),
    "DRAWS": (100_000, "matched-random draws per episode (100 times the default 1,000)"),
    "CAP_REJECTIONS": (
        10_000,
        "schedules drawn per matched-random draw kept under a fleet's per-site cap (rejection)",
    ),
    "REQUESTS": (
        2**22,
        "requests per episode of a synthetic regime (its busiest rate x the episode window), "
        "or that a correlated trace site takes from the common window",
    ),
    "MERGE_MB": (2**16, "MiB of a live calibration's merge tensor (each worker holds one)"),
}


class LimitError(ValueError):
    """An input implies a size above a documented limit (:data:`LIMITS`)."""


def limit_env_var(name: str) -> str:
    """The environment variable that overrides limit ``name``."""
    return f"DILOCO_GYM_MAX_{name}"


def limit(name: str) -> int:
    """The limit ``name`` in force: ``$DILOCO_GYM_MAX_<NAME>`` if set, else the default.

    Raises:
        LimitError: the environment variable is not a positive integer.
    """
    default, _ = LIMITS[name]
    var = limit_env_var(name)
    text = os.environ.get(var, "").strip()
    if not text:
        return default
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        value = 0
    if value < 1:
        raise LimitError(
            f"environment variable {var} must be a positive integer, got {text[:40]!r}"
        )
    return value


def check_limit(name: str, value: float, what: str) -> None:
    """Raise :class:`LimitError` when ``value`` exceeds limit ``name``.

    ``what`` names the value in the message, e.g. ``"the trace's 600 s windows"``.
    """
    bound = limit(name)
    if not value <= bound:  # also refuses NaN
        shown = (  # a 400-digit integer is shown by its digits (a float cannot hold it)
            f"{int(value):,}"
            if value == value and abs(value) < 1e18
            else f"{value:.3g}"
            if isinstance(value, float)
            else f"{str(value)[:8]}... ({len(str(value))} digits)"
        )
        raise LimitError(
            f"{what}: {shown} is above the limit of {bound:,} {LIMITS[name][1]} "
            f"(set {limit_env_var(name)} to raise it)"
        )


def _shown(name: str, value: int) -> str:
    """A default as the table shows it: the number, and a byte count in KiB/MiB/GiB."""
    text = f"{value:,}"
    if name.endswith("_BYTES"):
        for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if value >= size and value % size == 0:
                return f"{text} ({value // size} {unit})"
    return text


def markdown_table() -> str:
    """Every limit of :data:`LIMITS` as a Markdown table (name, default, variable, what it
    bounds): the table of docs/limits.md (a test keeps the page equal to it)."""
    rows = [
        "| limit | default | environment variable | what it bounds |",
        "|---|---|---|---|",
    ]
    for name, (default, what) in LIMITS.items():
        rows.append(f"| `{name}` | {_shown(name, default)} | `{limit_env_var(name)}` | {what} |")
    return "\n".join(rows) + "\n"
