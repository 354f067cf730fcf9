"""The protocol on a fleet with per-site timing (``timing = "rounds"``): the same scoring,
matched-random control and oracle as :mod:`diloco_gym.eval.fleet`, over rounds.

* **Scoring**: a run's exact sync-excess is the sum over sites of each site's exact replay
  of its own sync decisions (:class:`~diloco_gym.eval.protocol.EpisodeScorer` per site), in
  pp of the fleet's requests; the same scorer serves agent, control and oracle.
* **Matched random**: the round openings are drawn uniformly among all feasible schedules
  with the agent's number of rounds (the exact sampler of the one-instant fleet); round
  ``k`` keeps the agent's round ``k``'s contributing sites, so every site contributes as
  often as under the agent and the token share merged is the same; each of them
  contributes at a decision drawn uniformly from those the rules allowed it in that round
  (from ready to ``max(window end, ready)``: :func:`~diloco_gym.sim.rounds.send_range`,
  with round ``k``'s start delays, the episode's). A site that is never ready before the
  episode ends under a drawn opening is dropped from that draw (counted in
  ``control_dropped``).
* **Oracle**: at the agent's number of rounds and contributing sites, the dynamic programme
  over round openings whose round ``k`` at opening ``o`` costs the sum over its sites of
  each site's least isolated cost in its allowed decisions; replayed exactly. It is the
  additive optimum, an upper bound on the exact optimum, bracketed below by a certified
  lower bound (``oracle_lower_bound_pct``, :func:`rounds_lower_bound`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from diloco_gym.eval import protocol
from diloco_gym.eval.scorer import site_scorers
from diloco_gym.sim import rounds as rd
from diloco_gym.sim.schedules import sample_uniform

__all__ = [
    "RoundsScorer",
    "control_sends",
    "control_draws",
    "rounds_oracle",
    "rounds_lower_bound",
    "score_rounds_episode",
    "site_rows",
    "agent_exact_pct",
    "rounds_columns",
    "rounds_record",
    "rounds_markdown",
    "rounds_paragraph",
    "rounds_summary",
    "is_rounds",
    "ROUNDS_SUMMARY_COLUMNS",
    "ORACLE_ROUNDS",
]

#: The oracle's status on a rounds fleet (``oracle_schedule`` of its rows): the additive
#: optimum over openings and per-site placement, replayed exactly; no local search; its
#: certified lower bound (:func:`rounds_lower_bound`) in ``oracle_lower_bound_pct``.
ORACLE_ROUNDS = (
    "upper bound (additive optimum over round openings and each site's placement, "
    "replayed exactly; certified lower bound in oracle_lower_bound_pct)"
)

#: What a rounds summary adds per agent (the mean over its episodes of the rows' columns
#: of :func:`rounds_columns`).
ROUNDS_SUMMARY_COLUMNS = ("dropped_contributions", "token_share_mean", "dropped_progress")


class RoundsScorer:
    """Exact sync-excess of per-site schedules on one fleet episode (pp of all requests)."""

    def __init__(self, episode: Any, params: Any, sidecars: list[Any]) -> None:
        self.episode = episode
        self.params = params
        self.sites = site_scorers(episode, params, sidecars)
        self.n_requests = np.array([e.n_requests for e in episode.sites], dtype=np.float64)
        self.total = float(max(1.0, self.n_requests.sum()))
        #: ``(N, n_decisions)`` each site's isolated cost of a sync at each decision.
        self.costs = np.stack([np.asarray(s.cost, dtype=np.float64) for s in self.sites])

    def score(self, rows: list[list[list[int]]]) -> protocol.Scores:
        """Scores of ``rows``: each row a list, per site, of its sync decisions."""
        k = len(rows)
        exact = np.zeros(k)
        additive = np.zeros(k)
        replayed = np.zeros(k, dtype=bool)
        for s, (scorer, n) in enumerate(zip(self.sites, self.n_requests, strict=True)):
            lengths = np.array([len(r[s]) for r in rows])
            for m in np.unique(lengths).tolist():
                idx = np.flatnonzero(lengths == m)
                sch = np.array([sorted(rows[i][s]) for i in idx], dtype=np.int64).reshape(
                    idx.size, m
                )
                sc = scorer.score(sch)
                exact[idx] += sc.exact_pct * n / self.total
                additive[idx] += sc.additive_pct * n / self.total
                replayed[idx] |= sc.replayed
        return protocol.Scores(exact, additive, replayed)


def control_sends(
    openings: np.ndarray,
    round_sites: list[list[int]],
    rules: rd.RoundRules,
    delays: np.ndarray,
    last: int,
    rng: np.random.Generator,
) -> tuple[list[list[list[int]]], int]:
    """Per drawn opening schedule (rows of ``openings``), each site's contributions: round
    ``k``'s sites of ``round_sites``, each at a uniform decision of its allowed range
    (:func:`~diloco_gym.sim.rounds.send_range`). Returns the rows and how many
    contributions were dropped (never ready); :func:`control_draws` draws them."""
    rows, dropped, _ = control_draws(openings, round_sites, rules, delays, last, rng)
    return rows, dropped


def control_draws(
    openings: np.ndarray,
    round_sites: list[list[int]],
    rules: rd.RoundRules,
    delays: np.ndarray,
    last: int,
    rng: np.random.Generator,
) -> tuple[list[list[list[int]]], int, np.ndarray]:
    """:func:`control_sends`' rows and drops, and their contribution table ``(R, m, N)``
    (each round's contribution decision per site, -1 for none: what
    :func:`~diloco_gym.envs.fleet_cap.contribution_table` gives for these rows, tested;
    a contribution lies in its round's range, before the next round opens). The
    decisions are drawn in one call, row by row, round by round and site by site in
    ``round_sites``' order: the numbers one call per contribution would draw, in that
    order (NumPy's ``integers`` with array bounds draws element by element as with
    scalar ones; tested)."""
    n = rules.n_sites
    op = np.asarray(openings, dtype=np.int64).reshape(len(openings), -1)
    ks = np.array([k for k, sites in enumerate(round_sites) for _ in sites], dtype=np.int64)
    ss = np.array([s for sites in round_sites for s in sites], dtype=np.int64)
    o = op[:, ks]  # (R, E): each contribution's round opening
    lo, hi = rd.send_ranges(o, np.asarray(delays, dtype=np.int64)[ks, ss], rules.grace, last)
    valid = lo <= hi
    vals = np.full(o.shape, -1, dtype=np.int64)
    vals[valid] = rng.integers(lo[valid], hi[valid] + 1)
    cols = [np.flatnonzero(ss == site) for site in range(n)]
    rows = [
        [r[c][r[c] >= 0].tolist() for c in cols]  # each site's contributions, round order
        for r in vals
    ]
    table = np.full((op.shape[0], op.shape[1], n), -1, dtype=np.int64)
    table[:, ks, ss] = vals
    return rows, int((~valid).sum()), table


def _window_min(values: np.ndarray, start: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """For each ``o`` of ``values``' indices: the least of ``values[o + start : o + start +
    width]`` (indices past the end count as infinite) and where it is (``-1``: none)."""
    n = values.size
    pad = np.concatenate([values, np.full(start + width, np.inf)])
    win = np.lib.stride_tricks.sliding_window_view(pad, width)[start : start + n]
    arg = np.argmin(win, axis=1)
    best = win[np.arange(n), arg]
    where = np.where(np.isfinite(best), np.arange(n) + start + arg, -1)
    return best, where


def _round_costs(
    costs: np.ndarray, rules: rd.RoundRules, delays: np.ndarray, k: int, sites: list[int], n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Round ``k``'s least cost at every opening ``o`` and, per site of ``sites``, the
    decision that attains it (:func:`~diloco_gym.sim.rounds.send_range`'s decisions):
    ``(cost (n,), best (len(sites), n))``, ``best`` -1 where the site is never ready."""
    total = np.zeros(n)
    best = np.zeros((len(sites), n), dtype=np.int64)
    for j, s in enumerate(sites):
        delay = int(delays[k, s])
        width = max(rules.grace, delay) - delay + 1
        least, where = _window_min(costs[s], delay, width)
        best[j] = where
        total += np.where(where >= 0, least, 0.0)
    return total, best


