"""Validation of a training run: the periodic held-out evaluation (model selection), the
comparison ``train`` prints at the end, and the validation curve (``validation.csv``,
``validation.png``).

The validation seeds are ``VALIDATION_SEED0 + i = 900_000 + i``: held out from training
(episode seeds from ``10**6`` on) and distinct from the report's and the frontier's test
seeds (they refuse seeds from ``VALIDATION_SEED0`` on; :mod:`diloco_gym.eval.seed_ranges`),
so choosing the best checkpoint does not peek at a test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from diloco_gym.envs.env import DiLoCoSyncEnv
from diloco_gym.eval.rollout import run_episode
from diloco_gym.eval.seed_ranges import TRAIN_SEED_LOW
from diloco_gym.rl.algos import SELECT_BY
from diloco_gym.rl.run_dir import read_meta

__all__ = [
    "HeldOutEvalCallback",
    "eval_envs",
    "is_fleet",
    "validation_comparison",
    "format_comparison",
    "format_budget_validation",
    "validation_curve_rows",
    "write_validation_curve",
]

#: Episode seeds below this are held out from training.
HELD_OUT_SEED_HIGH = TRAIN_SEED_LOW


class HeldOutEvalCallback(BaseCallback):
    """Deterministic evaluation on fixed held-out validation seeds.

    Every ``eval_freq`` callback calls (vector steps), plays one deterministic episode per
    seed and evaluation env with :func:`diloco_gym.eval.rollout.run_episode`, records
    ``eval/sync_excess_pct`` (exact replay, mean over every env and seed), ``eval/merges``,
    ``eval/mean_reward`` and ``eval/vs_random_pp``, and saves ``best_path`` when the
    selection value (``select_by``, :data:`~diloco_gym.rl.algos.SELECT_BY`) is the lowest
    so far: by default the mean over the envs of the agent's sync-excess minus matched
    random at its own number of merges (``vs_random_pp``), which does not reward merging
    less; ``sync_excess`` selects by the mean sync-excess alone.

    With several evaluation envs (one per regime and budget of a budget-conditioned run)
    each history row also holds, per env label, the agent's sync-excess and, fixed once at
    the first evaluation, the matched-random mean and the oracle at that budget (by the
    report's exact scoring, ``draws`` random schedules per episode), so the validation curve
    shows the gap captured as training goes. Selecting by ``vs_random`` computes them for
    every run (recomputed only when the agent's merge counts change).

    Args:
        env: the evaluation env (not wrapped: it is reset with explicit held-out seeds), or
            a dict ``{label: env}``.
        seeds: episode seeds, all ``< HELD_OUT_SEED_HIGH``.
        eval_freq: evaluate every this many callback calls; ``0``: only on request.
        best_path: where to save the best model (``None``: do not save).
        verbose: print each evaluation when ``> 0``.
        obs_transform: the observation transform the policy was trained with
            (:mod:`diloco_gym.rl.wrappers`).
        draws: matched-random draws per episode for the per-env reference curves.
        select_by: how ``best_path`` is chosen (:data:`~diloco_gym.rl.algos.SELECT_BY`).

    Raises:
        ValueError: if a seed is not in the held-out range.
    """

    def __init__(
        self,
        env: DiLoCoSyncEnv | dict[str, DiLoCoSyncEnv],
        seeds: list[int],
        eval_freq: int,
        best_path: Path | None,
        verbose: int = 0,
        obs_transform: str | None = None,
        draws: int = 200,
        select_by: str = "vs_random",
    ) -> None:
        super().__init__(verbose)
        if select_by not in SELECT_BY:
            raise ValueError(f"select_by must be one of {SELECT_BY}, got {select_by!r}")
        self.select_by = select_by
        bad = [s for s in seeds if not 0 <= s < HELD_OUT_SEED_HIGH]
        if bad:
            raise ValueError(
                f"evaluation seeds must be held out (< {HELD_OUT_SEED_HIGH}); got {bad[:5]}"
            )
        self.eval_envs = (
            dict(env) if isinstance(env, dict) else {str(getattr(env, "regime_name", "env")): env}
        )
        self.eval_env = next(iter(self.eval_envs.values()))
        self.seeds = list(seeds)
        self.eval_freq = int(eval_freq)
        self.best_path = best_path
        self.best_sync_excess = float("inf")  # of the selected checkpoint
        #: the selected checkpoint's selection value and timesteps (``None``: none yet)
        self.best: dict[str, Any] | None = None
        self.history: list[dict[str, Any]] = []
        self.obs_transform = obs_transform
        self.draws = int(draws)
        #: per env label: (matched-random mean, oracle) over the seeds, set at the first
        #: evaluation of a multi-env callback.
        self.references: dict[str, dict[str, Any]] = {}

    def _on_step(self) -> bool:
        if self.eval_freq > 0 and self.n_calls % self.eval_freq == 0:
            self.evaluate()
        return True

    def _reference(self, label: str, env: Any, rows: list[dict]) -> dict[str, float]:
        """Matched random and the oracle at the agent's number of merges (on a rounds fleet:
        its rounds and their sites) on this env's seeds, by the report's scoring; computed
        again only when what they match changes (a budget run's are fixed once)."""
        if is_fleet(env) and env.fleet.per_site_timing:
            key = tuple(tuple(map(tuple, r["round_sites"])) for r in rows)
        else:
            key = tuple(len(r["merge_decisions"]) for r in rows)
        cached = self.references.get(label)
        if cached is not None and cached.get("key") == key:
            return cached
        mr, orc = [], []
        for seed, r in zip(self.seeds, rows, strict=True):
            sc = self._score(env, seed, r)
            mr.append(sc["matched_random_mean"])
            orc.append(sc["oracle_same_budget_pct"])
        self.references[label] = {
            "key": key,
            "matched_random_pct": float(np.mean(mr)),
            "oracle_pct": float(np.mean(orc)),
        }
        return self.references[label]

    def _rounds_agent_pct(self, env: Any, rows: list[dict]) -> float:
        """A rounds agent's mean exact sync-excess on the seeds (the rounds scorer: each
        site replayed at its own decisions), every evaluation anew."""
        from diloco_gym.eval.fleet_rounds import agent_exact_pct

        out = []
        for seed, r in zip(self.seeds, rows, strict=True):
            env.reset(seed=seed)
            out.append(agent_exact_pct(env, env.episode, r))
        return float(np.mean(out))

    def _score(self, env: Any, seed: int, r: dict) -> dict[str, Any]:
        """One validation episode's agent, matched random and oracle, scored as the report
        scores them (a fleet's report, with its site cap or its rounds, on a fleet)."""
        from diloco_gym.eval import protocol

        env.reset(seed=seed)
        ep = env.episode
        assert ep is not None
        sched = r["merge_decisions"]
        counts = protocol.counts_for(ep.n_decisions, env.params, max(len(sched), 1))
        if is_fleet(env) and env.fleet.per_site_timing:  # as the report seeds a rounds run
            from diloco_gym.eval import fleet_rounds
            from diloco_gym.eval.fleet_cap import cap_check

            rng = np.random.default_rng([seed, len(r["round_sites"]), 7])
            return fleet_rounds.score_rounds_episode(
                env, ep, r, self.draws, rng, counts, cap_check(env)
            )
        rng = np.random.default_rng([seed, len(sched), 7])
        if not is_fleet(env):
            scorer = protocol.EpisodeScorer(ep, env.params, env.sidecar)
            return protocol.score_episode(scorer, sched, self.draws, rng, counts)
        from diloco_gym.eval import fleet, fleet_cap

        scorer = fleet.FleetScorer(ep, env.params, env.setup.sidecars)
        sc, _ = fleet.score_schedule(
            env, scorer, sched, self.draws, rng, counts, fleet_cap.cap_check(env)
        )
        return sc

    def evaluate(self) -> dict[str, Any]:
        """Run the validation episodes now; returns the mean metrics."""
        from diloco_gym.agents.learned import LearnedAgent

        # the observation's length before the transform: a fleet's is wider than 17
        base = int(np.prod(self.eval_env.observation_space.shape or (17,)))
        agent = LearnedAgent(
            self.model,
            name="eval",
            meta={"observation": {"transform": self.obs_transform, "base_size": base}},
        )
        res: list[dict[str, Any]] = []
        per_env: dict[str, dict[str, float | None]] = {}
        vs_random: list[float] = []  # per env: sync-excess minus matched random
        for label, env in self.eval_envs.items():
            rows = [run_episode(env, agent, s) for s in self.seeds]
            res += rows
            if (
                self.select_by == "vs_random"
                or len(self.eval_envs) > 1
                or env.params.merge_budget is not None
                or is_fleet(env)
            ):
                ref = self._reference(label, env, rows)
                # a rounds agent by the rounds scorer (each site replayed at its own decisions)
                any_env: Any = env
                rounds = is_fleet(env) and any_env.fleet.per_site_timing
                mean = (
                    self._rounds_agent_pct(env, rows)
                    if rounds
                    else float(np.mean([r["sync_excess_pct"] for r in rows]))
                )
                span = ref["matched_random_pct"] - ref["oracle_pct"]
                vs_random.append(mean - ref["matched_random_pct"])
                per_env[label] = {
                    "sync_excess_pct": mean,
                    "matched_random_pct": ref["matched_random_pct"],
                    "oracle_pct": ref["oracle_pct"],
                    "gap_captured": (ref["matched_random_pct"] - mean) / span if span > 0 else None,
                }
        row: dict[str, Any] = {
            "timesteps": int(self.model.num_timesteps),
            "sync_excess_pct": float(np.mean([r["sync_excess_pct"] for r in res])),
            "merges": float(np.mean([r["merges"] for r in res])),
            "mean_reward": float(np.mean([r["return"] for r in res])),
        }
        if per_env:
            row["per_env"] = per_env
            row["vs_random_pp"] = float(np.mean(vs_random))
        self.history.append(row)
        if getattr(self.model, "_logger", None) is not None:  # set once learn() started
            for k in ("sync_excess_pct", "merges", "mean_reward", "vs_random_pp"):
                if k in row:
                    self.logger.record(f"eval/{k}", row[k])
        value = row["vs_random_pp" if self.select_by == "vs_random" else "sync_excess_pct"]
        if self.best is None or value < self.best["value"]:
            self.best = {"select_by": self.select_by, "value": value, "timesteps": row["timesteps"]}
            self.best_sync_excess = row["sync_excess_pct"]
            if self.best_path is not None:
                self.model.save(self.best_path)
        if self.verbose:
            print(
                f"eval @ {row['timesteps']}: sync-excess {row['sync_excess_pct']:.3f} %"
                + (f" ({row['vs_random_pp']:+.3f} pp vs matched random)" if per_env else "")
                + f", {row['merges']:.1f} merges, return {row['mean_reward']:.3f}"
            )
        return row


def is_fleet(env: Any) -> bool:
    """Whether ``env`` (unwrapped) is a fleet env (``DiLoCoFleet-v1``)."""
    from diloco_gym.envs.fleet import DiLoCoFleetEnv

    return isinstance(env, DiLoCoFleetEnv)


def eval_envs(
    specs: list[Any] | None, regime: str, env_kwargs: dict[str, Any]
) -> DiLoCoSyncEnv | dict[str, DiLoCoSyncEnv]:
    """The validation env(s): one per env kind, labelled ``regime@M`` with a budget."""
    if specs is None:
        return DiLoCoSyncEnv(regime=regime, **env_kwargs)
    envs: dict[str, DiLoCoSyncEnv] = {}
    for spec in specs:
        label = spec.label if spec.merge_budget is None else f"{spec.label}@{spec.merge_budget}"
        envs[label] = spec.make(env_kwargs)
    return envs


class _ActionCounter:
    """Wraps an agent and counts the merges it *chooses* (action 1); the env adds the
    merges forced at the H_max limit on its own."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.name = agent.name
        self.chosen = 0

    def predict(self, obs, **kwargs):
        action, state = self.agent.predict(obs, **kwargs)
        self.chosen += int(int(np.asarray(action).reshape(-1)[0]) == 1)
        return action, state


def validation_comparison(
    model: str | Path | Any,
    regime: str,
    seeds: list[int],
    env_kwargs: dict[str, Any] | None = None,
    draws: int = 200,
) -> dict[str, Any]:
    """The trained agent next to fixed-512 and its matched random on validation seeds.

    Matched random is scored as in ``diloco-gym report``: per episode, the mean
    sync-excess of ``draws`` schedules drawn uniformly among those with the agent's own
    number of merges.

    Args:
        model: a trained model file, or an agent (``predict`` / ``name``).
        regime: the validation regime.
        seeds: validation episode seeds.
        env_kwargs: extra ``DiLoCoSyncEnv`` keyword arguments.
        draws: matched-random draws per episode.

    Returns:
        ``{"seeds", "agent", "fixed-512", "matched random"}`` (each with mean
        ``sync_excess_pct`` and ``merges_per_hour``), ``"chosen_merges"`` (merges the
        policy chose, over all episodes, the rest being forced) and
        ``"same_schedules_as_fixed_512"`` (episodes whose merges equal fixed-512's).
    """
    from diloco_gym.agents.learned import load_learned_agent
    from diloco_gym.agents.registry import make_agent
    from diloco_gym.eval import protocol

    env = DiLoCoSyncEnv(regime=regime, **(env_kwargs or {}))
    agent = _ActionCounter(load_learned_agent(model) if isinstance(model, (str, Path)) else model)
    fixed = make_agent("fixed-512")
    rows: dict[str, list[tuple[float, float]]] = {
        "agent": [],
        "fixed-512": [],
        "matched random": [],
    }
    same = 0
    for seed in seeds:
        res = run_episode(env, agent, seed)
        ep = env.episode
        assert ep is not None  # run_episode() reset env
        per_hour = 3600.0 / ep.trace.duration_s
        m = int(res["merges"])
        counts = protocol.counts_for(ep.n_decisions, env.params, max(m, 40))
        mr = protocol.envelope(
            ep,
            m,
            draws,
            np.random.default_rng([seed, m, 7]),
            env.params,
            env.sidecar,
            counts=counts,
        )
        rows["agent"].append((res["sync_excess_pct"], m * per_hour))
        rows["matched random"].append((float(mr.mean()), m * per_hour))
        ref = run_episode(env, fixed, seed)
        rows["fixed-512"].append((ref["sync_excess_pct"], ref["merges"] * per_hour))
        same += int(list(res["merge_decisions"]) == list(ref["merge_decisions"]))
    out: dict[str, Any] = {"seeds": [int(s) for s in seeds], "agent_name": agent.name}
    for key, vals in rows.items():
        arr = np.array(vals, dtype=float)
        out[key] = {
            "sync_excess_pct": float(arr[:, 0].mean()),
            "merges_per_hour": float(arr[:, 1].mean()),
        }
    out["chosen_merges"] = agent.chosen
    out["same_schedules_as_fixed_512"] = same
    return out


def format_comparison(cmp: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The lines ``train`` prints for :func:`validation_comparison`: (table, warnings)."""
    seeds = cmp["seeds"]
    lines = [
        f"validation episodes (seeds {seeds[0]}..{seeds[-1]}, deterministic policy), means:",
        f"  {'':<28} {'sync-excess %':>13} {'merges/h':>9}",
    ]
    for key, label in (
        ("agent", cmp["agent_name"]),
        ("fixed-512", "fixed-512"),
        ("matched random", "matched random (same merges)"),
    ):
        r = cmp[key]
        lines.append(f"  {label:<28} {r['sync_excess_pct']:>13.3f} {r['merges_per_hour']:>9.1f}")
    warnings = []
    n = len(seeds)
    if cmp["chosen_merges"] == 0:
        warnings.append(
            f"warning: the policy never chose to merge in the {n} validation episodes: every "
            f"merge it made was forced at the H_max limit, so it schedules like fixed-512 "
            f"({cmp['same_schedules_as_fixed_512']} of {n} episodes identical). Training "
            f"longer rarely gets a policy off this plateau; the reward and hyperparameters "
            f"that learn it from scratch are in docs/training.md, 'A default task that PPO "
            f"learns' (e.g. --config agents/reference/ppo-v2/config.toml)."
        )
    elif cmp["same_schedules_as_fixed_512"] == n:
        warnings.append(
            f"warning: the policy's merges equal fixed-512's in all {n} "
            f"validation episodes; see docs/training.md, 'A default task that PPO learns'."
        )
    return lines, warnings


def validation_curve_rows(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The validation curve of a run from its evaluation history: one row per evaluation
    and env kind (``env = "all"``: the mean over every env and seed)."""
    rows: list[dict[str, Any]] = []
    for ev in meta.get("evaluations") or []:
        rows.append(
            {
                "timesteps": ev["timesteps"],
                "env": "all",
                "sync_excess_pct": ev["sync_excess_pct"],
                "matched_random_pct": None,
                "oracle_pct": None,
                "gap_captured": None,
                "merges": ev["merges"],
            }
        )
        for label, r in (ev.get("per_env") or {}).items():
            rows.append(
                {
                    "timesteps": ev["timesteps"],
                    "env": label,
                    "sync_excess_pct": r["sync_excess_pct"],
                    "matched_random_pct": r["matched_random_pct"],
                    "oracle_pct": r["oracle_pct"],
                    "gap_captured": r["gap_captured"],
                    "merges": None,
                }
            )
    return rows


def write_validation_curve(run_dir: str | Path) -> tuple[Path, Path] | None:
    """Write ``validation.csv`` and ``validation.png`` of a run from its ``meta.json``
    (the evaluation callback's history); ``None`` when the run has no evaluations.

    The figure shows the mean validation sync-excess against timesteps and, for a
    budget-conditioned run, the gap captured per regime and budget (0: matched random,
    1: the oracle at that budget).
    """
    import csv

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    run_dir = Path(run_dir)
    meta = read_meta(run_dir / "meta.json")
    rows = validation_curve_rows(meta)
    if not rows:
        return None
    csv_path = run_dir / "validation.csv"
    with csv_path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    envs = [e for e in dict.fromkeys(r["env"] for r in rows) if e != "all"]
    fig = Figure(figsize=(10 if envs else 5.5, 4))
    ax = fig.add_subplot(1, 2 if envs else 1, 1)
    allr = [r for r in rows if r["env"] == "all"]
    ax.plot([r["timesteps"] for r in allr], [r["sync_excess_pct"] for r in allr], marker="o")
    ax.set_xlabel("timesteps")
    ax.set_ylabel("validation sync-excess % (mean)")
    ax.set_title(f"{meta.get('algo')} on {meta.get('regime')}, seed {meta.get('seed')}")
    ax.grid(alpha=0.3)
    if len(allr) == 1:  # one evaluation: a dot, not a curve; say so on the figure
        ax.text(
            0.5,
            0.92,
            f"one evaluation only (at {allr[0]['timesteps']} timesteps): no curve; "
            "lower eval_freq or train longer",
            transform=ax.transAxes,
            ha="center",
            fontsize=8,
        )
    if envs:
        ax2 = fig.add_subplot(1, 2, 2)
        for e in envs:
            er = [r for r in rows if r["env"] == e and r["gap_captured"] is not None]
            ax2.plot([r["timesteps"] for r in er], [r["gap_captured"] for r in er], label=e)
        ax2.axhline(0.0, color="grey", lw=0.8)
        ax2.set_xlabel("timesteps")
        ax2.set_ylabel("gap captured (0 random, 1 oracle)")
        ax2.set_title("per regime @ merges per episode")
        ax2.legend(fontsize=7, ncol=2)
        ax2.grid(alpha=0.3)
    fig.tight_layout()
    png_path = run_dir / "validation.png"
    FigureCanvasAgg(fig).print_png(str(png_path))
    return csv_path, png_path


def format_budget_validation(meta: dict[str, Any]) -> list[str]:
    """The lines ``train`` prints after a multi-env run: the final validation per env kind
    (regime@merges per episode) with matched random, the oracle and the gap captured."""
    final = meta.get("final_validation") or {}
    per_env = final.get("per_env") or {}
    if not per_env:
        return ["(no validation: --eval-episodes 0)"]
    v0, v1 = meta["seed_ranges"]["validation_seeds"]
    lines = [
        f"validation (seeds {v0}..{v1 - 1}, deterministic policy), means per env:",
        f"  {'env':<24} {'agent %':>8} {'matched random %':>17} {'oracle %':>9} {'gap':>6}",
    ]
    for label, r in per_env.items():
        gap = "n/a" if r["gap_captured"] is None else f"{r['gap_captured']:.2f}"
        lines.append(
            f"  {label:<24} {r['sync_excess_pct']:>8.3f} {r['matched_random_pct']:>17.3f} "
            f"{r['oracle_pct']:>9.3f} {gap:>6}"
        )
    return lines
