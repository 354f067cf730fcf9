"""``diloco-gym run``: one agent on a regime's seeds, a trace's windows or a fleet's episodes,
a per-seed table (each mode's checks in a step of its own)."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from diloco_gym.commands import checks, options
from diloco_gym.commands.jobs import fleet_env_error
from diloco_gym.errors import DataError, UsageError
from diloco_gym.sim.regimes import REGIMES
from diloco_gym.text import count

__all__ = ["HELP", "add_arguments", "run"]

#: The line of ``diloco-gym --help``.
HELP = "run one agent on a regime or a trace, per-seed table"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``run`` command's options."""
    p.add_argument(
        "--agent",
        required=True,
        help="agent name, trained model .zip, or your own scheduler as module:attr or "
        "path/to/file.py:attr (docs/your-scheduler.md)",
    )
    p.add_argument("--regime", default="bursty", help=f"one of {', '.join(REGIMES)}")
    p.add_argument("--seeds", type=options.positive_int(1), default=20, help="number of episodes")
    options.add_seed0_arg(p)
    options.add_trace_args(p)
    options.add_trust_arg(p)
    options.add_sealing_arg(p)
    options.add_fleet_arg(p)
    options.add_learner_calibration_arg(p, priced=False)


def run(args: argparse.Namespace) -> int:
    """Run the agent on the regime's seeds, the trace's windows or the fleet's episodes and
    print one row per episode."""
    checks.check_sandbox(args)
    if getattr(args, "fleet", None):
        return _run_fleet(args)
    if not args.trace:
        checks.check_regime(args.regime)
    checks.check_free_agent(args.agent)
    checks.check_learner_calibration(args.learner_calibration)
    checks.warn_learner_mismatch([args.agent], args.learner_calibration)
    agent = _sealed(args, checks.load_agent(args.agent))
    units, label = _units(args, _config(args))
    _print_episodes(agent, label, units)
    return 0


def _sealed(args: argparse.Namespace, agent: Any) -> Any:
    """The agent as it runs: in a worker process of its own unless ``--in-process-agents``."""
    if args.in_process_agents:
        return agent
    from diloco_gym.eval.sealed import seal_agents

    return seal_agents([agent])[0]