def rounds_oracle(
    costs: np.ndarray,
    rules: rd.RoundRules,
    delays: np.ndarray,
    round_sites: list[list[int]],
    h_min: int,
    h_max: int,
) -> list[list[int]]:
    """The additive optimum: round openings (a feasible schedule of ``len(round_sites)``
    rounds) and per-site placements minimising the summed isolated costs. Returns each
    site's sync decisions."""
    n = costs.shape[1]
    m = len(round_sites)
    nsites = costs.shape[0]
    if m == 0:
        return [[] for _ in range(nsites)]
    per = [_round_costs(costs, rules, delays, k, round_sites[k], n) for k in range(m)]
    value = np.full((m, n), np.inf)
    choice = np.full((m, n), -1, dtype=np.int64)
    d = np.arange(n)
    value[m - 1] = np.where((n - 1) - d < h_max, per[m - 1][0], np.inf)
    for k in range(m - 2, -1, -1):
        least, where = _window_min(value[k + 1], h_min, h_max - h_min + 1)
        value[k] = per[k][0] + least
        choice[k] = where
    first = value[0, h_min : h_max + 1]
    if first.size == 0 or not np.isfinite(first.min()):
        raise ValueError(f"no feasible schedule of {m} rounds in {n} decisions")
    o = h_min + int(np.argmin(first))
    sends: list[list[int]] = [[] for _ in range(nsites)]
    for k in range(m):
        best = per[k][1]
        for j, s in enumerate(round_sites[k]):
            if best[j, o] >= 0:
                sends[s].append(int(best[j, o]))
        if k < m - 1:
            o = int(choice[k, o])
    return sends


