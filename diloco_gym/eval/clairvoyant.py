"""The rate-clairvoyant reference: the best a scheduler can do that knows the regime's rate
function (when the bursts are) but not the arrivals.

The oracle knows the episode's every request, so its gap to matched random includes what no
deployable scheduler can reach: the arrivals' own noise. The rate-clairvoyant schedule knows
exactly what a synthetic regime fixes before the arrivals are drawn, the episode's burst
timing, and nothing after it. For episode ``seed`` it

1. redraws the episode ``draws`` times with the same rate function and independent
   arrivals, prompt and output lengths and pressure series (:class:`SameRate`: the burst
   timing from ``np.random.default_rng(seed)``, as the episode draws it, the rest from an
   independent generator);
2. averages the additive merge cost of every decision over those draws, in percentage points
   of each draw's requests (:func:`expected_cost_pp`): the merge cost expected under the rate
   function, estimated;
3. takes the exact dynamic programme's optimum of that expected cost at the budget
   (:func:`~diloco_gym.sim.schedules.optimal_schedule`, the oracle's DP), and the protocol
   scores that schedule on the real episode by the same exact replay as every other
   schedule.

What it bounds, and how loosely: an observation-only agent sees the past arrivals, which a
rate-clairvoyant schedule does not use, and the expectation is estimated from ``draws``
samples; so it is a reference for what knowing the load's shape is worth, not a proven
bound on every agent. A replayed trace has no rate function apart from its arrivals: the
reference is not defined there (NaN).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from diloco_gym.envs.episode import episode_from_seed
from diloco_gym.sim.regimes import SyntheticRegime
from diloco_gym.sim.schedules import optimal_schedule
from diloco_gym.sim.traces import Trace

__all__ = ["DEFAULT_DRAWS", "SameRate", "expected_cost_pp", "rate_clairvoyant_schedule"]

#: Independent arrival draws behind the expected merge cost of one episode.
DEFAULT_DRAWS = 16
#: Tag of the reference draws' seeds (kept apart from every episode seed).
_DRAW_TAG = 0x5A7E


@dataclass(frozen=True)
class SameRate:
    """A regime whose rate function is episode ``rate_seed``'s and whose arrivals (and
    everything drawn after the rate function) come from the generator it is called with."""

    regime: SyntheticRegime
    rate_seed: int

    def __call__(self, rng: np.random.Generator) -> Trace:
        # the burst timing from a generator started as episode_draws starts the episode's
        return self.regime(rng, rate_rng=np.random.default_rng(self.rate_seed))


def draw_seed(seed: int, j: int) -> int:
    """The seed of reference draw ``j`` of episode ``seed`` (independent of both)."""
    return int(np.random.SeedSequence([int(seed), int(j), _DRAW_TAG]).generate_state(1)[0])


def expected_cost_pp(env: Any, seed: int, draws: int = DEFAULT_DRAWS) -> np.ndarray | None:
    """The additive merge cost of every decision of episode ``seed`` of ``env``, expected
    under the episode's rate function: the mean over ``draws`` redraws of its arrivals, in
    percentage points of each redraw's requests. ``None`` when ``env``'s generator is not a
    synthetic regime (no rate function apart from the arrivals)."""
    gen = env.generator
    if not isinstance(gen, SyntheticRegime):
        return None
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    total: np.ndarray | None = None
    for j in range(draws):
        ep = episode_from_seed(
            SameRate(gen, int(seed)),
            draw_seed(seed, j),
            env.params,
            env.sidecar,
            env.learner_params,
            rate_rps=env.reward_rate_rps,
        )
        cost = np.asarray(ep.merge_cost, dtype=np.float64) * ep.pct_per_request
        total = cost if total is None else total + cost
    assert total is not None
    return total / draws


def rate_clairvoyant_schedule(
    expected_pp: np.ndarray, h_min: int, h_max: int, merges: int
) -> np.ndarray:
    """The schedule of exactly ``merges`` merges with the least expected cost (the exact DP
    on :func:`expected_cost_pp`), decisions ascending."""
    sched, _ = optimal_schedule(expected_pp, h_min, h_max, merges)
    return np.asarray(sched, dtype=np.int64)
