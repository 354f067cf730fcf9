"""``diloco_gym.rl.callbacks.MatchedRandomCallback``: a tiny PPO run's logger receives each
write's mean score against matched random over the episodes finished since the last one."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

from stable_baselines3 import PPO  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback, CallbackList  # noqa: E402
from stable_baselines3.common.logger import KVWriter, Logger  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv  # noqa: E402

from diloco_gym import DiLoCoSyncEnv  # noqa: E402
from diloco_gym.rl.callbacks import LOGGED_FIELDS, MatchedRandomCallback  # noqa: E402
from diloco_gym.wrappers import SCORE_KEY, MatchedRandomScore  # noqa: E402


class _Capture(KVWriter):
    """Keeps every write of the logger."""

    def __init__(self) -> None:
        self.writes: list[dict] = []

    def write(self, key_values, key_excluded, step=0) -> None:
        self.writes.append(dict(key_values))


class _Episodes(BaseCallback):
    """The scores of every finished episode, in order, grouped by the logger's writes."""

    def __init__(self, capture: _Capture) -> None:
        super().__init__()
        self.capture = capture
        self.groups: list[list[dict]] = [[]]
        self._writes = 0

    def _on_step(self) -> bool:
        if len(self.capture.writes) != self._writes:  # a write happened since the last step
            self._writes = len(self.capture.writes)
            self.groups.append([])
        self.groups[-1] += [i[SCORE_KEY] for i in self.locals["infos"] if SCORE_KEY in i]
        return True


@pytest.mark.slow
def test_a_tiny_ppo_run_logs_the_mean_score_since_the_last_write():
    env = DummyVecEnv(
        [lambda s=s: MatchedRandomScore(DiLoCoSyncEnv("bursty"), draws=10) for s in range(2)]
    )
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=32, n_epochs=1, seed=0, device="cpu")
    capture = _Capture()
    model.set_logger(Logger(folder=None, output_formats=[capture]))
    callback = MatchedRandomCallback()
    seen = _Episodes(capture)
    model.learn(total_timesteps=320, callback=CallbackList([seen, callback]))

    logged = [w for w in capture.writes if "matched_random/episodes" in w]
    assert logged, capture.writes
    for w in logged:
        assert {f"matched_random/{f}" for f in LOGGED_FIELDS} <= set(w)
    # each write's figures are the mean over the episodes that finished since the last
    # write (the groups of episodes the other callback saw between writes)
    groups = [g for g in seen.groups[:-1] if g]  # the last group was never written
    assert len(groups) == len(logged)
    for w, group in zip(logged, groups, strict=True):
        assert w["matched_random/episodes"] == len(group)
        for field in LOGGED_FIELDS:
            assert w[f"matched_random/{field}"] == pytest.approx(
                np.mean([s[field] for s in group]), rel=1e-12
            )
    assert callback.episodes == sum(len(g) for g in seen.groups)
