"""The protocol on a fleet (``DiLoCoFleet-v1``): the same scoring, control, oracle,
statistics and gate as the single-host report (:mod:`diloco_gym.eval.protocol`), over
fleet episodes. The report's :func:`~diloco_gym.eval.report.run_protocol` runs it as it
runs a single host's (give it a :class:`FleetReportConfig`); this module has what is the
fleet's own: its cells (:func:`fleet_cells`, :func:`fleet_cell`: the calibration and one
per episode), its scorer, its rows and its summary (:func:`fleet_result`).

* **Scoring**: a schedule's exact sync-excess on a fleet is the sum over sites of its
  exact extra SLO violations (each site's :class:`~diloco_gym.eval.protocol.EpisodeScorer`,
  the single-host exact replay), in percentage points of all the fleet's requests
  (:class:`FleetScorer`). The same scorer serves agent, control and oracle.
* **Matched random**: schedules drawn uniformly among all feasible schedules with exactly
  the agent's number of fragment syncs under the fleet corridor (the exact 1-D sampler,
  :func:`~diloco_gym.sim.schedules.sample_uniform`, through
  :func:`~diloco_gym.eval.protocol.score_episode`).
* **Oracle**: the dynamic programme over the summed additive cost at the agent's number of
  syncs, replayed exactly (:func:`~diloco_gym.eval.protocol.oracle_score`); where merges
  interact it is the best exact schedule found, bracketed below by the sites' certified
  bounds weighted by their requests (``oracle_lower_bound_pct``; a one-site fleet's is the
  single host's).
* **Cap**: with ``site_cap_pp`` set, matched random respects the same per-site cap
  (rejection-sampled) and the oracle is the uncapped bound (:mod:`diloco_gym.eval.fleet_cap`).
* **Gate**: per agent, the paired sign-flip test of agent minus matched-random mean over
  episodes (independent units: distinct seeds of synthetic sites; disjoint windows of
  trace sites), Holm-corrected over the agents, and
  :func:`~diloco_gym.eval.protocol.gate_verdict` with the fleet's calibration verdict (every
  site's regime must transfer: :func:`fleet_calibration`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from diloco_gym.envs.fleet import DiLoCoFleetEnv, FleetEpisode, require_fixed_precision
from diloco_gym.eval import fleet_cap, fleet_rounds, protocol
from diloco_gym.eval.fleet_render import (
    FLEET_LOWER_LOAD,
    SYNC_NAMES,
    FleetFiles,
    fleet_figure_summary,
    fleet_summary_table,
    oracle_label,
    oracle_note,
    write_fleet_dir,
    write_fleet_report,
)
from diloco_gym.eval.protocol import Scores
from diloco_gym.eval.report_render import sandbox_record
from diloco_gym.eval.scorer import site_scorers

__all__ = [
    "FleetScorer",
    "score_schedule",
    "episode_rows",
    "report_agents",
    "fleet_cells",
    "fleet_cell",
    "fleet_cell_config",
    "fleet_result",
    "agent_names",
    "verdict_seeds_of",
    "fleet_summary",
    "report_summary",
    "SYNC_NAMES",
    "FLEET_SETTING",
    "FleetReportConfig",
    "fleet_calibration",
    "run_fleet_report",
    "write_fleet_report",
    "write_fleet_dir",
    "FleetFiles",
    "fleet_figure_summary",
    "fleet_summary_table",
    "oracle_label",
    "oracle_note",
    "FLEET_LOWER_LOAD",
]


class FleetScorer:
    """Exact sync-excess of many schedules on one fleet episode: the sum over sites of
    each site's exact replay (:class:`~diloco_gym.eval.scorer.EpisodeScorer`; with changing
    links :class:`~diloco_gym.eval.scorer.MixedScorer`), in pp of the fleet's requests.

    Exposes what :func:`~diloco_gym.eval.protocol.score_episode` reads from a scorer:
    ``episode`` (``n_decisions``), ``params``, ``sidecar``, ``cost`` (the fleet's additive
    cost per decision, the oracle's), ``pct`` (pp per request), ``episode_proven``,
    ``iso_excess`` (the sum of the sites' exact isolated
    excess, requests) and :meth:`score`.
    """

    def __init__(self, episode: FleetEpisode, params, sidecars) -> None:
        self.episode = episode
        self.params = params
        self.sidecar = sidecars[0]
        self.sites = site_scorers(episode, params, sidecars)
        self.n_requests = np.array([e.n_requests for e in episode.sites], dtype=np.float64)
        self.total = float(max(1.0, self.n_requests.sum()))
        self.cost = np.asarray(episode.merge_cost, dtype=np.float64)
        self.pct = episode.pct_per_request  # pp of the fleet's requests per request
        iso = np.zeros(episode.n_decisions)
        for s in self.sites:
            iso += s.iso_excess
        self.iso_excess = iso if len(self.sites) > 1 else self.sites[0].iso_excess
        self.episode_proven = all(s.episode_proven for s in self.sites) and bool(
            np.array_equal(self.iso_excess, self.cost)
        )

    def site_scores(self, schedules: np.ndarray, around: np.ndarray | None = None) -> list[Scores]:
        return [s.score(schedules, around=around) for s in self.sites]

    def score(self, schedules: np.ndarray, around: np.ndarray | None = None) -> Scores:
        """As :meth:`~diloco_gym.eval.scorer.EpisodeScorer.score` (``around``: the rows'
        shared incumbent), each site's scores weighted by its requests."""
        per = self.site_scores(schedules, around)
        if len(per) == 1:
            return per[0]
        exact = np.zeros(len(per[0].exact_pct))
        additive = np.zeros_like(exact)
        replayed = np.zeros(exact.shape, dtype=bool)
        for sc, n in zip(per, self.n_requests, strict=True):
            exact += sc.exact_pct * n / self.total
            additive += sc.additive_pct * n / self.total
            replayed |= sc.replayed
        return Scores(exact, additive, replayed)


@dataclass
class FleetReportConfig:
    """A fleet report: the fleet (TOML path), agents, episodes, draws, calibration."""

    fleet: str
    agents: list[str]
    seeds: int = 20
    seed0: int = 0
    draws: int = 1000
    calibration: str | None = None
    alpha: float = protocol.ALPHA
    env: dict[str, Any] = field(default_factory=dict)
    #: run deployable agents in this process (``--in-process-agents``); default: sealed,
    #: in a worker process apart from the env (:mod:`diloco_gym.eval.sealed`).
    in_process_agents: bool = False

    def __post_init__(self) -> None:
        if self.seeds < 2:
            raise ValueError(f"seeds must be >= 2 for the paired test, got {self.seeds}")
        if self.draws < 1:
            raise ValueError(f"draws must be >= 1, got {self.draws}")
        from diloco_gym.sim.limits import check_limit

        check_limit("DRAWS", self.draws, "draws (--draws)")
        if not self.agents:
            raise ValueError("a fleet report needs at least one agent")


_VERDICT_ORDER = ("uncalibrated", "uncertain", "no measurable SLO effect")


def fleet_calibration(env: DiLoCoFleetEnv, calibration: str | None) -> tuple[str, list[dict]]:
    """The fleet's calibration verdict and one row per site.

    Each site is judged as the single-host report judges its regime: the simulator's effect
    sizes under the site's sidecar and the fleet's sync window
    (:func:`~diloco_gym.eval.calibration.simulated_effect_sizes`) against the calibration
    file's measurements for the site's regime (a trace site: the ``sync-heavy`` entry, as
    for a replayed trace in the single-host report). The fleet is ``calibrated`` only if
    every site is; otherwise the first of ``uncalibrated``, ``uncertain``, ``no measurable
    SLO effect`` that some site has.
    """
    from diloco_gym.eval import calibration as cal

    calib = cal.load_calibration(calibration)
    p = env.params
    rows = []
    cache: dict[tuple, dict] = {}
    for site, sc in zip(env.fleet.sites, env.setup.sidecars, strict=True):
        regime = site.regime if site.trace is None and site.regime else "sync-heavy"
        key = (regime, sc, p.merge_seconds)
        if key not in cache:
            cache[key] = cal.simulated_effect_sizes(regime, sidecar=sc, params=p)
        sim = cache[key]
        measured = calib.measured(regime)
        verdict = cal.transfer_verdict(sim, measured, interval=cal.measured_intervals(measured))
        rows.append(
            {
                "site": site.name,
                "measured_on": calib.measured_on(regime),
                **{f"real_{k}": measured.get(k) for k in cal.METRICS},
                **{f"sim_{k}": sim.get(k) for k in cal.METRICS},
                "verdict": verdict,
            }
        )
    verdicts = [r["verdict"] for r in rows]
    fleet_v = "calibrated"
    for v in _VERDICT_ORDER:
        if v in verdicts:
            fleet_v = v
            break
    return fleet_v, rows


def protocol_env(config: FleetReportConfig, what: str) -> DiLoCoFleetEnv:
    """The fleet env of ``config`` for a protocol step ``what``: refused (an error naming
    ``what``) when the fleet has the per-sync precision action."""
    from diloco_gym.envs.fleet_rounds import make_fleet_env

    env = make_fleet_env(fleet=config.fleet, **config.env)
    require_fixed_precision(env.fleet, what)
    return env


def run_fleet_report(
    config: FleetReportConfig,
    progress: bool = False,
    backend: str = "serial",
    jobs: int | None = None,
    ray_address: str | None = None,
) -> dict[str, Any]:
    """Deprecated: :func:`diloco_gym.eval.report.run_protocol` runs a fleet report (give it
    this ``config``) and returns the same result. Kept for one release, after a
    ``FutureWarning``; it runs the report's own steps."""
    import time
    import warnings

    from diloco_gym.eval.cells import run_report_cells

    warnings.warn(
        "diloco_gym.eval.fleet.run_fleet_report is deprecated and will be removed in the "
        "next release; call diloco_gym.eval.report.run_protocol(config), which runs a "
        "fleet report for a FleetReportConfig",
        FutureWarning,
        stacklevel=2,
    )
    started = time.perf_counter()
    agent_names(config)  # the checks before any cell runs
    backend_kw = {"backend": backend, "jobs": jobs, "ray_address": ray_address}
    result = fleet_result(
        config, run_report_cells(fleet_cell, fleet_cells(config), progress, **backend_kw)
    )
    result["elapsed_s"] = time.perf_counter() - started
    return result


def fleet_cells(config: FleetReportConfig) -> list[Any]:
    """A fleet report's cells (:class:`~diloco_gym.eval.cells.ReportCell` of setting
    :data:`FLEET_SETTING`, as the single host's regimes): the fleet's calibration
    (unit ``None``) and one per episode (unit ``k``: seed ``seed0 + k``, every agent on
    it), their configuration's paths absolute for workers in another directory."""
    from diloco_gym.eval.cells import ReportCell

    shipped = fleet_cell_config(config)
    return [ReportCell(shipped, FLEET_SETTING, None)] + [
        ReportCell(shipped, FLEET_SETTING, k) for k in range(config.seeds)
    ]


def fleet_cell_config(config: FleetReportConfig, base: Any = None) -> FleetReportConfig:
    """``config`` as a worker in another directory reads it: the fleet and calibration
    files and the agents' model or code files absolute (relative ones taken relative to
    ``base``, default the current directory); an agent's ``+own`` site rule kept."""
    from pathlib import Path

    from diloco_gym.agents.fleet_rounds import OWN_SUFFIX, split_rule
    from diloco_gym.agents.registry import shipped_spec

    def absolute(p: str | None) -> str | None:
        if p is None or p in ("reference", "none"):
            return p
        q = Path(str(p)).expanduser()
        return str((q if base is None or q.is_absolute() else Path(base) / q).resolve())

    def agent(spec: str) -> str:
        name, rule = split_rule(spec)
        return shipped_spec(name, base) + (OWN_SUFFIX if rule == "own-forecast" else "")

    return replace(
        config,
        fleet=str(absolute(config.fleet)),
        calibration=absolute(config.calibration),
        agents=[agent(a) for a in config.agents],
    )


def fleet_cell(cell: Any) -> dict[str, Any]:
    """One cell of a fleet report (a :class:`~diloco_gym.eval.cells.ReportCell` of
    :func:`fleet_cells`): unit ``k``, the episode of seed ``seed0 + k`` scored for every
    agent (``{"rows"}``, :func:`episode_rows`); unit ``None``, the fleet's calibration
    (``{"verdict", "rows"}``, :func:`fleet_calibration`). A worker builds the report's env
    and agents once per configuration (the single-host cells' per-process cache,
    :func:`~diloco_gym.eval.cells.cached`; deployable agents sealed in the worker unless
    the report runs them in process)."""
    from diloco_gym.eval.cells import cached

    config = cell.config
    env = cached("fleet-env", config, None, lambda: protocol_env(config, "the fleet report"))
    if cell.unit is None:
        verdict, rows = fleet_calibration(env, config.calibration)
        return {"verdict": verdict, "rows": rows}
    agents = cached("fleet-agents", config, None, lambda: report_agents(config))
    return {"rows": episode_rows(env, agents, config.seed0 + cell.unit, config.draws)}


def fleet_result(config: FleetReportConfig, done: list[dict[str, Any]]) -> dict[str, Any]:
    """A fleet report's result from its cells' results ``done`` (in the order of
    :func:`fleet_cells`): the rows, in seed order and agent order within an episode; the
    fleet's calibration; the independent units (:func:`verdict_seeds_of`) and the
    per-agent summary with the gate's verdicts (:func:`report_summary`).

    Returns:
        ``{"rows", "summary", "calibration", "calibration_verdict", "fleet",
        "independent_units", "verdict_seeds", "config", "agent_sealing", "agent_sandbox"}``.
    """
    import pandas as pd

    from diloco_gym.eval.sealed import IN_PROCESS, SEALED

    env = protocol_env(config, "the fleet report")
    seeds = [config.seed0 + i for i in range(config.seeds)]
    n_decisions = env.build_episode(config.seed0).n_decisions
    verdict_seeds = verdict_seeds_of(seeds, env.setup.unit_period(n_decisions))
    calibration, episodes = done[0], done[1:]
    df = pd.DataFrame([row for part in episodes for row in part["rows"]])
    names = [row["agent"] for row in episodes[0]["rows"]]  # the agents, in order
    verdict = calibration["verdict"]
    summary = report_summary(env, df, names, verdict_seeds, verdict, config.alpha)
    return {
        "agent_sealing": SEALED if not config.in_process_agents else IN_PROCESS,
        "agent_sandbox": sandbox_record(config.in_process_agents),
        "rows": df,
        "summary": summary,
        "calibration": pd.DataFrame(calibration["rows"]),
        "calibration_verdict": verdict,
        "independent_units": len(verdict_seeds),
        "verdict_seeds": sorted(verdict_seeds),
        "fleet": _fleet_record(config, env, n_decisions),
        "config": {
            "agents": list(config.agents),
            "seeds": config.seeds,
            "seed0": config.seed0,
            "draws": config.draws,
            "alpha": config.alpha,
            "env": dict(config.env),
        },
    }


def agent_names(config: FleetReportConfig) -> list[str]:
    """The names of ``config``'s agents, in order, after the checks a fleet report makes
    before any cell runs: the fleet (:func:`protocol_env`: a bad file or value, or the
    per-sync precision action, is an error), then the agents as the report builds them (an
    unknown agent or a site rule the fleet cannot take is a ``ValueError``). The agents
    are built in this process and not sealed (no worker is started)."""
    protocol_env(config, "the fleet report")
    return [a.name for a in report_agents(replace(config, in_process_agents=True))]


def report_agents(config: FleetReportConfig) -> list[Any]:
    """``config``'s agents as fleet agents, sealed in a worker process unless
    ``config.in_process_agents`` (:func:`~diloco_gym.eval.sealed.seal_agents`)."""
    from diloco_gym.agents.fleet import fleet_agent
    from diloco_gym.agents.fleet_rounds import (
        check_per_site,
        check_site_rules,
        rounds_agent,
        split_rule,
    )
    from diloco_gym.agents.registry import make_agents
    from diloco_gym.envs.fleet_rounds import fleet_timing
    from diloco_gym.eval.sealed import seal_agents

    rounds = fleet_timing(config.fleet, config.env.get("timing")) == "rounds"
    check_site_rules(list(config.agents), rounds)
    if rounds:
        pairs = [split_rule(a) for a in config.agents]
        # X and X+own are two agents of one registry name: made one by one
        agents = [rounds_agent(fleet_agent(make_agents([nm])[0]), rule) for nm, rule in pairs]
    else:
        made = make_agents(list(config.agents))
        check_per_site(made, rounds)
        agents = [fleet_agent(a) for a in made]
    return seal_agents(agents, in_process=config.in_process_agents)


def verdict_seeds_of(seeds: list[int], independent_episodes: int | None) -> set[int]:
    """The seeds that are independent units and carry the test and the verdict: every seed
    of synthetic sites with fixed or simulated links (``independent_episodes`` is None);
    with trace sites or link traces, seed ``k`` replays tile ``k mod independent_episodes``
    (:meth:`~diloco_gym.envs.fleet.FleetSetup.unit_period`), so only the first seed of each
    tile (a repeated tile is the same data again)."""
    if independent_episodes is None:
        return set(seeds)
    first: dict[int, int] = {}
    for s in seeds:
        first.setdefault(s % independent_episodes, s)
    return set(first.values())


def episode_rows(
    env: DiLoCoFleetEnv, agents: list[Any], seed: int, draws: int
) -> list[dict[str, Any]]:
    """One episode's rows, one per agent: the agent's run on the episode, scored with
    ``draws`` matched-random schedules and the oracle (:func:`protocol.score_episode` on
    the episode's :class:`FleetScorer`; the completion table of
    :func:`~diloco_gym.eval.protocol.counts_for`, cached per process)."""
    from diloco_gym.eval.rollout import run_episode

    p = env.params
    rows: list[dict[str, Any]] = []
    check = fleet_cap.cap_check(env)
    ep = env.build_episode(seed)
    rounds = env.fleet.per_site_timing
    scorer: Any = (fleet_rounds.RoundsScorer if rounds else FleetScorer)(ep, p, env.setup.sidecars)
    for agent in agents:
        res = run_episode(env, agent, seed, episode=ep)
        m = int(res["merges"])
        table = protocol.counts_for(ep.n_decisions, p, max(m, 80))
        rng = np.random.default_rng([seed, m, 7])
        if rounds:  # per-site schedules (eval/fleet_rounds.py)
            scored = fleet_rounds.score_rounds_episode(
                env, ep, res, draws, rng, table, check, scorer
            )
            accepted = scored.pop("matched_random_cap_acceptance", None)
            cap_cols = {} if check is None else fleet_cap.cap_columns(res, accepted)
            row = _unit_row(env, ep, agent.name, seed, res, scored)
            rows.append({**row, **fleet_rounds.rounds_columns(res), **cap_cols})
            continue
        scored, accepted = score_schedule(
            env, scorer, res["merge_decisions"], draws, rng, table, check
        )
        cap_cols = {} if check is None else fleet_cap.cap_columns(res, accepted)
        rows.append({**_unit_row(env, ep, agent.name, seed, res, scored), **cap_cols})
    return rows


def score_schedule(
    env: DiLoCoFleetEnv,
    scorer: FleetScorer,
    schedule: Any,
    draws: int,
    rng: np.random.Generator,
    counts: Any,
    check: Any = None,
) -> tuple[dict[str, Any], Any]:
    """A one-instant schedule's scores on the episode of ``scorer``, as the report scores
    an agent: exact sync-excess, ``draws`` matched-random schedules (under the fleet's site
    cap when ``check``, :func:`~diloco_gym.eval.fleet_cap.cap_check`, is given) and the
    oracle at the same number of syncs. Returns :func:`protocol.score_episode`'s dict and
    the capped control's acceptance record (``None`` without a cap)."""
    control, accepted = None, None
    if check is not None:  # matched random under the same cap
        m = len(schedule)
        control, accepted = fleet_cap.capped_control(scorer, m, draws, rng, counts, check)
    scored = protocol.score_episode(
        scorer,  # type: ignore[arg-type]  # duck-typed: the fleet's summed scorer
        schedule,
        draws,
        rng,
        counts,
        control,
    )
    return scored, accepted


def _unit_row(
    env: DiLoCoFleetEnv,
    ep: FleetEpisode,
    agent: str,
    seed: int,
    res: dict[str, Any],
    scored: dict[str, Any],
) -> dict[str, Any]:
    """The results.csv row of ``agent``'s run ``res`` on episode ``ep`` and its scores."""
    m = int(res["merges"])
    dur_h = ep.trace.duration_s / 3600.0
    return {
        "agent": agent,
        "deployable": res["deployable"],
        "seed": seed,
        "syncs": m,
        "syncs_per_hour": m / dur_h,
        "duration_s": ep.trace.duration_s,
        "bytes_per_hour": m * env.setup.plan.payload_bytes / dur_h,
        **scored,
        "worst_site": res["worst_site"],
        "worst_site_sync_excess_pct": res["worst_site_sync_excess_pct"],
        "no_sync_violation_pct": res["no_sync_violation_pct"],
        "requests": res["requests"],
        "excess_requests": res["sync_excess_requests"],
        "progress": res["progress"],
        "return": res["return"],
        **{f"site_{s['site']}_sync_excess_pct": s["sync_excess_pct"] for s in res["sites"]},
    }


#: The rows' columns a fleet names after its syncs, under the single host's names
#: (:func:`fleet_summary` reads the rows under these names).
_SINGLE_HOST_NAMES = {"syncs": "merges", "syncs_per_hour": "merges_per_hour"}
#: The label of a fleet report's one setting in the single-host summary (its Holm family).
FLEET_SETTING = "fleet"


def fleet_summary(
    df: Any,
    names: list[str],
    verdict_seeds: set[int],
    calibration_verdict: str,
    alpha: float,
) -> Any:
    """The per-agent summary of a fleet report's rows ``df``, by the single host's
    statistics (:func:`~diloco_gym.eval.summary.summarise`, the fleet as one setting): the
    means, the paired sign-flip test of agent minus matched random and every summary
    number over the episodes that are independent units (``verdict_seeds``), Holm over the
    report's agents, the gate's verdict with the fleet's calibration verdict, the gap
    captured and the units a conclusive test would need. Then the fleet's own means over
    the same episodes: the worst site's sync-excess, the learners' progress and, on a
    rounds fleet, the rounds' columns. One row per agent of ``names``, in that order; the
    columns the single host names after merges are named after syncs."""
    import pandas as pd

    from diloco_gym.eval.summary import summarise

    n_indep = len(verdict_seeds)
    rows = df.rename(columns=_SINGLE_HOST_NAMES).assign(
        regime=FLEET_SETTING,
        p95_ms=np.nan,  # a fleet's rows have no single latency distribution
        unit="seed",
        independent=True,
        independent_units=n_indep,
        verdict_unit=df["seed"].isin(verdict_seeds),
    )
    summary = summarise(rows, {FLEET_SETTING: calibration_verdict}, alpha)
    summary = summary.set_index("agent").loc[names].reset_index()
    extra = []
    for name in names:
        sub = df[(df["agent"] == name) & df["seed"].isin(verdict_seeds)]
        extra.append(
            {
                "worst_site_sync_excess_pct": float(sub["worst_site_sync_excess_pct"].mean()),
                "progress": float(sub["progress"].mean()),
                **fleet_rounds.rounds_summary(sub),  # rounds fleets: drops, token share
            }
        )
    summary = pd.concat([summary, pd.DataFrame(extra)], axis=1)
    return summary.drop(columns=["regime", "p95_ms"]).rename(columns=SYNC_NAMES)


def report_summary(
    env: DiLoCoFleetEnv,
    df: Any,
    names: list[str],
    verdict_seeds: set[int],
    calibration_verdict: str,
    alpha: float,
) -> Any:
    """A fleet report's per-agent summary of its rows ``df``: :func:`fleet_summary`, then
    each site's mean sync-excess and, with a site cap, the cap's counters
    (:func:`~diloco_gym.eval.fleet_cap.cap_summary`), over the independent episodes
    ``verdict_seeds``. The fleet report and a fleet sweep's points both summarise so."""
    import pandas as pd

    summary = fleet_summary(df, names, verdict_seeds, calibration_verdict, alpha)
    capped = env.fleet.site_cap_pp is not None
    sites = env.setup.site_names
    units = df[df["seed"].isin(verdict_seeds)]  # the summary's episodes
    per_site = [fleet_cap.cap_summary(units[units["agent"] == n], sites, capped) for n in names]
    return pd.concat([summary, pd.DataFrame(per_site)], axis=1)


def _fleet_record(config: FleetReportConfig, env: DiLoCoFleetEnv, n: int) -> dict[str, Any]:
    """The report's description of the fleet (episodes of ``n`` decisions): file, sites,
    payload, window, corridor."""
    fl = env.fleet
    p = env.params
    return {
        "file": str(config.fleet),
        "sites": env.setup.site_names,
        "fragments": fl.fragments,
        "bits": fl.bits,
        "mode": fl.mode,
        "sync_window_s": env.setup.plan.window_s,
        "payload_bytes": env.setup.plan.payload_bytes,
        "link_share": env.setup.plan.link_share,
        "corridor_decisions": [p.h_min, p.h_max],
        "progress_factor": env.setup.progress_factor,
        "worst_site_weight": fl.worst_site_weight,
        "site_cap_pp": fl.site_cap_pp,
        "traffic_correlation": fl.traffic_correlation,
        "traffic_common": fl.traffic_common,
        "link_levels": None if fl.link_levels is None else list(fl.link_levels),
        "link_probs": None if env.setup.links.probs is None else env.setup.links.probs.tolist(),
        "link_dwell_s": (60.0 if fl.link_dwell_s is None else fl.link_dwell_s)
        if fl.link_levels is not None
        else None,
        "sync_window_slowest_s": env.setup.links.slowest_window_s(),
        "link_traces": {st.name: st.link_trace for st in fl.sites if st.link_trace is not None}
        or None,
        "link_trace_tiles": env.setup.links.trace_tiles(n) if env.setup.links.traced else None,
        **fleet_rounds.rounds_record(env),
    }


def with_env(config: FleetReportConfig, **env: Any) -> FleetReportConfig:
    """``config`` with more ``EnvParams`` keywords (a merge budget, say)."""
    return replace(config, env={**config.env, **env})
