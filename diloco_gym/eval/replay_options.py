"""The options the report and the frontier share: what is replayed (synthetic regimes or a
trace's windows), at which load, on which seeds, with how many draws, and how agents run
and tests are corrected; checked once, by :class:`ReplayOptions`.

:class:`~diloco_gym.eval.report.ReportConfig` and
:class:`~diloco_gym.eval.frontier.FrontierConfig` build on it, so the same value is
accepted or refused, with the same message, by both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from diloco_gym.eval import protocol
from diloco_gym.sim.regimes import REGIMES

__all__ = ["ReplayOptions"]


@dataclass(frozen=True, kw_only=True)
class ReplayOptions:
    """What a protocol run replays and how (shared by the report and the frontier).

    Attributes:
        regimes: synthetic regime names, each once (with ``trace``: not used).
        seeds: episodes per synthetic regime (seeds ``seed0 .. seed0 + seeds - 1``, at
            least 2 for the paired tests); with ``trace`` the episodes are the trace's
            windows instead and ``seeds`` is unused.
        seed0: first episode seed (with ``trace``: window ``i`` uses seed ``seed0 + i`` for
            the pressure series added to it); test seeds stay below the validation seeds
            (:mod:`diloco_gym.eval.seed_ranges`).
        draws: matched-random draws per episode (K).
        alpha: significance level of the tests.
        calibration: calibration file (``None``: the shipped reference measurements); a
            live file's fitted sidecar drives the regimes it measured.
        trace / trace_format: replay a trace file instead of the synthetic regimes.
        window_s: length of each replayed window of ``trace`` (one episode each).
        sidecar: with ``trace``: the regime whose sidecar (and calibration) the replay uses
            (default sync-heavy); ``calibration`` replaces it with the file's fitted sidecar
            when the file measured that regime.
        rate_scale: multiply the offered load: a synthetic regime's request rates, or a
            trace replayed this many times faster (every request kept).
        target_utilization: instead of ``rate_scale``: the mean offered work over the
            sidecar's capacity to replay at (see :mod:`diloco_gym.sim.regimes`).
        in_process_agents: run deployable agents in the evaluating process (the opt-out
            ``--in-process-agents``); by default they run sealed in a worker process
            (:mod:`diloco_gym.eval.sealed`).
        holm_across_settings: one Holm family over every setting of the run
            (``--holm-across-settings``) instead of one per setting.
        learner_calibration: learner calibration file: the units' envs use its learner
            model (the learner observations and progress reward an agent sees), and each
            schedule's model-quality price is added (predicted loss, and its excess over
            fixed H with as many merges and over the episode's matched-random control:
            :mod:`diloco_gym.eval.quality_vs_random`). The serving side, and so every
            sync-excess score, does not depend on it.

    Raises:
        ValueError: on construction, for a bad value; the message names the field.
    """

    regimes: list[str] = field(default_factory=lambda: list(REGIMES))
    seeds: int = 20
    seed0: int = 0
    draws: int = 1000
    alpha: float = protocol.ALPHA
    calibration: str | None = None
    trace: str | None = None
    trace_format: str = "auto"
    window_s: float = 600.0
    sidecar: str | None = None
    rate_scale: float | None = None
    target_utilization: float | None = None
    in_process_agents: bool = False
    holm_across_settings: bool = False
    learner_calibration: str | None = None

    def __post_init__(self) -> None:
        if self.learner_calibration is not None:
            from diloco_gym.sim.learner_calibration import load_learner_calibration

            load_learner_calibration(self.learner_calibration)  # a bad file fails here
        self._check_counts()
        self._check_load()
        if self.trace is None:
            self._check_regimes()
        else:
            self._check_trace()

    @property
    def trace_sidecar(self) -> str:
        """The regime whose sidecar a trace replay uses (default sync-heavy)."""
        return self.sidecar or "sync-heavy"

    def _check_counts(self) -> None:
        """Seeds, draws and the significance level."""
        if self.seeds < 2:
            raise ValueError(f"seeds must be >= 2 for a paired test, got {self.seeds}")
        from diloco_gym.eval.seed_ranges import check_test_seeds

        check_test_seeds(
            self.seed0, self.seeds if self.trace is None else 1, "test seeds (--seed0, --seeds)"
        )
        if self.draws < 1:
            raise ValueError(f"draws must be >= 1, got {self.draws}")
        from diloco_gym.sim.limits import check_limit

        check_limit("DRAWS", self.draws, "draws (--draws)")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")

    def _check_load(self) -> None:
        """The load (one of rate_scale and target_utilization) and the window length."""
        if self.rate_scale is not None and self.target_utilization is not None:
            raise ValueError(
                "give rate_scale (--rate-scale) or target_utilization "
                "(--target-utilization), not both"
            )
        for name in ("rate_scale", "target_utilization"):
            v = getattr(self, name)
            if v is not None and not (np.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a positive number, got {v}")
        if not (np.isfinite(self.window_s) and self.window_s > 0):
            raise ValueError(f"window_s must be a positive number of seconds, got {self.window_s}")

    def _check_regimes(self) -> None:
        """Synthetic regimes: known, each once; no trace-only option."""
        if not self.regimes:
            raise ValueError("regimes: give at least one regime")
        unknown = [r for r in self.regimes if r not in REGIMES]
        if unknown:
            raise ValueError(f"unknown regime(s) {unknown}; valid regimes: {', '.join(REGIMES)}")
        if len(set(self.regimes)) != len(self.regimes):
            raise ValueError(f"regimes: each regime once, got {self.regimes}")
        if self.sidecar is not None:
            raise ValueError(
                "sidecar (--sidecar) chooses the sidecar of a --trace "
                "replay; synthetic regimes use their own (or --calibration)"
            )

    def _check_trace(self) -> None:
        """A trace replay: a known sidecar regime, a window long enough for an episode."""
        from diloco_gym.envs.episode import min_episode_seconds
        from diloco_gym.envs.params import EnvParams
        from diloco_gym.sim.loaders import FORMATS

        if self.trace_format != "auto" and self.trace_format not in FORMATS:
            raise ValueError(
                f"trace_format (--format) {self.trace_format!r} is not a trace format; "
                f"give auto or one of {', '.join(FORMATS)}"
            )
        if self.sidecar is not None and self.sidecar not in REGIMES:
            raise ValueError(
                f"unknown sidecar regime {self.sidecar!r}; valid regimes: {', '.join(REGIMES)}"
            )
        min_s = min_episode_seconds(EnvParams(), REGIMES[self.trace_sidecar].sidecar)
        if self.window_s < min_s:
            raise ValueError(
                f"window_s (--window-s) {self.window_s:g} s is too short: an "
                f"episode needs at least {min_s:.1f} s"
            )
