"""A fleet whose sites contribute to each sync at their own time (``timing = "rounds"``).

:class:`DiLoCoFleetRoundsEnv` is :class:`~diloco_gym.envs.fleet.DiLoCoFleetEnv` with the
rules of :mod:`diloco_gym.sim.rounds`: a sync is a round that opens when the agent asks
(or the corridor forces it) and that every site joins at a decision of its own, within a
grace window, a quorum and the sites' start delays. ``gym.make("DiLoCoFleet-v1",
timing="rounds", ...)`` (or ``timing = "rounds"`` in a fleet file's ``[fleet]`` table)
makes it. docs/fleet.md "Per-site timing" states the model.

How it rides on the fleet env: the compiled step sees a round's opening as its merge (the
corridor, the budget, the learner credit and the progress term are the fleet env's). The
merge's cost it charges is that of the sites contributing at the opening; a site
contributing later is charged at its own decision, in that step's ``sync_excess`` term,
and when a round with dropped sites closes, the global model keeps only the contributing
sites' share of the round's tokens and the round's progress is recomputed on the loss
curve (the token-weighted merge; the difference is taken back in that step). The episode
summary replays every site with its own sync decisions.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from diloco_gym.envs import kernel
from diloco_gym.envs.fleet import DiLoCoFleetEnv, FleetEpisode
from diloco_gym.sim import learners as lrn
from diloco_gym.sim import rounds as rd

__all__ = ["DiLoCoFleetRoundsEnv", "rounds_obs_features"]


def rounds_obs_features(site_names: list[str]) -> list[tuple[str, str, float, float, str]]:
    """The round features appended to the fleet observation (name, unit, low, high,
    meaning); all causal (the round's state after the decisions so far)."""
    out = [
        ("round_open", "flag", 0.0, 1.0, "1 while a round is open (some site still may join)"),
        (
            "round_age",
            "fraction",
            0.0,
            1.0,
            "decisions since the open round opened over the rounds' longest span (0: none)",
        ),
    ]
    for name in site_names:
        out.append((f"{name}.ready", "flag", 0.0, 1.0, "1 when the site may contribute now"))
        out.append((f"{name}.sent", "flag", 0.0, 1.0, "1 when the site has joined the open round"))
    return out


class DiLoCoFleetRoundsEnv(DiLoCoFleetEnv):
    """## Description

    The fleet with per-site timing (:mod:`diloco_gym.sim.rounds`): each sync is a round;
    each site joins it once, at its own decision, when it is ready, within the grace
    window or when the quorum needs it.

    ## Action Space

    ``MultiBinary(N)``: ``a[s] = 1`` asks site ``s`` to contribute now. With no round open,
    any ``1`` opens a round (where the corridor allows a sync) and the asked sites that are
    ready contribute at once; a round the corridor forces opens whatever the action. In an
    open round the asked ready sites contribute, and at the window's end the sites the
    quorum still needs are forced (in site order). ``action_masks()``: MaskablePPO's flat
    mask, ``[may send 0, may send 1]`` per site; ``info["action_mask"]`` is Gymnasium's
    ``MultiBinary`` sample mask (``0``: must be 0, ``1``: must be 1, ``2``: free).

    With ``bits_options`` (the per-sync precision action): ``MultiDiscrete([2] * N +
    [K])``, each site's bit then a precision index; a round that opens in the step (asked
    or forced) syncs at that precision, and every later contribution to it too, whatever
    the index of the actions while it is open. ``action_masks()`` appends ``K`` ones;
    ``info["action_mask"]`` is ``MultiDiscrete``'s, one int8 mask per entry.

    ## Observation Space

    The fleet env's features, then :func:`rounds_obs_features`: ``round_open``,
    ``round_age`` and, per site, ``<site>.ready`` and ``<site>.sent``. All causal.

    ## Rewards

    The fleet env's, with each site's cost charged in the step it contributes; when a round
    with dropped sites closes, the progress of the tokens it did not merge is taken back.

    ## Special case

    ``grace_s = 0``, every site in the quorum and no start delays: every site contributes
    at the opening, and with the actions ``1`` for every site (launch) or ``0`` for every
    site (defer) the env is ``DiLoCoFleet-v1`` bit for bit (tested).
    """

    def _build(self, fleet, params, learners, render_mode, overrides) -> None:  # noqa: ANN001
        super()._build(fleet, params, learners, render_mode, overrides)
        f = self.fleet
        if not f.per_site_timing:
            raise ValueError("DiLoCoFleetRoundsEnv needs timing = 'rounds' in the fleet")
        p = self.params
        self.rules = rd.round_rules(
            f.grace_s,
            f.quorum,
            [s.delay_max_s for s in f.sites],
            [s.compute_speed for s in f.sites],
            p.decision_seconds,
        )
        window = -(-p.merge_steps // p.decision_interval)
        rd.check_fits(self.rules, window, p.h_min)
        n = f.n_sites
        # widens the base env's Discrete(2); with bits_options one precision index more
        space: Any = (
            gym.spaces.MultiBinary(n)
            if f.bits_options is None
            else gym.spaces.MultiDiscrete([2] * n + [len(f.bits_options)])
        )
        self.action_space = space
        self._n_fleet_obs = len(self.obs_features)
        extra = rounds_obs_features(self.setup.site_names)
        self.obs_features = tuple(self.obs_features) + tuple(extra)
        self.obs_index = {x[0]: i for i, x in enumerate(self.obs_features)}
        low = np.array([x[2] for x in self.obs_features], dtype=np.float32)
        high = np.array([x[3] for x in self.obs_features], dtype=np.float32)
        self.observation_space = gym.spaces.Box(low, high, dtype=np.float32)
        self._clear_rounds()

    def _clear_rounds(self) -> None:
        n = self.fleet.n_sites
        self._round: rd.RoundState | None = None
        self._rounds: list[rd.RoundState] = []
        self._sends: list[list[int]] = [[] for _ in range(n)]
        self._send_costs: list[list[float]] = [[] for _ in range(n)]
        self._send_variants: list[list[int]] = [[] for _ in range(n)]  # each send's episode
        self._precision = self.setup.default_option  # the action's precision index
        self._cap_over = 0  # contributions forced over the site cap
        self._round_over = False  # the open round has one
        self._later_requests = 0.0  # costs charged after the openings (requests)
        self._dropped_progress = 0.0
        self._delays: np.ndarray | None = None
        self._action: np.ndarray | None = None
        self._overridden = False
        self._pending_lost = 0.0  # progress a round closed at reset took back (first step)
        # the progress and the global model's tokens before each round's opening step
        self._before: list[tuple[float, float]] = []
        self._step_before = (0.0, 0.0)

    # ------------------------------------------------------------------ episode
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """As the fleet env's (a round the corridor forces before the first action opens
        with no site asked)."""
        self._clear_rounds()
        obs, info = super().reset(seed=seed, options=options)
        if self._rounds:  # a round forced before the first action
            self._pending_lost = self._settle()
            obs = self._obs()
        return obs, info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        a = self._check_action(action)
        ep = self.episode
        if ep is None:
            raise RuntimeError("call reset() before using the environment")
        if self._state_ints.item(0) >= ep.n_decisions:
            raise RuntimeError("step() called after the episode ended; call reset()")
        d = self._state.d.item(0)
        later = 0.0
        self._overridden = False
        rs = self._round
        if rs is not None and not rs.closed:  # the open round's contributions at d
            allowed = self._cap_allows(d, rs.opening)
            asked = self._cap_asks(a, allowed, rs.ready(d) & ~rs.must_send(d))
            sends, self._overridden = rs.contribute(d, asked, prefer=allowed)
            self._overridden = self._overridden or bool(np.any(a & ~asked))
            later = self._record_sends(sends, d, allowed) + self._worst_site_term(rs)
            self._action = None
            want = 0
        else:
            want = self._ask_opening(a, d)
        self._keep_asking()
        self._step_before = (self._state.progress_sum.item(0), self._state.tokens.item(0))
        obs, reward, term, trunc, info = super().step(want)
        terms = info["reward_terms"]
        scale = self.episode.reward_per_request  # type: ignore[union-attr]
        if later:
            self._later_requests += later
            reward += self._fused.reward(later * scale, 0.0)
            terms["sync_excess"] -= later * scale
        lost = self._settle() + self._pending_lost
        self._pending_lost = 0.0
        if lost:
            reward += self._fused.reward(0.0, -lost)
            terms["progress"] -= lost
        if later or lost or self._overridden:
            info["action_overridden"] = bool(info["action_overridden"] or self._overridden)
            info["excess_requests_so_far"] = self._excess_so_far()
            obs = self._obs()
            if trunc:
                info["episode_summary"] = self.episode_summary()
        return obs, reward, term, trunc, info

    def _ask_opening(self, a: np.ndarray, d: int) -> int:
        """With no round open: whether the action launches one at ``d`` (1) and the sites it
        asks to join at once (kept for the opening), the site cap applied; the round that
        opens in this step (asked or forced) syncs at the action's precision."""
        want = int(a.any())
        if self.fleet.bits_options is not None:
            self._choose(self._precision)
        allowed = self._cap_allows(d, d)
        if allowed is not None and self._cap_opens(bool(want), d, allowed):
            asked = self._cap_asks(a, allowed, a)  # the sites it asks that the cap stops
            self._overridden = bool(np.any(a & ~asked))
            a = asked
        elif allowed is not None:  # the cap masked the opening (counted once, as a
            want = 0  # launch); no site is asked (a round the corridor forces later
            a = np.zeros_like(a)  # opens with none asked, as after a defer)
        self._action = a
        return want

    def _check_action(self, action: Any) -> np.ndarray:
        """The sites asked to send; with ``bits_options`` the precision index, the action's
        last entry, is kept for a round that opens in this step."""
        a = np.asarray(action)
        n = self.fleet.n_sites
        options = self.fleet.bits_options
        width = n if options is None else n + 1
        ok = a.shape == (width,) and a.dtype.kind in "biuf"
        if ok and options is not None:
            k = a[n]
            ok = bool(k == int(k) and 0 <= k < len(options))
            a = a[:n]
        if not ok or not np.all((a == 0) | (a == 1)):
            more = (
                ""
                if options is None
                else (f", then a precision index 0..{len(options) - 1} (bits_options={options})")
            )
            raise ValueError(
                f"action {action!r} is not in {self.action_space}: expected one 0 or 1 per "
                f"site ({n} sites: {', '.join(self.setup.site_names)}){more}"
            )
        if options is not None:
            self._precision = int(np.asarray(action)[n])
        return a.astype(bool)

    def _want(self, action: Any) -> bool:
        return bool(action)  # step() passes the launch it derived from the action

    def _merge_cost_at(self, d: int) -> float:
        """A round opens at ``d``: the sites contributing at once, and their cost (the
        compiled step charges it as the merge's)."""
        ep = self.episode
        assert isinstance(ep, FleetEpisode)
        if self._delays is None:
            self._delays = self.round_delays(ep)
        k = len(self._rounds)
        rs = rd.RoundState(self.rules, d, self._delays[k], ep.n_decisions - 1)
        self._rounds.append(rs)
        self._before.append(self._step_before)
        self._round = rs
        self._round_over = False
        self._sync_options.append(ep.variant_at(d, self._option))
        if self.fleet.model_version >= 1:
            self._set_learner_work(d)
        wanted = self._action if self._action is not None else np.zeros(rs.sent.size, bool)
        allowed = self._cap_allows(d, d)
        sends, ov = rs.contribute(d, wanted, prefer=allowed)
        self._overridden = self._overridden or (ov and bool(wanted.any()))
        self._keep_asking()
        return self._record_sends(sends, d, allowed) + self._worst_site_term(rs)

    def _worst_site_term(self, rs: rd.RoundState) -> float:
        """With ``worst_site_weight`` (lambda > 0), once round ``rs`` has closed: lambda
        times the largest cost of a contributing site normalised to a site of mean rate,
        the one-instant fleet's term (charged in the step the round closes; 0 otherwise)."""
        lam = self.fleet.worst_site_weight
        if not lam or not rs.closed:
            return 0.0
        costs = self._round_costs(rs)
        norm = self.setup.norm
        return lam * max(costs[s] * norm[s] for s in np.flatnonzero(rs.sent).tolist())

    def _round_costs(self, rs: rd.RoundState) -> dict[int, float]:
        """Each contributing site's cost in round ``rs`` (requests), by site."""
        return {
            s: self._send_costs[s][self._sends[s].index(int(rs.send_d[s]))]
            for s in np.flatnonzero(rs.sent).tolist()
        }

    def round_delays(self, episode: Any) -> np.ndarray:
        """The start delays (decisions) of every round the episode can hold, ``(rounds,
        N)``: drawn from the episode's seed alone (:func:`~diloco_gym.sim.rounds.draw_delays`),
        so the protocol's control and oracle see the delays the agent met."""
        cap = int(kernel.max_merges(episode.n_decisions, self.params)) + 1
        return rd.draw_delays(episode.seed, cap, self.rules)

    def _keep_asking(self) -> None:
        """While a round is open the compiled step stops at every decision (the sites may
        contribute at any); otherwise it skips forced decisions as the fleet env does."""
        rs = self._round
        open_now = rs is not None and not rs.closed
        self._fused.set_skip_forced(self.params.skip_forced and not open_now)

    def _record_sends(self, sends: np.ndarray, d: int, allowed: np.ndarray | None = None) -> float:
        """Record the contributions at ``d`` (and, with a site cap, in its state: those
        the cap did not allow, ``allowed``, were forced by the rules); their summed
        isolated cost (requests)."""
        ep = self.episode
        assert isinstance(ep, FleetEpisode)
        total = 0.0
        variant = ep.variant_at(d, self._option)
        sites = ep.sites_of(variant)  # the links' state at d
        for s in np.flatnonzero(sends).tolist():
            c = sites[s].merge_cost_at(d)
            self._sends[s].append(d)
            self._send_costs[s].append(c)
            self._send_variants[s].append(variant)
            total += c
        if self._cap is not None and bool(sends.any()):
            assert allowed is not None  # computed before the sends, from the past alone
            self._cap_record(d, variant, sends, allowed)
        return total

    def _cap_record(self, d: int, variant: int, sends: np.ndarray, allowed: np.ndarray) -> None:
        """The contributions at ``d`` in the cap's state (their costs, just recorded) and
        its counters: a send the cap did not allow was forced by the rules."""
        assert self._cap is not None
        over = sends & ~allowed
        self._cap_over += int(over.sum())
        if over.any() and not self._round_over:
            self._round_over = True
            self._cap.overridden += 1  # rounds with a contribution forced over the cap
        costs = np.zeros(sends.size)
        for s in np.flatnonzero(sends).tolist():
            costs[s] = self._send_costs[s][-1]
        self._cap.record_sends(d, variant, costs, sends)

    # ------------------------------------------------------------------ site cap
    def _cap_allows(self, d: int, opening: int) -> np.ndarray | None:
        """``(N,)`` the sites the cap lets contribute at ``d`` to a round opened at
        ``opening`` (``None`` without a cap): :meth:`CapTracker.site_allows
        <diloco_gym.envs.fleet_cap.CapTracker.site_allows>`, from settled costs alone."""
        return None if self._cap is None else self._cap.site_allows(d, opening)

    def _cap_opens(self, want: bool, d: int, allowed: np.ndarray) -> bool:
        """Whether a round the agent asks for (``want``) opens at ``d`` under the cap:
        where the corridor lets it defer, only when at least ``quorum`` sites may
        contribute (the env's opening mask); a launch the cap masks becomes a defer
        (counted and flagged as the single-instant fleet's cap does)."""
        assert self._cap is not None
        can_defer, can_merge = (bool(x) for x in self._corridor_masks()[:2])
        blocked = can_defer and can_merge and int(allowed.sum()) < self.rules.quorum
        self._cap.masked += int(blocked)
        self._cap.last_vetoed = bool(want and blocked)
        self._cap.vetoed += int(self._cap.last_vetoed)
        return want and not blocked

    def _cap_asks(self, a: np.ndarray, allowed: np.ndarray | None, free: np.ndarray) -> np.ndarray:
        """The agent's asked sites under the cap: among ``free`` (the sites whose send is
        the agent's choice), those the cap does not allow are dropped (vetoed)."""
        if allowed is None:
            return a
        veto = a & free & ~allowed
        self._cap.vetoed += int(veto.any())  # type: ignore[union-attr]
        return a & ~veto

    def _settle(self) -> float:
        """When the open round has closed: the progress its dropped sites take back (and
        the round is done). The round merged only the contributing sites' share of its
        tokens: the global model's tokens become ``t0 + share x added`` and the round's
        progress is what the loss curve gives for them (a dropped share's progress is not
        linear in it: the power law)."""
        rs = self._round
        if rs is None or not rs.closed:
            return 0.0
        if self._state.n_merges.item(0) < len(self._rounds):
            return 0.0  # the compiled step merges the round's opening at the next step
        self._round = None
        share = rd.token_share(self.rules, rs.sent)
        if share >= 1.0:
            return 0.0
        p0, t0 = self._before[-1]
        t1 = self._state.tokens.item(0)
        t_new = t0 + share * (t1 - t0)
        l0, l1, l_new = lrn.loss(np.array([t0, t1, t_new]), self.learner_params)
        credited = self._state.progress_sum.item(0) - p0
        kept = credited * ((l0 - l_new) / (l0 - l1)) if l0 > l1 else credited * share
        lost = credited - kept
        self._state.tokens[0] = t_new
        self._state.progress_sum[0] -= lost
        self._dropped_progress += lost
        return lost

    def _excess_so_far(self) -> float:
        return super()._excess_so_far() + self._later_requests

    # ------------------------------------------------------------------ masks, obs
    def action_masks(self) -> np.ndarray:
        """``[may send 0, may send 1]`` per site (MaskablePPO's flat ``MultiBinary`` mask).

        With no round open it cannot say "every ready site or none": a round opened where
        its window closes at once (the episode's last decision, or no grace window) takes
        every ready site, and an action asking only some is overridden (and flagged)."""
        n = self.fleet.n_sites
        out = np.ones((n, 2), dtype=bool)
        rs = self._round
        d = self._state.d.item(0)
        if rs is None or rs.closed:
            can_defer, can_merge = (bool(x) for x in self._corridor_masks()[:2])
            out[:, 1] = can_merge
            allowed = self._cap_allows(d, d)
            if allowed is not None:  # the cap: a send only where it allows one, and an
                out[:, 1] &= allowed  # opening the agent may skip needs quorum such sites
                if can_defer:
                    out[:, 1] &= int(allowed.sum()) >= self.rules.quorum
        else:
            must = rs.must_send(d)
            out[:, 1] = rs.ready(d)
            allowed = self._cap_allows(d, rs.opening)
            if allowed is not None:
                out[:, 1] &= allowed | must
            out[:, 0] = ~must
        if self.fleet.bits_options is None:
            return out.ravel()
        return np.concatenate([out.ravel(), np.ones(len(self.fleet.bits_options), dtype=bool)])

    def _step_info(
        self, merged: bool, overridden: bool, mask: tuple[int, int] | None = None
    ) -> dict[str, Any]:
        info = super()._step_info(merged, overridden, mask)
        given = info["action_mask"]  # the fleet env's (split in two with bits_options)
        flat = np.concatenate(given) if isinstance(given, tuple) else np.asarray(given)
        n = self.fleet.n_sites
        m = flat[: 2 * n].astype(bool).reshape(n, 2)
        if self.fleet.bits_options is None:  # MultiBinary's sample mask: 0, 1 or 2 (free)
            info["action_mask"] = np.where(m[:, 0] & m[:, 1], 2, m[:, 1].astype(int)).astype(
                np.int8
            )
        else:  # MultiDiscrete's: one int8 mask per entry, every precision allowed
            info["action_mask"] = (
                *(row.astype(np.int8) for row in m),
                flat[2 * n :].astype(np.int8),
            )
        return info

    def _obs(self) -> np.ndarray:
        base = super()._obs()
        obs = base  # the fleet env's array already has the round features' slots
        k = self._n_fleet_obs
        obs[k:] = 0.0
        rs = self._round
        if rs is not None and not rs.closed:
            d = self._state.d.item(0)
            obs[k] = 1.0
            obs[k + 1] = min(1.0, (d - rs.opening) / max(1, self.rules.span))
            obs[k + 2 :: 2] = rs.ready(d)
            obs[k + 3 :: 2] = rs.sent
        return obs

    # ------------------------------------------------------------------ summary
    def _site_schedules(self) -> list[list[int]]:
        return [list(x) for x in self._sends]

    def _sync_episodes(self, site: int, schedule: list[int]) -> list[Any]:
        """Site ``site``'s episode of each of its contributions: the variant each ran as
        (its round's precision and the links' state when it was sent)."""
        ep = self.episode
        assert isinstance(ep, FleetEpisode)
        return [ep.sites_of(v)[site] for v in self._send_variants[site]]

    def episode_summary(self) -> dict[str, Any]:
        """The fleet env's summary with each site replayed at its own sync decisions, and
        the rounds: when each opened, which sites joined each and when, the sites dropped
        and the token share merged."""
        out = super().episode_summary()
        names = self.setup.site_names
        rounds = self._rounds
        out["timing"] = "rounds"
        out["round_openings"] = [r.opening for r in rounds]
        out["round_sites"] = [np.flatnonzero(r.sent).tolist() for r in rounds]
        out["site_sync_decisions"] = {n: list(x) for n, x in zip(names, self._sends, strict=True)}
        out["site_sync_counts"] = {n: len(x) for n, x in zip(names, self._sends, strict=True)}
        out["dropped_contributions"] = int(sum(int((~r.sent).sum()) for r in rounds if r.closed))
        shares = [rd.token_share(self.rules, r.sent) for r in rounds]
        out["token_share_mean"] = float(np.mean(shares)) if shares else 1.0
        out["dropped_progress"] = self._dropped_progress
        costs: list[float] = []
        for r in rounds:
            total = 0.0
            for c in self._round_costs(r).values():
                total += c
            costs.append(total + self._worst_site_term(r))
        out["merge_costs_requests"] = costs
        out["grace_decisions"] = self.rules.grace
        out["quorum"] = self.rules.quorum
        if self._cap is not None:  # cap_overridden_syncs counts the rounds
            out["cap_overridden_contributions"] = self._cap_over
        return out


def make_fleet_env(**kwargs: Any) -> DiLoCoFleetEnv:
    """The ``DiLoCoFleet-v1`` entry point: :class:`DiLoCoFleetRoundsEnv` when the fleet
    (a :class:`~diloco_gym.sim.fleet.FleetParams`, a fleet file's ``[fleet]`` table, or
    the ``timing`` keyword) asks for per-site timing, else
    :class:`~diloco_gym.envs.fleet.DiLoCoFleetEnv`."""
    if fleet_timing(kwargs.get("fleet"), kwargs.get("timing")) == "rounds":
        return DiLoCoFleetRoundsEnv(**kwargs)
    return DiLoCoFleetEnv(**kwargs)


def fleet_timing(fleet: Any, timing: Any = None) -> Any:
    """The timing a fleet env built from ``fleet`` (and a ``timing`` keyword) has; a file
    that cannot be read answers ``instant`` (the env's constructor then names the error)."""
    from pathlib import Path

    from diloco_gym.sim import fleet as fl
    from diloco_gym.sim import fleet_toml

    if timing is not None:
        return timing
    if isinstance(fleet, fl.FleetParams):
        return fleet.timing
    if isinstance(fleet, (str, Path)):
        try:
            return fleet_toml.load_fleet_toml(fleet)[0].timing
        except (OSError, ValueError):
            return "instant"
    return "instant"


#: Gymnasium reads an entry point's ``metadata`` (render modes).
make_fleet_env.metadata = DiLoCoFleetEnv.metadata  # type: ignore[attr-defined]
