"""The fleet report under a per-site serving cap (``site_cap_pp``,
:mod:`diloco_gym.envs.fleet_cap`).

* **Matched random under the cap**: exact uniform sampling among the corridor's schedules
  with the agent's number of syncs that *also* respect the cap has no closed form (the cap
  depends on each schedule's own costs), so the control is rejection-sampled from the exact
  uniform sampler (:func:`~diloco_gym.sim.schedules.sample_uniform`): a schedule is kept
  when the cap's rule, replayed on it (:func:`~diloco_gym.envs.fleet_cap.schedules_respect_cap`),
  allows every sync the corridor does not force. The kept schedules are uniform among the
  capped feasible ones. At most ``draws x CAP_REJECTIONS`` schedules are drawn per agent
  and episode (``DILOCO_GYM_MAX_CAP_REJECTIONS``, :data:`~diloco_gym.sim.limits.LIMITS`);
  the report stops with an error naming the episode, the syncs, the acceptance and the
  limit that would do, at that bound or as soon as reaching ``draws`` within it has
  become implausible at the acceptance seen (:func:`rejection_hopeless`). The set is
  never empty: the agent's own schedule respects the cap.
* **Oracle**: the uncapped bound (the dynamic programme over the summed cost ignores the
  cap); the report says so in its oracle column's heading and a sentence.
* **Columns**: per agent and episode the cap's counters (``cap_masked_decisions``,
  ``cap_vetoed_launches``, ``cap_overridden_syncs``), each site's cap measure
  (``site_<name>_cap_used_pp``) and the control's acceptance rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from diloco_gym.envs import fleet_cap
from diloco_gym.eval.protocol import Control
from diloco_gym.sim.limits import LimitError, limit, limit_env_var
from diloco_gym.sim.schedules import sample_uniform
from diloco_gym.text import md_text

__all__ = [
    "HOPELESS_TAIL",
    "rejection_hopeless",
    "rejection_error",
    "CapCheck",
    "cap_check",
    "cap_columns",
    "cap_note",
    "cap_summary",
    "capped_control",
    "site_table",
]


@dataclass(frozen=True)
class CapCheck:
    """What the protocol needs to replay a fleet's cap: the cap (pp), per site its cap in
    requests and its settle lag (decisions; with changing links each episode's own,
    :meth:`lags_for`), and the corridor's ``H_max``."""

    cap_pp: float
    caps: np.ndarray
    lags: np.ndarray
    h_max: int

    def lags_for(self, episode: Any) -> np.ndarray:
        """The settle lags that replay the cap on ``episode``: ``lags``, or with changing
        links ``(N, n_decisions)``, each decision's link state's
        (:func:`~diloco_gym.envs.fleet_cap.episode_lags`, as the env records them)."""
        if episode.link_states is None:
            return self.lags
        return fleet_cap.episode_lags(episode)


def cap_check(env: Any) -> CapCheck | None:
    """The cap of a :class:`~diloco_gym.envs.fleet.DiLoCoFleetEnv` (``None`` without one)."""
    cap_pp = env.fleet.site_cap_pp
    if cap_pp is None:
        return None
    s = env.setup
    caps = cap_pp / 100.0 * fleet_cap.site_nominal_requests(s)
    return CapCheck(cap_pp, caps, fleet_cap.settle_lags(s.params, s.sidecars), s.params.h_max)


#: The early stop's tail probability: a rejection run stops before its limit when keeping
#: ``draws`` schedules within it is this unlikely at the acceptance seen so far.
HOPELESS_TAIL = 1e-9


def rejection_hopeless(kept: int, drawn: int, draws: int, most: int) -> bool:
    """Whether keeping ``draws`` schedules within ``most`` draws is out of reach after
    ``kept`` of ``drawn``: the draws left would have to keep schedules at the rate ``p* =
    (draws - kept) / (most - drawn)``, and ``kept`` or fewer of ``drawn`` has probability
    below :data:`HOPELESS_TAIL` at that rate (the binomial tail, exact in log space). The
    same draws always give the same answer (no randomness of its own)."""
    need, left = draws - kept, most - drawn
    if need <= 0:
        return False
    if left <= 0:
        return True
    p = need / left
    if p >= 1.0:  # every draw left must be kept: hopeless once one was not
        return p > 1.0 or kept < drawn
    log_p, log_q = math.log(p), math.log1p(-p)
    head = math.lgamma(drawn + 1)
    terms = [
        head - math.lgamma(i + 1) - math.lgamma(drawn - i + 1) + i * log_p + (drawn - i) * log_q
        for i in range(kept + 1)
    ]
    top = max(terms)
    log_tail = top + math.log(sum(math.exp(t - top) for t in terms))
    return log_tail < math.log(HOPELESS_TAIL)


