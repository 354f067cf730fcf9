"""The link process of changing links (diloco_gym/sim/fleet_links.py): its checks, its
draws and the fleet of one link state."""

from __future__ import annotations

import math

import numpy as np
import pytest

from diloco_gym.sim.fleet import FleetConfigError, FleetParams, SiteConfig
from diloco_gym.sim.fleet_links import (
    check_link_levels,
    link_states,
    with_link_levels,
)
from diloco_gym.sim.fleet_toml import fleet_from_dict


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"link_levels": [1.5]}, "link_levels must be shares"),
        ({"link_levels": [1.0, 0.0]}, "link_levels must be shares"),
        ({"link_levels": [1.0, 1.0]}, "link_levels must be distinct"),
        ({"link_levels": []}, "link_levels must be a non-empty list"),
        ({"link_levels": [1.0, 0.5], "link_probs": [0.5]}, "one probability per level"),
        ({"link_levels": [1.0, 0.5], "link_probs": [0.5, 0.6]}, "summing to 1"),
        ({"link_levels": [1.0, 0.5], "link_dwell_s": 0.0}, "link_dwell_s must be a positive"),
        ({"link_dwell_s": 30.0}, "link_dwell_s applies only with link_levels"),
        ({"link_probs": [1.0]}, "link_probs applies only with link_levels"),
        ({"link_levels": [1.0, 0.5], "merge_seconds": 8.0}, "merge_seconds fixes the sync window"),
    ],
)
def test_bad_link_keys_are_one_line_errors(kw, msg):
    with pytest.raises(FleetConfigError, match=msg) as exc:
        FleetParams(**kw)
    assert "\n" not in str(exc.value)


def test_lists_are_stored_as_tuples_and_the_file_names_itself():
    f = FleetParams(link_levels=[1.0, 0.5], link_probs=[0.75, 0.25])
    assert f.link_levels == (1.0, 0.5) and f.link_probs == (0.75, 0.25)
    assert hash(f)  # a FleetParams stays hashable
    fl, _ = fleet_from_dict({"fleet": {"link_levels": [1.0, 0.5], "link_dwell_s": 30}})
    assert fl.link_levels == (1.0, 0.5) and fl.link_dwell_s == 30.0
    with pytest.raises(
        FleetConfigError, match=r"x.toml: \[fleet\] key 'link_levels' must be a list"
    ):
        fleet_from_dict({"fleet": {"link_levels": 0.5}}, where="x.toml")
    with pytest.raises(FleetConfigError, match=r"x.toml: \[fleet\].*link_levels must be shares"):
        fleet_from_dict({"fleet": {"link_levels": [2.0]}}, where="x.toml")
    assert check_link_levels(None, None, 60.0) is None


def test_the_same_seed_gives_the_same_states_and_seeds_differ():
    p = np.array([0.5, 0.3, 0.2])
    a = link_states(7, 300, 4, p, 0.9)
    assert a.shape == (300, 4) and a.dtype == np.int64
    assert np.array_equal(a, link_states(7, 300, 4, p, 0.9))
    assert not np.array_equal(a, link_states(8, 300, 4, p, 0.9))
    assert link_states(7, 0, 4, p, 0.9).shape == (0, 4)


def test_the_chain_keeps_its_stationary_law_and_its_dwell():
    p = np.array([0.6, 0.25, 0.15])
    stay = math.exp(-1.0 / 20.0)  # a level holds 20 decisions before a draw, on average
    st = link_states(3, 200_000, 2, p, stay)
    freq = np.bincount(st.ravel(), minlength=3) / st.size
    assert np.allclose(freq, p, atol=0.02), freq
    # a draw happens with probability 1 - stay and keeps the level with probability p_l,
    # so a run of level l lasts 1 / ((1 - stay) * (1 - p_l)) decisions on average
    col = st[:, 0]
    change = np.flatnonzero(col[1:] != col[:-1]) + 1
    runs = np.diff(np.concatenate([[0], change, [col.size]]))
    first = col[np.concatenate([[0], change])]
    for lvl in range(3):
        want = 1.0 / ((1.0 - stay) * (1.0 - p[lvl]))
        got = runs[first == lvl].mean()
        assert abs(got - want) / want < 0.1, (lvl, got, want)


