"""``INFO_KEYS``: every key of a step's info is listed, and the ones marked causal see only
the past (checked on two traces equal up to a cut, in both reward modes)."""

from __future__ import annotations

import numpy as np
import pytest

from diloco_gym import REGIMES, DiLoCoSyncEnv, EnvParams, Trace
from diloco_gym.envs.info import INFO_KEYS

#: bursty at 1.41x its load: bursts near capacity, merges' backlogs spill into the next.
HIGH = REGIMES["bursty"].with_load(rate_scale=1.41)


def _fork(trace: Trace, other: Trace, t_cut: float) -> Trace:
    """``trace``'s requests before ``t_cut``, then ``other``'s."""
    keep, late = trace.arrival_s < t_cut, other.arrival_s >= t_cut
    cat = lambda a, b: np.concatenate([a[keep], b[late]])  # noqa: E731
    return Trace(
        cat(trace.arrival_s, other.arrival_s),
        cat(trace.prompt_tokens, other.prompt_tokens),
        cat(trace.output_tokens, other.output_tokens),
        trace.duration_s,
        network=trace.network,
        checkpoint=trace.checkpoint,
        name=trace.name,
    )


@pytest.mark.parametrize("mode", ["exact", "additive"])
def test_every_info_key_is_documented_and_the_causal_ones_see_only_the_past(mode, rollout):
    """Every info key is in ``INFO_KEYS``; those marked causal agree on two traces equal up
    to a cut at every step whose decision is at or before it. In exact mode
    ``excess_requests_so_far`` is causal (it once carried the additive cost, with its cost
    window's look-ahead, which differed before the cut)."""
    params = EnvParams(reward_rate_rps=8.0, reward_mode=mode, skip_forced=False)
    sidecar = REGIMES["bursty"].sidecar
    base = HIGH(np.random.default_rng(0))
    seen_differ = 0
    for cut_decision in (100, 180, 250, 330, 420):
        t_cut = cut_decision * params.decision_seconds
        forked = _fork(base, HIGH(np.random.default_rng(1)), t_cut)
        env_a = DiLoCoSyncEnv(regime=base, params=params, sidecar=sidecar)
        env_b = DiLoCoSyncEnv(regime=forked, params=params, sidecar=sidecar)
        ra = rollout(env_a, "always-merge", seed=0, policy_seed=4)
        rb = rollout(env_b, "always-merge", seed=0, policy_seed=4)
        causal = [k for k, (c, _) in INFO_KEYS.items() if c == "yes"]
        if mode == "exact":
            causal.append("excess_requests_so_far")
        for ia, ib in zip(ra.infos, rb.infos, strict=True):
            assert set(ia) <= set(INFO_KEYS), sorted(set(ia) - set(INFO_KEYS))
            if ia["decision"] * params.decision_seconds > t_cut:
                break
            for k in causal:
                if k in ia:
                    np.testing.assert_array_equal(ia[k], ib[k], err_msg=f"{k} at {ia['decision']}")
            seen_differ += ia["excess_requests_so_far"] != ib["excess_requests_so_far"]
    if mode == "additive":  # the check has teeth: the documented look-ahead shows here
        assert seen_differ > 0
    else:
        assert seen_differ == 0