def rounds_lower_bound(
    scorer: RoundsScorer,
    rules: rd.RoundRules,
    delays: np.ndarray,
    round_sites: list[list[int]],
    h_min: int,
    h_max: int,
) -> float:
    """A certified lower bound (pp of the fleet's requests) on the exact sync-excess of every
    schedule the oracle and the control choose among: ``len(round_sites)`` round openings
    under the corridor, round ``k``'s sites of ``round_sites`` each contributing in its
    allowed range (:func:`~diloco_gym.sim.rounds.send_range`, with the episode's start
    delays), a site never ready before the episode ends dropped.

    Each site's excess depends on its own sync decisions only and is at least the pair-credit
    bound of :mod:`diloco_gym.eval.lower_bound` over every schedule that keeps to the ranges
    its decisions must lie in: its sync in round ``k`` at ``o_k + delay`` to ``o_k +
    max(grace, delay)``, with ``o_k`` between ``(k + 1) h_min`` and ``(k + 1) h_max`` and at
    least ``n - (m - k) h_max`` (the corridor's first, last and consecutive openings), so
    the gap to its next sync, ``j`` rounds on, between ``j h_min`` and ``j h_max`` plus the
    offsets' difference (:func:`~diloco_gym.eval.lower_bound.chain_bound`). A site in the
    last round with a start delay there may be dropped from it (never ready): the bound
    takes the lesser of the two. The fleet's bound is the sites' bounds weighted by their
    requests, as on the one-instant fleet; with a grace window of 0, every site in every
    round and no start delays it is the one-instant fleet's bound (tested). With changing
    links each decision's credits are its own sync's
    (:func:`~diloco_gym.eval.lower_bound.scorer_credits`). NaN for no round."""
    from diloco_gym.eval.lower_bound import chain_bound

    m = len(round_sites)
    if m == 0:
        return float("nan")
    n = scorer.episode.n_decisions
    lo_gap = max(1, h_min - rules.span)
    total = 0.0
    for s, (site, count) in enumerate(zip(scorer.sites, scorer.n_requests, strict=True)):
        ks = [k for k in range(m) if s in round_sites[k]]
        if not ks:
            continue
        off = [(int(delays[k, s]), max(rules.grace, int(delays[k, s]))) for k in ks]
        pos = [
            (max((k + 1) * h_min, n - (m - k) * h_max) + a, (k + 1) * h_max + b)
            for k, (a, b) in zip(ks, off, strict=True)
        ]
        gaps = [
            (max(lo_gap, (k2 - k1) * h_min + a2 - b1), min(n - 1, (k2 - k1) * h_max + b2 - a1))
            for k1, k2, (a1, b1), (a2, b2) in zip(ks, ks[1:], off, off[1:], strict=False)
        ]
        credits = _round_credits(site, lo_gap, max([lo_gap] + [b for _, b in gaps]))
        least = chain_bound(credits, lo_gap, pos, gaps)
        if ks[-1] == m - 1 and off[-1][0] > 0:  # never ready in the last round: dropped
            least = min(least, chain_bound(credits, lo_gap, pos[:-1], gaps[:-1]))
        if not np.isfinite(least):
            return float("nan")  # no schedule keeps to the ranges: nothing to bound
        total += least * site.episode.pct_per_request * float(count) / scorer.total
    return total


