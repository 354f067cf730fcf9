"""The environment's parameters, :class:`EnvParams`, and their validation.

Time: training advances in steps of ``step_seconds``; the agent decides every
``decision_interval`` steps (one *decision* = ``decision_seconds``). The corridor
``[h_min_steps, h_max_steps]`` is expressed in decisions by dividing by the interval.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property

import numpy as np

from diloco_gym.envs.reward import check_reward_mode, check_reward_shaping
from diloco_gym.sim.limits import check_limit

__all__ = ["EnvParams", "RANGES", "MAX_STEPS"]

#: The range of each number field, ``(low, high, low_inclusive)`` (``high`` included): far
#: beyond any meaningful setting, so that a value such as ``excess_weight = 1e308`` (whose
#: rewards overflow to ``-inf``) or a ``merge_seconds`` whose steps overflow an integer is
#: refused with the field named instead of training or failing somewhere inside.
RANGES: dict[str, tuple[float, float, bool]] = {
    "step_seconds": (1e-6, 3600.0, True),
    "merge_seconds": (0.0, 86_400.0, False),
    "excess_weight": (0.0, 1e6, True),
    "progress_weight": (0.0, 1e6, True),
    "rate_norm_rps": (0.0, 1e9, False),
    "loss_clip": (0.0, 1e6, False),
    "tokens_clip": (0.0, 1e18, False),
    "staleness_clip_s": (0.0, 1e9, False),
    "reward_rate_rps": (0.0, 1e9, False),
    # an EWMA weight below ~1e-16 makes its bias correction 1 - (1 - alpha)^n exactly 0
    "forecast_alpha": (1e-6, 1.0, True),
    "baseline_alpha": (1e-6, 1.0, True),
    "shaping_gamma": (0.0, 1.0, False),
    "shaping_cost": (0.0, 1e9, True),
}
#: The largest step count (``h_min_steps``, ``h_max_steps``, ``decision_interval``): a
#: 32-bit integer, as the compiled kernels hold them.
MAX_STEPS = 2**31 - 1


def _show(v: object) -> str:
    """``repr(v)`` for a message, a huge value (a 400-digit integer) cut short."""
    text = repr(v)
    return text if len(text) <= 40 else f"{text[:24]}... ({len(text)} characters)"


def _finite(v: object) -> bool:
    """Whether ``v`` is a finite number (an integer too large for a float is not)."""
    try:
        return bool(np.isfinite(float(v)))  # type: ignore[arg-type]
    except (OverflowError, TypeError, ValueError):
        return False


#: The fields whose value is one of a few names, and their checks.
_CHOICES = {"reward_mode": check_reward_mode, "reward_shaping": check_reward_shaping}


@dataclass(frozen=True)
class EnvParams:
    """Environment parameters (units in the names; defaults in docs/model.md#clock).

    Attributes:
        step_seconds: wall time of one training (inner) step.
        h_min_steps: a merge may start only when the gap since the last merge is at least
            this many steps (paper: 128).
        h_max_steps: a merge must start when the gap reaches this many steps (paper: 512).
        merge_seconds: how long a merge occupies the host (paper: 8 s); rounded to steps.
        decision_interval: steps between two decisions; must divide both corridor bounds.
        skip_forced: advance through decisions with a single feasible action without
            asking the agent (gap < H_min, gap = H_max, budget-forced).
        merge_budget: if set, every episode has exactly this many merges; the action mask
            keeps the schedule feasible.
        excess_weight: weight of the sync-excess term (reward unit: extra SLO-violating
            requests per :data:`~diloco_gym.envs.reward.REWARD_NOMINAL_REQUESTS` nominal
            requests of the regime, a scale fixed before the episode starts; see
            :func:`~diloco_gym.envs.reward.reward_per_request`).
        progress_weight: weight of the training-progress term (global loss decrease).
        forecast_alpha: EWMA weight of the one-step request-rate forecast, per decision.
        baseline_alpha: EWMA weight of the slow request-rate baseline, per decision.
        rate_norm_rps: scale of the rate features (``r / (r + rate_norm_rps)``).
        loss_clip / tokens_clip / staleness_clip_s: normalisers of the learner features
            (the WA-DiLoCo score's ``clip(x, c)`` constants).
        reward_rate_rps: the nominal request rate of the reward scale; ``None`` (default)
            takes the regime's (:func:`~diloco_gym.envs.reward.nominal_rate_rps`). Set it to
            compare rewards across replays of different traces on one scale.
        reward_mode: ``"additive"`` (default): each merge's isolated cost, credited at
            launch; ``"exact"``: its marginal cost in the exact replay, credited once its
            backlog has drained (:class:`diloco_gym.envs.reward.ExactCredit`).
        reward_shaping: ``"none"`` (default) or ``"merge-debt"``: the potential-based
            shaping of :mod:`diloco_gym.envs.shaping` (``DiLoCoSync-v1``'s and -v2's), added to
            the ``sync_excess`` term and reported as ``reward_terms["shaping"]``.
        shaping_gamma: the discount of the shaping term ``gamma * phi(s') - phi(s)``; set
            it to the agent's discount (Stable-Baselines3's default 0.99).
        shaping_cost: the merge debt's scale ``k`` (reward units); ``None`` (default)
            measures it on the regime's history episodes
            (:func:`~diloco_gym.envs.shaping.reference_merge_cost`).
    """

    step_seconds: float = 0.14
    h_min_steps: int = 128
    h_max_steps: int = 512
    merge_seconds: float = 8.0
    decision_interval: int = 8
    skip_forced: bool = True
    merge_budget: int | None = None
    excess_weight: float = 1.0
    progress_weight: float = 0.0
    forecast_alpha: float = 0.5
    baseline_alpha: float = 0.02
    rate_norm_rps: float = 8.0
    loss_clip: float = 0.05
    tokens_clip: float = 1.0e6
    staleness_clip_s: float = 1800.0
    reward_rate_rps: float | None = None
    reward_mode: str = "additive"
    reward_shaping: str = "none"
    shaping_gamma: float = 0.99
    shaping_cost: float | None = None

    def __post_init__(self) -> None:  # noqa: C901 - one check per parameter, in sequence
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in _CHOICES:  # reward_mode, reward_shaping: one of their names
                _CHOICES[f.name](v)
                continue
            if f.name == "shaping_cost" and v is None:
                continue
            if f.name == "reward_rate_rps":
                if v is not None and (
                    not isinstance(v, (int, float, np.integer, np.floating))
                    or isinstance(v, bool)
                    or not _finite(v)
                    or v <= 0
                ):
                    raise ValueError(
                        f"EnvParams.reward_rate_rps must be None or a finite number > 0, "
                        f"got {_show(v)}"
                    )
                continue
            if f.name == "merge_budget":
                if v is not None and (
                    not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0
                ):
                    raise ValueError(
                        f"EnvParams.merge_budget must be None or an int >= 0, got {_show(v)}"
                    )
                continue
            if f.name == "skip_forced":
                if not isinstance(v, (bool, np.bool_)):
                    raise ValueError(f"EnvParams.skip_forced must be a bool, got {_show(v)}")
                continue
            if f.type in ("int", int):
                if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                    raise ValueError(f"EnvParams.{f.name} must be an int >= 1, got {_show(v)}")
                if v > MAX_STEPS:
                    raise ValueError(
                        f"EnvParams.{f.name} must be at most {MAX_STEPS:,} steps, got {_show(v)}"
                    )
            elif not isinstance(v, (int, float)) or isinstance(v, bool) or not _finite(v):
                raise ValueError(f"EnvParams.{f.name} must be a finite number, got {_show(v)}")
        for name in (
            "step_seconds",
            "merge_seconds",
            "rate_norm_rps",
            "loss_clip",
            "tokens_clip",
            "staleness_clip_s",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"EnvParams.{name} must be > 0, got {_show(getattr(self, name))}")
        for name in ("excess_weight", "progress_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"EnvParams.{name} must be >= 0, got {_show(getattr(self, name))}")
        for name in ("forecast_alpha", "baseline_alpha"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(
                    f"EnvParams.{name} must be in (0, 1], got {_show(getattr(self, name))}"
                )
        self._check_ranges()
        if self.h_min_steps > self.h_max_steps:
            raise ValueError(
                f"EnvParams: h_min_steps ({self.h_min_steps}) must not exceed "
                f"h_max_steps ({self.h_max_steps})"
            )
        for name in ("h_min_steps", "h_max_steps"):
            if getattr(self, name) % self.decision_interval:
                raise ValueError(
                    f"EnvParams.{name} ({getattr(self, name)}) must be a multiple "
                    f"of decision_interval ({self.decision_interval})"
                )
        check_limit("H_MAX_DECISIONS", self.h_max, "EnvParams.h_max_steps / decision_interval")
        if self.merge_budget is not None:
            check_limit("MERGE_BUDGET", self.merge_budget, "EnvParams.merge_budget")
        if self.merge_steps > self.h_min_steps:
            raise ValueError(
                f"EnvParams.merge_seconds: a merge ({self.merge_seconds} s = "
                f"{self.merge_steps} steps) must fit inside h_min_steps "
                f"({self.h_min_steps}) so that merges never overlap"
            )

    def _check_ranges(self) -> None:
        """Each number within its :data:`RANGES` entry."""
        for name, (lo, hi, inclusive) in RANGES.items():
            v = getattr(self, name)
            if v is not None and not ((v >= lo if inclusive else v > lo) and v <= hi):
                raise ValueError(
                    f"EnvParams.{name} must be in {'[' if inclusive else '('}{lo:g}, {hi:g}], "
                    f"got {_show(v)}"
                )

    @cached_property  # derived, never a second default; cached for the hot path
    def decision_seconds(self) -> float:
        return self.step_seconds * self.decision_interval

    @cached_property
    def h_min(self) -> int:
        """H_min in decisions."""
        return self.h_min_steps // self.decision_interval

    @cached_property
    def h_max(self) -> int:
        """H_max in decisions."""
        return self.h_max_steps // self.decision_interval

    @cached_property
    def merge_steps(self) -> int:
        """Merge window in steps (``merge_seconds`` rounded to the step grid, at least 1)."""
        return max(1, int(round(self.merge_seconds / self.step_seconds)))

    def n_decisions(self, duration_s: float) -> int:
        """Decisions in an episode covering ``duration_s`` (the last may run past the end)."""
        return int(np.ceil(duration_s / self.decision_seconds - 1e-9))