def _config(args: argparse.Namespace) -> Any:
    """The protocol config the units come from; an invalid option value is a usage error.
    The synthetic regime is ignored with ``--trace`` (its windows are the units)."""
    from diloco_gym.eval.report import ReportConfig

    try:
        return ReportConfig(
            regimes=[args.regime],
            agents=[args.agent],
            seeds=max(args.seeds, 2),
            seed0=args.seed0,
            learner_calibration=args.learner_calibration,
            **options.replay_options(args),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _units(args: argparse.Namespace, config: Any) -> tuple[list[Any], str]:
    """The same units as the report: seeds of a regime at the chosen load, or the trace's
    tiled windows (one episode per window; ``--seeds`` is then unused), and their label. A
    trace too short for a window is the data's fault."""
    try:
        if args.trace:
            return _trace_units(args, config)
        return _regime_units(args, config)
    except ValueError as exc:
        msg = str(exc)
        if args.trace and args.trace not in msg:
            msg = f"{args.trace}: {msg}"
        raise DataError(msg) from None


def _trace_units(args: argparse.Namespace, config: Any) -> tuple[list[Any], str]:
    """``run --trace FILE``: one unit per replayed window."""
    from diloco_gym.eval.units import trace_units

    units, _ = trace_units(config, REGIMES[config.trace_sidecar].sidecar)
    label = (
        f"{units[0].env.regime_name} ({len(units)} disjoint window"
        f"{'' if len(units) == 1 else 's'} of {args.window_s:g} s)"
        if not config.overlapping
        else f"{units[0].env.regime_name} ({len(units)} overlapping windows of "
        f"{args.window_s:g} s: not independent)"
    )
    return units, label


def _regime_units(args: argparse.Namespace, config: Any) -> tuple[list[Any], str]:
    """``run --regime NAME``: the first ``--seeds`` units of the regime."""
    from diloco_gym.eval.units import synthetic_units

    units, _ = synthetic_units(config, args.regime, None)
    return units[: args.seeds], args.regime


def _print_episodes(agent: Any, label: str, units: list[Any]) -> None:
    """Run one episode per unit, streamed, and print its row, then the total row."""
    from diloco_gym.eval.rollout import is_deployable, run_episode

    print(
        f"agent {agent.name}{'' if is_deployable(agent) else ' (non-deployable)'} on "
        f"{label}, {count(len(units), 'episode')}"
    )
    header = (
        f"{'seed':>5} {'merges/h':>8} {'sync-excess %':>13} {'p95 ms':>8} "
        f"{'violated':>8} {'excess req':>10}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for unit in units:
        seed = unit.seed
        r = run_episode(unit.env, agent, seed)
        assert unit.env.episode is not None  # run_episode() reset it
        r["merges_per_hour"] = r["merges"] * 3600.0 / unit.env.episode.trace.duration_s
        unit.env.episode = None  # streamed: only one window's episode is held at a time
        rows.append(r)
        print(
            f"{seed:>5} {r['merges_per_hour']:>8.1f} {r['sync_excess_pct']:>13.2f} "
            f"{r['p95_ms']:>8.0f} {r['violated']:>8} {r['sync_excess_requests']:>10}"
        )
    print("-" * len(header))
    print(
        f"{'total':>5} {np.mean([r['merges_per_hour'] for r in rows]):>8.1f} "
        f"{np.mean([r['sync_excess_pct'] for r in rows]):>13.2f} "
        f"{np.mean([r['p95_ms'] for r in rows]):>8.0f} {sum(r['violated'] for r in rows):>8} "
        f"{sum(r['sync_excess_requests'] for r in rows):>10}"
    )
    print(
        "(total row: merges/h, sync-excess % and p95 are means over episodes; violated and "
        "excess requests are sums)"
    )


def _run_fleet(args: argparse.Namespace) -> int:
    """``run --fleet FILE``: one agent on fleet episodes, per-seed table with each site's
    sync-excess (:mod:`diloco_gym.envs.fleet`)."""
    from diloco_gym.agents.fleet import fleet_agent

    if args.trace:
        raise UsageError("--fleet replaces --trace (the sites are in FILE)")
    checks.check_no_fleet_options(args)
    checks.check_run_agent(args.agent, args.fleet)
    env = _fleet_env(args)
    from diloco_gym.agents.fleet_rounds import (
        check_per_site,
        check_site_rules,
        rounds_agent,
        split_rule,
    )

    try:
        check_site_rules([args.agent], env.fleet.per_site_timing)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if env.fleet.per_site_timing:  # the agent opens the rounds, a site rule times each site
        base, rule = split_rule(args.agent)
        agent = rounds_agent(fleet_agent(checks.load_agent(base)), rule)
    else:
        loaded = checks.load_agent(args.agent)
        try:
            check_per_site([loaded], False)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        agent = fleet_agent(loaded)
    _print_fleet_episodes(args, _sealed(args, agent), env)
    return 0


def _fleet_env(args: argparse.Namespace) -> Any:
    """The fleet env of ``--fleet``: a bad file, or one with the precision action, is a data
    error."""
    from diloco_gym.envs.fleet import require_fixed_precision
    from diloco_gym.envs.fleet_rounds import make_fleet_env

    try:
        env = make_fleet_env(fleet=args.fleet)
        require_fixed_precision(env.fleet, "run --fleet")
    except ValueError as exc:  # a FleetConfigError too
        raise fleet_env_error(exc) from None
    return env


def _slowest(env: Any) -> str:
    """``, up to W s on slow links`` with changing links ('' with fixed links)."""
    w = env.setup.links.slowest_window_s()
    return "" if w is None else f", up to {w:.2f} s on slow links"


def _print_fleet_episodes(args: argparse.Namespace, agent: Any, env: Any) -> None:
    """One fleet episode per seed and its row: the fleet's and each site's sync-excess."""
    from diloco_gym.eval.rollout import is_deployable, run_episode

    names = env.setup.site_names
    print(
        f"agent {agent.name}{'' if is_deployable(agent) else ' (non-deployable)'} on fleet "
        f"{args.fleet} ({len(names)} sites, F={env.fleet.fragments}, {env.fleet.bits}-bit, "
        f"sync window {env.setup.plan.window_s:.2f} s{_slowest(env)}), {args.seeds} episodes"
    )
    header = f"{'seed':>5} {'syncs/h':>8} {'sync-excess %':>13} {'worst site %':>12}  " + " ".join(
        f"{n[:10]:>10}" for n in names
    )
    print(header)
    print("-" * len(header))
    for seed in range(args.seed0, args.seed0 + args.seeds):
        r = run_episode(env, agent, seed)
        assert env.episode is not None  # run_episode() reset it
        per_h = r["merges"] * 3600.0 / env.episode.trace.duration_s
        sites = " ".join(f"{x['sync_excess_pct']:>10.2f}" for x in r["sites"])
        print(
            f"{seed:>5} {per_h:>8.1f} {r['sync_excess_pct']:>13.2f} "
            f"{r['worst_site_sync_excess_pct']:>12.2f}  {sites}"
        )
    print("(sync-excess: pp of all the fleet's requests; per site: pp of the site's requests)")
