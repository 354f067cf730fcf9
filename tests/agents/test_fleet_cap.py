"""The cap-aware fleet agent (agents/fleet_cap.py): registered as fleet-only and
deployable, its actions a function of what it is handed (observations, masks, public
context), the same sealed and in process, steered by ``<site>.cap_used``, and refused on a
fleet without the cap."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest
from fleet_agent_helpers import recording, sealed_rows_match_in_process

import diloco_gym
from diloco_gym.agents.base import AgentContext
from diloco_gym.agents.fleet import fleet_agent
from diloco_gym.agents.fleet_cap import CapAwareForecast, cap_columns
from diloco_gym.agents.registry import FLEET_ONLY, HEURISTICS, make_agent
from diloco_gym.envs.fleet import DiLoCoFleetEnv, FleetEpisode
from diloco_gym.envs.observation import OBS_INDEX, squash_rate
from diloco_gym.eval import bench
from diloco_gym.eval.rollout import run_episode
from diloco_gym.sim.fleet import FleetParams, SiteConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "fleet-cap.toml"
SITES = (SiteConfig(name="bursty", regime="bursty"), SiteConfig(name="busy", regime="sync-heavy"))


def _env(cap: float | None = 6.0) -> DiLoCoFleetEnv:
    return DiLoCoFleetEnv(FleetParams(sites=SITES, site_cap_pp=cap))


_Recorder = recording(CapAwareForecast)


def _reachable(root: object) -> list[object]:
    seen, todo, out = set(), [root], []
    while todo:
        o = todo.pop()
        if id(o) in seen or isinstance(o, type):
            continue
        seen.add(id(o))
        out.append(o)
        todo.extend(gc.get_referents(o))
    return out


def test_registered_as_fleet_only_and_deployable():
    agent = make_agent("cap-aware-forecast")
    assert isinstance(agent, CapAwareForecast) and agent.deployable
    assert "cap-aware-forecast" in FLEET_ONLY and "cap-aware-forecast" not in HEURISTICS
    assert fleet_agent(agent) is agent  # reads the fleet observation itself: no view
    assert bench.entrant_kinds("cap-aware-forecast") == set()  # the bench fleet has no cap


def test_it_respects_the_corridor_and_is_deterministic():
    """On the capped fleet (the checks tests/agents/test_heuristics.py makes of the
    single-host agents): a feasible schedule, and the same episode twice is the same run."""
    from diloco_gym.sim import schedules

    env = _env()
    a = run_episode(env, make_agent("cap-aware-forecast"), 5)
    p = env.params
    assert schedules.is_feasible(a["merge_decisions"], env.episode.n_decisions, p.h_min, p.h_max)
    assert a == run_episode(_env(), make_agent("cap-aware-forecast"), 5)


def test_its_actions_are_a_function_of_what_it_is_handed():
    """Replaying the observations and masks of two capped episodes into a fresh agent,
    attached to a context built without any env, gives the same actions; after the
    episodes the agent reaches no env and no episode."""
    env = _env()
    features = env.obs_features
    names = tuple(f[0] for f in features)
    for seed in (0, 1):
        rec = _Recorder()
        res = run_episode(env, rec, seed)
        assert res["merges"] >= 8 and any(a == 1 for *_, a in rec.seen)
        assert not any(isinstance(o, (DiLoCoFleetEnv, FleetEpisode)) for o in _reachable(rec))
        fresh = CapAwareForecast()
        ctx = AgentContext(params=env.params, regime="fleet", features=names)
        fresh.attach(ctx)
        for obs, mask, action in rec.seen:
            ctx._set_mask(mask)
            assert int(fresh.act(obs)[0]) == action


@pytest.mark.parametrize("skip_forced", [True, False])
def test_it_reads_the_episode_length(skip_forced):
    """Asked first at decision 16 (forced decisions skipped) or at decision 0 (where the
    episode's length cannot be read yet), it finds the episode's decisions."""
    env = DiLoCoFleetEnv(FleetParams(sites=SITES, site_cap_pp=6.0), skip_forced=skip_forced)
    agent = CapAwareForecast()
    run_episode(env, agent, 3)
    assert agent.episode_decisions == env.episode.n_decisions


def _obs(names: tuple[str, ...], d: int, gap: int, syncs: int, used: tuple[float, float]):
    """A quiet, late-in-the-corridor fleet observation at decision ``d`` of 519."""
    n, h_max, h_min = 519, 64, 16
    o = np.zeros(len(names), dtype=np.float32)
    o[OBS_INDEX["gap"]] = gap / h_max
    o[OBS_INDEX["time_left"]] = (n - d) / n
    o[OBS_INDEX["merges"]] = syncs * h_min / n
    o[OBS_INDEX["loss_progress_mean"]] = o[OBS_INDEX["tokens_mean"]] = 1.0
    for site in ("bursty", "busy"):
        ix = {k: names.index(f"{site}.{k}") for k in ("rate_now", "rate_forecast")}
        o[names.index(f"{site}.rate_baseline")] = squash_rate(6.0, 8.0)
        o[ix["rate_now"]] = o[ix["rate_forecast"]] = squash_rate(1.0, 8.0)
    o[list(cap_columns(names))] = used
    return o[None]


@pytest.mark.parametrize("busy_used", [0.0, 0.6])
def test_it_reads_cap_used(busy_used):
    """The same history and the same quiet, late decision: with 0.1 of the busy site's
    cap per sync and 3 syncs reserved after decision 300, a launch needs 0.4 of its cap
    left. The agent launches with 0.9 left and defers with 0.3 left (the mask allows both)."""
    env = _env()
    names = tuple(f[0] for f in env.obs_features)
    agent = CapAwareForecast()
    agent.attach(AgentContext(params=env.params, regime="fleet", features=names))
    agent.act(_obs(names, 16, 16, 0, (0.0, busy_used)))  # the first decision: n = 519
    agent.act(_obs(names, 250, 10, 1, (0.05, busy_used + 0.1)))  # a sync's cost settles
    got = int(agent.act(_obs(names, 300, 60, 1, (0.05, busy_used + 0.1)))[0])
    assert got == (1 if busy_used == 0.0 else 0)


def test_refused_without_a_cap():
    for env in (_env(None), diloco_gym.DiLoCoSyncEnv(regime="bursty")):
        with pytest.raises(ValueError) as exc:
            run_episode(env, make_agent("cap-aware-forecast"), 0)
        msg = str(exc.value)
        assert "\n" not in msg and "site_cap_pp" in msg and "cap_used" in msg


@pytest.mark.slow
def test_sealed_and_in_process_give_the_same_rows():
    """Sealed in its worker process (the report's default) the agent decides as in process.
    Sealed agents cannot start from a git worktree (Landlock): run from a plain checkout."""
    inproc = sealed_rows_match_in_process(str(EXAMPLE), "cap-aware-forecast")
    assert (inproc["rows"]["syncs"] >= 8).all()