def test_stay_one_holds_the_first_draw_and_stay_zero_draws_afresh():
    p = np.array([0.5, 0.5])
    held = link_states(1, 50, 3, p, 1.0)
    assert np.all(held == held[0])
    fresh = link_states(1, 20_000, 1, p, 0.0)[:, 0]
    same = np.mean(fresh[1:] == fresh[:-1])
    assert abs(same - 0.5) < 0.02


def test_with_link_levels_scales_each_site_and_drops_the_process():
    f = FleetParams(
        sites=(SiteConfig(name="a", link_gbps=10.0), SiteConfig(name="b", link_gbps=2.5)),
        link_levels=(1.0, 0.5),
        link_dwell_s=30.0,
    )
    g = with_link_levels(f, (0.5, 1.0))
    assert [s.link_gbps for s in g.sites] == [5.0, 2.5]
    assert g.link_levels is None and g.link_probs is None and g.link_dwell_s is None
    assert g.sites[1] is f.sites[1]


def _trace(tmp_path, text: str, name: str = "l.csv") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize(
    ("text", "msg"),
    [
        ("t,share\n0,1\n60,1\n", "the header must be 'time_s,share'"),
        ("time_s,share\n0,1\n", "needs at least two rows"),
        ("time_s,share\n5,1\n60,1\n", "row 2: time_s must start at 0"),
        ("time_s,share\n0,1\n30,0.5\n30,1\n", "row 4: time_s must start at 0 and increase"),
        ("time_s,share\n0,1\n30,0\n", r"row 3: share must be in \(0, 1\]"),
        ("time_s,share\n0,1\n30,1.5\n", r"row 3: share must be in \(0, 1\]"),
        ("time_s,share\n0,1\n30,x\n", "row 3 is not two numbers"),
        ("time_s,share\n0,1\n30\n", "row 3 must have 2 columns"),
    ],
)
def test_a_bad_link_trace_is_a_one_line_error_naming_file_site_and_row(tmp_path, text, msg):
    from diloco_gym.sim.fleet_links import load_link_trace

    path = _trace(tmp_path, text)
    with pytest.raises(ValueError, match=msg) as exc:
        load_link_trace(path, "eu")
    assert str(exc.value).startswith(f"{path}: link_trace of site 'eu'")
    assert "\n" not in str(exc.value)
    with pytest.raises(ValueError, match="cannot be read"):
        load_link_trace(str(tmp_path / "missing.csv"), "eu")


def test_a_link_trace_is_a_step_function_of_time(tmp_path):
    from diloco_gym.sim.fleet_links import load_link_trace

    t = load_link_trace(_trace(tmp_path, "time_s,share\n0,1\n30,0.5\n90,0.8\n120,1\n"), "eu")
    assert t.length_s == 120.0
    got = t.at(np.array([0.0, 29.9, 30.0, 89.0, 90.0, 119.0])).tolist()
    assert got == [1.0, 1.0, 0.5, 0.5, 0.8, 0.8]


def test_a_link_trace_is_refused_beside_a_link_process_or_a_fixed_window(tmp_path):
    site = SiteConfig(name="eu", link_trace="x.csv")
    with pytest.raises(FleetConfigError, match="give link_levels .* or a site's link_trace"):
        FleetParams(sites=(site,), link_levels=(1.0, 0.5))
    with pytest.raises(FleetConfigError, match="link_trace needs syncs timed by payload"):
        FleetParams(sites=(site,), merge_seconds=8.0)
    # a fleet file resolves the path against its own folder
    fleet, _ = fleet_from_dict(
        {"site": [{"name": "eu", "regime": "bursty", "link_trace": "l.csv"}]},
        base_dir=tmp_path,
    )
    assert fleet.sites[0].link_trace == str(tmp_path / "l.csv")


def test_a_link_trace_over_the_size_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from diloco_gym.sim.fleet_links import load_link_trace
    from diloco_gym.sim.limits import LimitError

    path = _trace(tmp_path, "time_s,share\n0,1\n60,1\n")
    monkeypatch.setenv("DILOCO_GYM_MAX_SETTINGS_BYTES", "10")
    with pytest.raises(LimitError, match="link_trace of site 'eu': size in bytes"):
        load_link_trace(path, "eu")
