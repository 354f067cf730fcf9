"""The rules of per-site timing (sim/rounds.py) and the fleet keys that select them."""

from __future__ import annotations

import numpy as np
import pytest

from diloco_gym.sim import fleet as fl
from diloco_gym.sim import rounds as rd
from diloco_gym.sim.fleet_toml import load_fleet_toml


def rules(grace=0, quorum=3, delays=(0, 0, 0), speeds=(1.0, 1.0, 1.0)):
    return rd.RoundRules(grace, quorum, tuple(delays), tuple(s / sum(speeds) for s in speeds))


def test_round_rules_in_decisions():
    r = rd.round_rules(9.0, None, [0.0, 4.5], [1.0, 3.0], 1.12)
    assert (r.grace, r.quorum, r.delay_max, r.weights) == (8, 2, (0, 4), (0.25, 0.75))
    assert r.span == 8
    with pytest.raises(ValueError, match=r"quorum must be in \[1, 2\]"):
        rd.round_rules(0.0, 3, [0.0, 0.0], [1.0, 1.0], 1.12)


def test_check_fits_names_the_sizes():
    rd.check_fits(rules(grace=9), window_decisions=7, h_min=16)
    with pytest.raises(ValueError, match="17 in all.*minimum gap of 16 decisions"):
        rd.check_fits(rules(grace=10), window_decisions=7, h_min=16)


def test_delays_are_the_seeds_own_and_in_range():
    r = rules(delays=(0, 3, 7))
    a = rd.draw_delays(5, 40, r)
    assert a.shape == (40, 3)
    assert np.array_equal(a, rd.draw_delays(5, 40, r))
    assert not np.array_equal(a, rd.draw_delays(6, 40, r))
    assert (a[:, 0] == 0).all() and a[:, 1].max() <= 3 and a[:, 2].max() <= 7
    assert a[:, 2].max() == 7 and a.min() == 0  # the whole range is drawn
    assert not rd.draw_delays(5, 4, rules()).any()


def test_one_instant_special_case_everyone_at_the_opening():
    st = rd.RoundState(rules(), 10, np.zeros(3, int), last=100)
    sends, overridden = st.contribute(10, np.ones(3, bool))
    assert sends.all() and not overridden and st.closed
    st = rd.RoundState(rules(), 10, np.zeros(3, int), last=100)
    sends, overridden = st.contribute(10, np.array([True, False, False]))
    assert sends.all() and overridden and st.closed  # the quorum forces the others


def test_grace_window_lets_sites_wait_then_forces_them():
    st = rd.RoundState(rules(grace=4), 10, np.zeros(3, int), last=100)
    sends, _ = st.contribute(10, np.array([True, False, False]))
    assert sends.tolist() == [True, False, False] and not st.closed
    assert st.ready(11).tolist() == [False, True, True]
    assert not st.must_send(13).any()
    sends, _ = st.contribute(12, np.array([False, True, False]))
    assert sends.tolist() == [False, True, False] and not st.closed
    assert st.must_send(14).tolist() == [False, False, True]
    sends, overridden = st.contribute(14, np.zeros(3, bool))
    assert sends.tolist() == [False, False, True] and overridden and st.closed
    assert st.send_d.tolist() == [10, 12, 14]


def test_quorum_drops_the_late_sites():
    st = rd.RoundState(rules(grace=2, quorum=2), 0, np.zeros(3, int), last=100)
    st.contribute(0, np.array([False, False, True]))
    st.contribute(1, np.zeros(3, bool))
    assert not st.must_send(2).any()  # one of two ready sites is needed: the agent may choose
    sends, overridden = st.contribute(2, np.zeros(3, bool))
    assert sends.tolist() == [True, False, False] and overridden  # in site order
    assert st.closed and st.sent.tolist() == [True, False, True]
    assert rd.token_share(rules(quorum=2), st.sent) == pytest.approx(2 / 3)
    assert rd.token_share(rules(), np.ones(3, bool)) == 1.0


def test_a_straggler_is_waited_for_when_the_quorum_needs_it():
    st = rd.RoundState(rules(grace=1), 5, np.array([0, 0, 4]), last=100)
    st.contribute(5, np.ones(3, bool))
    assert not st.closed and not st.ready(7)[2]
    sends, _ = st.contribute(6, np.ones(3, bool))  # window ends, the straggler is not ready
    assert not sends.any() and not st.closed
    assert st.must_send(9).tolist() == [False, False, True]
    sends, _ = st.contribute(9, np.zeros(3, bool))
    assert sends.tolist() == [False, False, True] and st.closed


def test_a_straggler_outside_a_smaller_quorum_is_dropped():
    st = rd.RoundState(rules(grace=1, quorum=2), 5, np.array([0, 0, 4]), last=100)
    st.contribute(5, np.ones(3, bool))
    st.contribute(6, np.zeros(3, bool))
    assert st.closed and st.sent.tolist() == [True, True, False]


def test_the_episode_end_closes_a_round():
    st = rd.RoundState(rules(grace=5), 98, np.array([0, 0, 9]), last=99)
    assert st.window_end == 99
    st.contribute(98, np.zeros(3, bool))
    sends, _ = st.contribute(99, np.zeros(3, bool))
    assert sends.tolist() == [True, True, False] and st.closed


