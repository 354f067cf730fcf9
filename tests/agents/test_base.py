"""The agent contract (agents/base.py): ``predict`` on one observation and on a batch, its
shape check, ``act`` left to subclasses, the deployable default, the frozen
:class:`AgentContext` and its mask copy, and the runner's attach / attach_episode rules."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import diloco_gym
from diloco_gym.agents.base import Agent, AgentContext, obs_feature
from diloco_gym.envs.observation import OBS_DIM, OBS_INDEX
from diloco_gym.envs.params import EnvParams
from diloco_gym.eval.rollout import attach_agent


class _GapAgent(Agent):
    """Merges when the gap feature is at least one half; records what it was given."""

    name = "gap-half"

    def __init__(self) -> None:
        self.seen: list[np.ndarray] = []
        self.contexts: list[AgentContext] = []

    def attach(self, context: AgentContext) -> None:
        self.contexts.append(context)

    def act(self, obs: np.ndarray) -> np.ndarray:
        self.seen.append(obs)
        return (obs_feature(obs, "gap") >= 0.5).astype(np.int32)


def _obs(gap: float) -> np.ndarray:
    o = np.zeros(OBS_DIM, dtype=np.float64)
    o[OBS_INDEX["gap"]] = gap
    return o


def test_predict_on_one_observation_returns_a_scalar_int64_and_the_state():
    agent = _GapAgent()
    state = object()
    action, out_state = agent.predict(_obs(0.7), state=state)
    assert action.shape == () and action.dtype == np.int64 and int(action) == 1
    assert out_state is state
    assert int(agent.predict(_obs(0.2))[0]) == 0
    # act always sees a float32 batch, even for one float64 observation
    assert agent.seen[0].shape == (1, OBS_DIM) and agent.seen[0].dtype == np.float32


def test_predict_on_a_batch_returns_one_int64_action_per_row():
    agent = _GapAgent()
    batch = np.stack([_obs(g) for g in (0.0, 0.5, 0.9, 0.1)])
    actions, state = agent.predict(batch, deterministic=False)
    assert actions.shape == (4,) and actions.dtype == np.int64
    assert actions.tolist() == [0, 1, 1, 0] and state is None
    assert agent.seen[0].shape == (4, OBS_DIM)


def test_predict_accepts_lists():
    actions, _ = _GapAgent().predict([_obs(0.9).tolist(), _obs(0.0).tolist()])
    assert actions.tolist() == [1, 0]


@pytest.mark.parametrize("shape", [(OBS_DIM - 1,), (2, OBS_DIM + 1), (0,)])
def test_predict_refuses_the_wrong_number_of_features(shape):
    with pytest.raises(ValueError, match=rf"gap-half: expected observations with {OBS_DIM} "):
        _GapAgent().predict(np.zeros(shape))


def test_predict_uses_obs_size_when_the_agent_declares_one():
    agent = _GapAgent()
    agent.obs_size = OBS_DIM + 7  # a fleet model's wider observation
    wide = np.zeros((3, OBS_DIM + 7), dtype=np.float32)
    wide[1, OBS_INDEX["gap"]] = 1.0
    assert agent.predict(wide)[0].tolist() == [0, 1, 0]
    with pytest.raises(ValueError, match=f"with {OBS_DIM + 7} features, got shape"):
        agent.predict(np.zeros(OBS_DIM))


def test_act_is_left_to_subclasses_and_the_defaults():
    agent = Agent()
    with pytest.raises(NotImplementedError):
        agent.predict(_obs(0.5))
    assert agent.deployable is True and agent.name == "agent"
    assert agent.attach(AgentContext(EnvParams(), "bursty")) is None
    assert agent.attach_episode(object(), 3) is None
    assert repr(_GapAgent()) == "_GapAgent('gap-half')"


def test_obs_feature_reads_a_column_of_one_or_many():
    batch = np.arange(2 * OBS_DIM, dtype=np.float32).reshape(2, OBS_DIM)
    col = OBS_INDEX["staleness"]
    assert obs_feature(batch, "staleness").tolist() == [col, OBS_DIM + col]
    assert float(obs_feature(batch[1], "gap")) == OBS_DIM
    with pytest.raises(KeyError):
        obs_feature(batch, "no-such-feature")


def test_context_is_frozen_and_its_mask_is_a_copy():
    params = EnvParams()
    ctx = AgentContext(params=params, regime="bursty")
    assert ctx.params is params and ctx.regime == "bursty" and ctx.features is None
    assert ctx.action_mask().tolist() == [True, True]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.regime = "calm"  # type: ignore[misc]
    mask = ctx.action_mask()
    mask[1] = False  # the agent's copy: the context is unchanged
    assert ctx.action_mask().tolist() == [True, True]
    ctx._set_mask(np.array([1, 0]))
    assert ctx.action_mask().dtype == bool and ctx.action_mask().tolist() == [True, False]
    # two contexts never share a mask; the mask is not part of equality or repr
    other = AgentContext(params=params, regime="bursty")
    assert other.action_mask().tolist() == [True, True] and other == ctx
    assert "_mask" not in repr(ctx)


def test_context_holds_only_public_parameters_and_labels():
    names = {f.name for f in dataclasses.fields(AgentContext)}
    assert names == {"params", "regime", "features", "_mask"}


def test_attach_agent_hands_every_agent_the_context_of_the_reset_episode():
    env = diloco_gym.DiLoCoSyncEnv(regime="bursty")
    env.reset(seed=5)
    agent = _GapAgent()
    ctx = attach_agent(env, agent, episode_seed=5)
    assert agent.contexts == [ctx]
    assert ctx.params is env.unwrapped.params and ctx.regime == "bursty"
    assert ctx.features is None  # the single env's layout
    assert ctx.action_mask().tolist() == env.unwrapped.action_masks().astype(bool).tolist()


def test_a_deployable_agent_that_defines_attach_episode_is_refused():
    class Peeking(_GapAgent):
        name = "peeking"

        def attach_episode(self, env, episode_seed):
            raise AssertionError("must not be called")

    env = diloco_gym.DiLoCoSyncEnv(regime="bursty")
    env.reset(seed=1)
    agent = Peeking()
    with pytest.raises(ValueError, match="agent 'peeking' declares deployable = True"):
        attach_agent(env, agent, episode_seed=1)
    assert agent.contexts == []  # refused before attach


def test_only_a_non_deployable_agent_gets_the_unwrapped_env_and_the_seed():
    class Oracle(_GapAgent):
        name = "oracle"
        deployable = False

        def attach_episode(self, env, episode_seed):
            self.episode = (env, episode_seed)

    env = diloco_gym.DiLoCoSyncEnv(regime="bursty")
    env.reset(seed=2)
    oracle = Oracle()
    attach_agent(env, oracle, episode_seed=np.int64(2))
    assert oracle.episode[0] is env.unwrapped and oracle.episode[1] == 2
    assert type(oracle.episode[1]) is int
    assert len(oracle.contexts) == 1  # attach comes first, for every agent