def rejection_error(what: str, cap_pp: float, kept: int, drawn: int, draws: int, seed: Any) -> str:
    """The one-line error of a rejection run that stopped (at its limit, or earlier when
    :func:`rejection_hopeless`), with the acceptance seen and the limit that would do."""
    per = limit("CAP_REJECTIONS")
    rate = kept / drawn if drawn else 0.0
    need = f"about {draws / rate:,.0f}" if rate > 0 else "more than that"
    hint = f"at least {math.ceil(1.0 / rate):,}" if rate > 0 else "far more"
    return (
        f"matched random under site_cap_pp = {cap_pp:g}: only {kept:,} of {drawn:,} uniform "
        f"{what} in the episode of seed {seed} respect the cap (acceptance {rate:.2g}); "
        f"{draws} kept ones would take {need} draws, beyond the limit of {per:,} draws per "
        f"kept one (set {limit_env_var('CAP_REJECTIONS')} to {hint} to draw them)"
    )


def capped_control(
    scorer: Any,
    merges: int,
    draws: int,
    rng: np.random.Generator,
    counts: Any,
    check: CapCheck,
) -> tuple[Control, float]:
    """``draws`` matched-random schedules of ``merges`` syncs that respect the cap, and the
    acceptance rate (module doc), scored by ``scorer`` (a
    :class:`~diloco_gym.eval.fleet.FleetScorer`)."""
    ep, p = scorer.episode, scorer.params
    costs = ep.site_costs
    lags = check.lags_for(ep)
    most = draws * limit("CAP_REJECTIONS")
    kept: list[np.ndarray] = []
    n_kept = drawn = 0
    while n_kept < draws:
        if rejection_hopeless(n_kept, drawn, draws, most):
            what = f"schedules of {merges} syncs"
            raise LimitError(rejection_error(what, check.cap_pp, n_kept, drawn, draws, ep.seed))
        batch = sample_uniform(ep.n_decisions, p.h_min, p.h_max, merges, draws, rng, counts)
        drawn += draws
        ok, _ = fleet_cap.schedules_respect_cap(batch, costs, lags, check.caps, check.h_max)
        kept.append(batch[ok])
        n_kept += int(ok.sum())
    sch = np.concatenate(kept)[:draws]
    return Control(sch, scorer.score(sch)), n_kept / drawn


def cap_columns(res: dict[str, Any], acceptance: float) -> dict[str, Any]:
    """The cap's results.csv columns of one agent's run (its episode summary ``res``)."""
    out: dict[str, Any] = {
        "site_cap_pp": res["site_cap_pp"],
        "cap_masked_decisions": res["cap_masked_decisions"],
        "cap_vetoed_launches": res["cap_vetoed_launches"],
        "cap_overridden_syncs": res["cap_overridden_syncs"],
        "matched_random_cap_acceptance": acceptance,
    }
    for site, pp in res["site_cap_used_pp"].items():
        out[f"site_{site}_cap_used_pp"] = pp
    return out


def cap_summary(sub: Any, sites: list[str], capped: bool) -> dict[str, Any]:
    """One agent's per-site means (and, ``capped``, the cap's) for the summary."""
    out = {
        f"site_{s}_sync_excess_pct": float(sub[f"site_{s}_sync_excess_pct"].mean()) for s in sites
    }
    if capped:
        for key in ("cap_masked_decisions", "cap_overridden_syncs"):
            out[key] = float(sub[key].mean())
        over = np.zeros(len(sub), dtype=bool)
        for s in sites:
            over |= (sub[f"site_{s}_cap_used_pp"] > sub["site_cap_pp"]).to_numpy()
        out["episodes_over_cap"] = int(over.sum())
    return out


def cap_note(cap_pp: float | None, rounds: bool = False) -> str:
    """The report's sentence on the cap ('' without one; ``rounds``: per-site timing)."""
    if cap_pp is None:
        return ""
    control = (
        "the control's rounds (the agent's rounds and sites, placed at random) that respect "
        "the same cap, each site's contributions replayed under the cap's rule"
        if rounds
        else "the schedules of the agent's syncs that respect the same cap"
    )
    return (
        f"Per-site serving cap site_cap_pp = {cap_pp:g} pp: every agent ran under the cap's "
        f"mask; matched random is drawn uniformly among {control} (rejection sampling from "
        f"the uncapped control); the oracle is the uncapped bound (its schedules may break "
        f"the cap)."
    )


def site_table(summary: Any, sites: list[str], capped: bool) -> str:
    """Each site's mean sync-excess (pp of its own requests) per agent, as Markdown; with
    a cap, the mean masked decisions and forced syncs over the cap per episode, and the
    episodes where some site ended over its cap (its additive excess, pp of its nominal
    requests)."""
    head = ["agent", *(f"{md_text(s)} pp" for s in sites)]
    if capped:
        head += ["cap-masked decisions", "forced syncs over cap", "episodes over cap"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for _, r in summary.iterrows():
        cells = [md_text(str(r["agent"]))]
        cells += [f"{r[f'site_{s}_sync_excess_pct']:.3f}" for s in sites]
        if capped:
            cells += [
                f"{r['cap_masked_decisions']:.1f}",
                f"{r['cap_overridden_syncs']:.2f}",
                str(int(r["episodes_over_cap"])),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