def test_send_range():
    assert rd.send_range(10, 0, 4, 100) == (10, 14)
    assert rd.send_range(10, 6, 4, 100) == (16, 16)  # a straggler past the window: when ready
    assert rd.send_range(98, 0, 4, 99) == (98, 99)
    lo, hi = rd.send_range(98, 5, 4, 99)
    assert lo > hi  # never ready in the episode


def test_fleet_keys_of_per_site_timing_are_checked():
    fl.FleetParams(model_version=1, timing="rounds", grace_s=9.0, quorum=3)
    with pytest.raises(fl.FleetConfigError, match="grace_s apply to per-site timing only"):
        fl.FleetParams(model_version=1, grace_s=9.0)
    site = fl.SiteConfig(name="slow", delay_max_s=3.0)
    with pytest.raises(fl.FleetConfigError, match="site 'slow' delay_max_s apply to per-site"):
        fl.FleetParams(sites=(site,), model_version=1)
    with pytest.raises(fl.FleetConfigError, match="needs the fleet model v1"):
        fl.FleetParams(timing="rounds")
    with pytest.raises(fl.FleetConfigError, match="timing must be one of"):
        fl.FleetParams(model_version=1, timing="async")
    fl.FleetParams(model_version=1, timing="rounds", fragments=2)  # fragments combine
    fl.FleetParams(model_version=1, timing="rounds", bits_options=(8, 32))  # combines too
    # the cap and a worst-site weight combine
    fl.FleetParams(model_version=1, timing="rounds", site_cap_pp=6.0, worst_site_weight=1.0)
    with pytest.raises(fl.FleetConfigError, match=r"quorum must be an integer in \[1, 4\]"):
        fl.FleetParams(model_version=1, timing="rounds", quorum=5)
    with pytest.raises(fl.FleetConfigError, match="compute_speed must be a finite number"):
        fl.SiteConfig(name="x", compute_speed=0.0)


def test_fleet_file_reads_the_timing_keys(tmp_path):
    p = tmp_path / "f.toml"
    p.write_text(
        '[fleet]\nmodel_version = 1\ntiming = "rounds"\ngrace_s = 4.5\nquorum = 1\n'
        '[[site]]\nname = "a"\nregime = "bursty"\ndelay_max_s = 2.0\ncompute_speed = 2.0\n'
        '[[site]]\nname = "b"\nregime = "bursty"\n'
    )
    f, _ = load_fleet_toml(p)
    assert (f.timing, f.grace_s, f.quorum) == ("rounds", 4.5, 1)
    assert (f.sites[0].delay_max_s, f.sites[0].compute_speed) == (2.0, 2.0)
    p.write_text("[fleet]\nmodel_version = 1\ntiming = 3\n")
    with pytest.raises(fl.FleetConfigError, match=r"f.toml: \[fleet\] key 'timing' must be a str"):
        load_fleet_toml(p)


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 5),
    grace=st.integers(0, 6),
    quorum_off=st.integers(0, 4),
    delays=st.lists(st.integers(0, 8), min_size=5, max_size=5),
    opening=st.integers(0, 30),
    last=st.integers(0, 45),
    wants=st.lists(st.lists(st.booleans(), min_size=5, max_size=5), min_size=20, max_size=20),
)
def test_round_rules_hold_for_any_action(n, grace, quorum_off, delays, opening, last, wants):
    """Whatever the agent asks: each site joins at most once, only when ready and by its
    deadline; the mask's forced sites are always sent; the round closes by its span (or
    the episode's end) with the quorum met unless the episode ended first."""
    q = max(1, n - quorum_off)
    last = max(last, opening)
    r = rd.RoundRules(grace, q, tuple(delays[:n]), tuple([1.0 / n] * n))
    st_ = rd.RoundState(r, opening, np.array(delays[:n]), last)
    d = opening
    for w in wants:
        must = st_.must_send(d)
        sends, _ = st_.contribute(d, np.array(w[:n]))
        assert not (must & ~sends).any()
        if st_.closed or d >= last:
            break
        d += 1
    else:
        pytest.fail("a round stayed open past every decision of its span")
    assert st_.closed
    for s in np.flatnonzero(st_.sent):
        lo, hi = rd.send_range(opening, delays[s], grace, last)
        assert lo <= st_.send_d[s] <= hi
    assert (st_.send_d[~st_.sent] == -1).all()
    if d < last:
        assert st_.sent.sum() >= q
    assert d <= max(opening + r.span, opening) or d == last


def test_fewer_rounds_draw_the_same_first_delays():
    r = rules(delays=(0, 3, 7))
    assert np.array_equal(rd.draw_delays(9, 5, r), rd.draw_delays(9, 40, r)[:5])


def test_the_array_send_ranges_are_the_scalar_ones():
    rng = np.random.default_rng(0)
    openings = rng.integers(0, 500, size=(40, 7))
    delays = rng.integers(0, 30, size=7)
    for grace, last in ((0, 520), (12, 520), (12, 300)):
        lo, hi = rd.send_ranges(openings, delays, grace, last)
        want = [
            [rd.send_range(int(o), int(dl), grace, last) for o, dl in zip(row, delays, strict=True)]
            for row in openings
        ]
        assert np.array_equal(np.stack([lo, hi], axis=-1), np.array(want))
