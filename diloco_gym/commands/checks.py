"""Checks several ``diloco-gym`` commands make of their options before any work: a known
regime, a known agent (or a model file), one that runs without a merge budget, a loadable
agent, a readable learner calibration, an output directory it may write and no option a fleet
run does not use; each failure is the command line's usage or data error."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from diloco_gym.commands.extras import missing_extra
from diloco_gym.errors import DataError, UsageError
from diloco_gym.sim.regimes import REGIMES

__all__ = [
    "check_backend",
    "check_regime",
    "check_agent",
    "check_free_agent",
    "check_single_host",
    "fleet_merge_budget",
    "check_run_agent",
    "load_agent",
    "check_learner_calibration",
    "warn_learner_mismatch",
    "check_out_dir",
    "check_no_fleet_options",
]


def check_sandbox(args: argparse.Namespace) -> None:
    """``--require-sandbox``: refuse a run whose sealed agents would get less than the full
    sandbox, before anything is computed."""
    if not getattr(args, "require_sandbox", False):
        return
    if getattr(args, "in_process_agents", False):
        raise UsageError("--require-sandbox and --in-process-agents exclude each other")
    from diloco_gym.eval.sealed import require_sandbox, sandbox_status

    status = sandbox_status()
    if status["level"] != "full":
        raise DataError(
            f"--require-sandbox: this machine gives sealed agents the {status['level']} "
            f"sandbox level (missing: {', '.join(status['missing'])}; platform "
            f"{status['platform']}); full needs Linux with Landlock and namespaces"
        )
    require_sandbox(True)


def check_backend(args: argparse.Namespace) -> None:
    """Refuse backend options that cannot apply, and a missing Ray, before any work."""
    if args.ray_address and args.backend != "ray":
        raise UsageError(f"--ray-address needs --backend ray (got --backend {args.backend})")
    if args.backend == "ray":
        try:
            import ray  # noqa: F401
        except ImportError as exc:
            raise missing_extra(f"--backend ray of {args.command}", ["ray"], exc) from None


def check_regime(name: str) -> str:
    if name not in REGIMES:
        raise UsageError(f"unknown regime {name!r}; valid regimes: {', '.join(REGIMES)}")
    return name


def check_agent(name: str) -> str:
    """A registry name, a model path, or your own code (``module:attr``,
    ``path/to/file.py:attr``), which is loaded here so that a missing file, a failed import,
    a missing attribute or an object without ``predict`` is a one-line data error before
    any episode runs."""
    from diloco_gym.agents.registry import AGENTS
    from diloco_gym.agents.user import AgentSpecError, is_user_spec, load_user_agent

    if name.endswith("+own") and len(name) > 4:  # a rounds fleet's own-forecast site rule
        check_agent(name[:-4])
        return name
    if name in AGENTS or name.endswith(".zip") or Path(name).exists():
        return name
    if is_user_spec(name):
        try:
            load_user_agent(name)
        except AgentSpecError as exc:
            raise DataError(str(exc)) from None
        return name
    raise UsageError(
        f"unknown agent {name!r}; valid agents: {', '.join(AGENTS)} "
        f"(or a path to a trained model .zip, or your own code as module:attr or "
        f"path/to/file.py:attr)"
    )


def check_single_host(names: list[str]) -> None:
    """Agents that run on a fleet only (``FLEET_ONLY``: they read a fleet option's
    features) are a usage error on a single host, found before anything runs."""
    from diloco_gym.agents.registry import FLEET_NEEDS, FLEET_ONLY

    fleet_only = list(dict.fromkeys(n for n in names if n in FLEET_ONLY))
    if fleet_only:
        needs = "; ".join(f"{n} needs {FLEET_NEEDS[n]}" for n in fleet_only)
        raise UsageError(
            f"{', '.join(fleet_only)}: runs only on a fleet ({needs} in its [fleet] table); "
            f"give the fleet file with --fleet"
        )


def check_free_agent(name: str, fleet: str | None = None) -> str:
    """A known agent that can run without a merge budget (``run`` and ``report`` give
    none; ``fleet``: the ``--fleet`` file, whose ``[env]`` has no ``merge_budget``):
    budget-aware agents are a usage error, found before anything runs."""
    from diloco_gym.agents.registry import is_budget_aware_spec

    check_agent(name)
    if fleet is None:
        check_single_host([name])
    if is_budget_aware_spec(name.removesuffix("+own")):
        also = (
            f", or set merge_budget in the [env] table of {fleet} to run it at that budget"
            if fleet
            else ""
        )
        raise UsageError(
            f"{name} steers by a merge budget and runs only with one; compare it at "
            f"every budget of a grid with `diloco-gym frontier --budget-agents {name}`{also}"
        )
    return name


def check_run_agent(name: str, fleet: str | None = None) -> str:
    """:func:`check_free_agent`, except on a ``--fleet`` file whose ``[env]`` sets
    ``merge_budget``: every episode there has that budget, so a budget-aware agent runs."""
    if fleet is not None and fleet_merge_budget(fleet) is not None:
        return check_agent(name)
    return check_free_agent(name, fleet=fleet)


def fleet_merge_budget(path: str) -> Any:
    """The ``merge_budget`` of a fleet file's ``[env]`` table (``None`` without one); a
    file that does not load is a one-line data error naming it."""
    from diloco_gym.sim.fleet import FleetConfigError
    from diloco_gym.sim.fleet_toml import load_fleet_toml

    try:
        _, env = load_fleet_toml(path)
    except FleetConfigError as exc:
        raise DataError(str(exc)) from None
    return env.get("merge_budget")


def load_agent(name: str):
    from diloco_gym.agents.registry import make_agents

    check_agent(name)
    try:
        return make_agents([name])[0]
    except (ValueError, OSError) as exc:  # a missing or corrupt model file
        raise DataError(str(exc)) from None


def check_learner_calibration(path: str | None) -> None:
    """A bad ``--learner-calibration`` file is a data error, before any episode runs."""
    if path is not None:
        from diloco_gym.sim.learner_calibration import load_learner_calibration

        try:
            load_learner_calibration(path)
        except ValueError as exc:
            raise DataError(str(exc)) from None


def check_out_dir(out: str, force: bool) -> None:
    """``--out``/``--force``: a directory the command may write (new, empty, or with
    ``--force`` a previous report's); any other is a usage error, before any work."""
    from diloco_gym.eval.output_dir import prepare_out_dir

    try:
        prepare_out_dir(out, force)
    except (FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
        raise UsageError(str(exc)) from None


def check_no_fleet_options(args: argparse.Namespace, parallel: bool = False) -> None:
    """Options a fleet run does not use are a usage error, not silently dropped
    (``parallel``: the command runs a fleet's episodes on ``--backend``, as ``report`` and
    ``frontier`` do)."""
    unused = {
        "--stride-s": getattr(args, "stride_s", None) is not None,
        "--sidecar": getattr(args, "sidecar", None) is not None,
        "--rate-scale": getattr(args, "rate_scale", None) is not None,
        "--target-utilization": getattr(args, "target_utilization", None) is not None,
        "--format": getattr(args, "trace_format", "auto") != "auto",
        "--window-s": getattr(args, "window_s", 600.0) != 600.0,
        "--holm-across-settings": bool(getattr(args, "holm_across_settings", False)),
        "--learner-calibration": getattr(args, "learner_calibration", None) is not None,
    }
    if not parallel:
        unused = {
            "--backend": getattr(args, "backend", "serial") != "serial",
            "--jobs": getattr(args, "jobs", None) is not None,
            "--ray-address": getattr(args, "ray_address", None) is not None,
            **unused,
        }
    given = [k for k, v in unused.items() if v]
    if given:
        raise UsageError(
            f"{', '.join(given)} not used with --fleet (its sites, windows and loads are set "
            f"in the fleet file{'' if parallel else '; it runs in this process'})"
        )


def warn_learner_mismatch(agents: list[str], learner_calibration: str | None) -> None:
    """Warn (one line per agent, :class:`~diloco_gym.agents.learned.LearnerMismatchWarning`)
    for each learned agent whose ``meta.json`` records other learners than the run judges
    it with: a learner calibration file with another SHA-256, or none where the run has
    one (and the other way round). Its learner observations then differ from training's."""
    import hashlib
    import warnings

    from diloco_gym.agents.learned import LearnerMismatchWarning, trained_learners
    from diloco_gym.sim.learner_calibration import shipped_path

    def sha(path: str) -> str:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()

    judged = "" if learner_calibration is None else sha(learner_calibration)
    shipped = sha(shipped_path())
    for agent in agents:
        trained = trained_learners(agent)
        if trained is None or trained == judged:
            continue
        was = f"learner calibration sha256 {trained[:12]}" if trained else "the default learners"
        now = f"{learner_calibration} (sha256 {judged[:12]})" if judged else "the default learners"
        if trained == shipped:
            fix = "judge it with --learner-calibration shipped, DiLoCoSync-v2's learners"
        elif trained:
            fix = "judge it with --learner-calibration and the file it was trained with"
        else:
            fix = "judge it without --learner-calibration"
        warnings.warn(
            f"{agent} was trained with {was} and is judged with {now}: its learner "
            f"observations differ from training's ({fix})",
            LearnerMismatchWarning,
            stacklevel=2,
        )