def _round_credits(site: Any, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A site scorer's pair credits for next syncs ``lo`` to at least ``hi`` decisions on,
    kept on the scorer for the agents scored after (recomputed only for a wider range; the
    window's width is what a site's gaps need, not the episode's length)."""
    from diloco_gym.eval.lower_bound import scorer_credits

    cache = site.__dict__.setdefault("_round_credits", {})
    have = cache.get(lo)
    if have is None or have[0] < hi:
        have = cache[lo] = (hi, scorer_credits(site, (lo, hi)))
    return have[1]


def score_rounds_episode(
    env: Any,
    episode: Any,
    summary: dict[str, Any],
    draws: int,
    rng: np.random.Generator,
    counts: Any = None,
    check: Any = None,
    scorer: RoundsScorer | None = None,
) -> dict[str, Any]:
    """Agent, matched-random control and oracle of one rounds episode, all by the same
    exact replay: the columns of :func:`~diloco_gym.eval.protocol.score_episode`, plus
    ``control_dropped`` (contributions a drawn opening left no time for). With a site cap
    (``check``, :func:`~diloco_gym.eval.fleet_cap.cap_check`) the control keeps the rows
    that respect it (:func:`capped_rounds_control`; ``matched_random_cap_acceptance``) and
    the oracle stays the uncapped additive optimum. The oracle is bracketed below by
    :func:`rounds_lower_bound`. ``scorer``: the episode's :class:`RoundsScorer`, shared by
    the agents scored on it (built here when not given)."""
    p = env.params
    rules = env.rules
    n = episode.n_decisions
    if scorer is None:
        scorer = RoundsScorer(episode, p, env.setup.sidecars)
    agent_row = site_rows(env, summary)
    round_sites = [list(x) for x in summary["round_sites"]]
    m = len(round_sites)
    delays = env.round_delays(episode)  # the delays the agent met
    if check is None:
        openings = sample_uniform(n, p.h_min, p.h_max, m, draws, rng, counts)
        rows, dropped = control_sends(openings, round_sites, rules, delays, n - 1, rng)
    else:  # matched random under the same site cap (rejection sampling)
        rows, _, dropped, accepted = capped_rounds_control(
            env, episode, round_sites, delays, draws, rng, counts, check
        )
    a = scorer.score([agent_row])
    c = scorer.score(rows)
    orc = rounds_oracle(scorer.costs, rules, delays, round_sites, p.h_min, p.h_max)
    o = scorer.score([orc])
    lower = rounds_lower_bound(scorer, rules, delays, round_sites, p.h_min, p.h_max)
    scored = min(float(a.exact_pct[0]), float(o.exact_pct[0]), float(c.exact_pct.min()))
    if lower > scored + 1e-9:
        raise RuntimeError(
            f"the certified lower bound {lower:.6f} pp is above a scored schedule's "
            f"{scored:.6f} pp on a rounds fleet: the bound's premise fails"
        )
    gaps = np.abs(np.concatenate([x.exact_pct - x.additive_pct for x in (a, c, o)]))
    replayed = int(a.replayed.sum() + c.replayed.sum() + o.replayed.sum())
    return {
        "sync_excess_pct": float(a.exact_pct[0]),
        "additive_excess_pct": float(a.additive_pct[0]),
        **protocol.control_figures(c),
        "oracle_same_budget_pct": float(o.exact_pct[0]),
        "oracle_additive_pct": float(o.additive_pct[0]),
        "oracle_schedule": ORACLE_ROUNDS,
        "oracle_lower_bound_pct": lower,
        "scoring": protocol.SCORING_EXACT,
        "replayed_schedules": replayed,
        "additive_exact_gap_pp": float(gaps.max()),
        "control_dropped": int(dropped),
        **({} if check is None else {"matched_random_cap_acceptance": accepted}),
    }


def capped_rounds_control(
    env: Any,
    episode: Any,
    round_sites: list[list[int]],
    delays: np.ndarray,
    draws: int,
    rng: np.random.Generator,
    counts: Any,
    check: Any,
) -> tuple[list[list[list[int]]], np.ndarray, int, float]:
    """``draws`` rows of the rounds control that respect the site cap
    (:func:`~diloco_gym.envs.fleet_cap.rounds_respect_cap`), drawn as the uncapped control
    draws them and kept when the cap's replay allows them; their round openings ``(draws,
    m)``, the contributions the kept rows dropped and the acceptance rate. At most
    ``draws x CAP_REJECTIONS`` rows are drawn, and fewer when keeping ``draws`` within
    them has become implausible (the one-instant capped control's rules,
    :func:`~diloco_gym.eval.fleet_cap.capped_control`)."""
    from diloco_gym.envs import fleet_cap as env_cap
    from diloco_gym.eval.fleet_cap import rejection_error, rejection_hopeless
    from diloco_gym.sim.limits import LimitError, limit

    p, rules, n = env.params, env.rules, episode.n_decisions
    m = len(round_sites)
    costs = episode.site_costs
    lags = check.lags_for(episode)
    most = draws * limit("CAP_REJECTIONS")
    kept: list[list[list[int]]] = []
    kept_open: list[np.ndarray] = []
    dropped = drawn = 0
    while len(kept) < draws:
        if rejection_hopeless(len(kept), drawn, draws, most):
            what = f"rounds schedules of {m} rounds"
            msg = rejection_error(what, check.cap_pp, len(kept), drawn, draws, episode.seed)
            raise LimitError(msg)
        openings = sample_uniform(n, p.h_min, p.h_max, m, draws, rng, counts)
        rows, _, table = control_draws(openings, round_sites, rules, delays, n - 1, rng)
        drawn += draws
        ok = env_cap.rounds_respect_cap(
            openings, table, rules, costs, lags, check.caps, check.h_max
        )
        for i in np.flatnonzero(ok).tolist():
            if len(kept) < draws:
                kept.append(rows[i])
                kept_open.append(openings[i])
                dropped += sum(len(round_sites[k]) for k in range(m)) - sum(map(len, rows[i]))
    return kept, np.asarray(kept_open, dtype=np.int64).reshape(-1, m), dropped, len(kept) / drawn


def site_rows(env: Any, summary: dict[str, Any]) -> list[list[int]]:
    """A rounds run's schedule as :class:`RoundsScorer` reads it: each site's sync
    decisions, in the fleet's site order."""
    return [list(summary["site_sync_decisions"][nm]) for nm in env.setup.site_names]


def agent_exact_pct(env: Any, episode: Any, summary: dict[str, Any]) -> float:
    """A rounds run's exact sync-excess (pp of the fleet's requests), by the scorer of
    :func:`score_rounds_episode` alone (no control, no oracle)."""
    scorer = RoundsScorer(episode, env.params, env.setup.sidecars)
    return float(scorer.score([site_rows(env, summary)]).exact_pct[0])


def rounds_columns(summary: dict[str, Any]) -> dict[str, Any]:
    """The results.csv columns of a rounds run (its episode summary): contributions
    dropped, the mean token share merged, the progress the drops took back, and each
    site's number of syncs."""
    return {
        "dropped_contributions": int(summary["dropped_contributions"]),
        "token_share_mean": float(summary["token_share_mean"]),
        "dropped_progress": float(summary["dropped_progress"]),
        **{f"site_{k}_syncs": int(v) for k, v in summary["site_sync_counts"].items()},
    }


def rounds_record(env: Any) -> dict[str, Any]:
    """The report's description of a fleet's timing (``{"timing": "instant"}`` without
    per-site timing)."""
    f = env.fleet
    if not f.per_site_timing:
        return {"timing": "instant"}
    r = env.rules
    return {
        "timing": "rounds",
        "grace_s": f.grace_s,
        "grace_decisions": r.grace,
        "quorum": r.quorum,
        "site_delay_max_s": {s.name: s.delay_max_s for s in f.sites},
        "site_compute_speed": {s.name: s.compute_speed for s in f.sites},
    }


def rounds_summary(rows: Any) -> dict[str, float]:
    """One agent's rounds summary (:data:`ROUNDS_SUMMARY_COLUMNS`: the means over its
    ``rows``); ``{}`` for the rows of a one-instant fleet (no rounds columns)."""
    if ROUNDS_SUMMARY_COLUMNS[0] not in rows:
        return {}
    return {c: float(rows[c].mean()) for c in ROUNDS_SUMMARY_COLUMNS}


def is_rounds(frame: Any) -> bool:
    """Whether a fleet summary (or frontier) ``frame`` is a rounds fleet's (it has the
    columns of :func:`rounds_summary`)."""
    return ROUNDS_SUMMARY_COLUMNS[0] in frame


def rounds_paragraph(record: dict[str, Any]) -> str:
    """The rounds' rules, matched random and oracle in a sentence or three (``record``:
    :func:`rounds_record` of a rounds fleet)."""
    from diloco_gym.text import md_text

    n = len(record["site_delay_max_s"])
    slow = [f"{md_text(k)} up to {v:g} s" for k, v in record["site_delay_max_s"].items() if v]
    return (
        f"Per-site timing: each sync is a round that every site joins at its own decision; "
        f"grace window {record['grace_s']:g} s ({record['grace_decisions']} decisions), "
        f"quorum {record['quorum']} of {n}; "
        + (f"stragglers: {', '.join(slow)}." if slow else "no stragglers.")
        + " Matched random keeps each round's contributing sites and places each uniformly "
        "among the decisions the rules allowed it; the oracle is the additive optimum over "
        "round openings and each site's placement, replayed exactly: an upper bound on the "
        "exact optimum, bracketed below by a certified lower bound (each site's least "
        "excess over the decisions the rules could allow it, `oracle_lower_bound_pct`)."
    )


def rounds_markdown(record: dict[str, Any], rows: Any, agents: list[str]) -> list[str]:
    """report.md's paragraph and table on the rounds (nothing without per-site timing)."""
    from diloco_gym.text import md_text

    if record.get("timing") != "rounds":
        return []
    out = [
        "## Rounds",
        "",
        rounds_paragraph(record),
        "",
        "| agent | rounds | contributions dropped per episode | token share merged | progress |",
        "|---|---|---|---|---|",
    ]
    for a in agents:
        g = rows[rows["agent"] == a]
        out.append(
            f"| {md_text(a)} | {g['syncs'].mean():.2f} | "
            f"{g['dropped_contributions'].mean():.2f} | {g['token_share_mean'].mean():.3f} | "
            f"{g['progress'].mean():.4f} |"
        )
    return [*out, "", *_bracket_lines(rows)]


def _bracket_lines(rows: Any) -> list[str]:
    """How far the rounds' oracle is from its certified lower bound (nothing where the
    bound is not computed)."""
    gap = (rows["oracle_same_budget_pct"] - rows["oracle_lower_bound_pct"]).dropna()
    if gap.empty:
        return []
    return [
        f"The oracle is {gap.mean():.3f} pp above its certified lower bound on average "
        f"(at most {gap.max():.3f} pp over {gap.size} rows): the exact optimum lies between "
        f"them.",
        "",
    ]
