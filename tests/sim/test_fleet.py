"""The fleet model's formulas (diloco_gym/sim/fleet.py); its file reader is tested in
test_fleet_toml.py."""

from __future__ import annotations

import pytest

from diloco_gym.sim import fleet as fl
from diloco_gym.sim.sidecar import SidecarParams


def test_ring_allreduce_alpha_beta():
    # 4 sites, 4.4 GB, 10 Gbit/s, 50 ms: 2*3/4 * 4.4e9*8/1e10 + 2*3*0.05
    t = fl.ring_allreduce_seconds(4.4e9, 4, 10.0, 0.05)
    assert t == pytest.approx(1.5 * 3.52 + 0.3)
    assert fl.ring_allreduce_seconds(4.4e9, 1, 10.0, 0.05) == 0.0
    # doubling the payload doubles the bandwidth term only
    assert fl.ring_allreduce_seconds(8.8e9, 4, 10.0, 0.0) == pytest.approx(2 * 1.5 * 3.52)


def test_payload_bytes():
    assert fl.payload_bytes(1e9, 32) == 4e9
    assert fl.payload_bytes(1e9, 4, fragments=8) == 1e9 * 4 / 8 / 8


@pytest.mark.parametrize("f", [1, 2, 3, 4, 8, 16])
def test_fragment_corridor_keeps_every_fragment_inside(f):
    h_min, h_max = 16, 64
    if -(-h_min // f) > h_max // f:
        with pytest.raises(fl.FleetConfigError, match="empty gap range"):
            fl.fragment_corridor(h_min, h_max, f)
        return
    lo, hi = fl.fragment_corridor(h_min, h_max, f)
    # a fragment's own gap is the sum of F consecutive gaps in [lo, hi]
    assert f * lo >= h_min and f * hi <= h_max
    assert lo >= 1 and lo <= hi


def test_fragment_corridor_empty_is_an_error():
    with pytest.raises(fl.FleetConfigError, match="fragments=80"):
        fl.fragment_corridor(16, 64, 80)


def test_sync_plan_full_and_streamed():
    sc = [SidecarParams()] * 4
    full = fl.sync_plan(fl.FleetParams(), sc, 0.14)
    assert full.link_share == 1.0 and full.slowdowns == (0.5,) * 4
    assert full.window_s == pytest.approx(0.5 + 1.5 + 1.5 * 3.52 + 0.3)
    st = fl.sync_plan(fl.FleetParams(mode="streamed", fragments=8, bits=4), sc, 0.14)
    assert st.window_s == pytest.approx(32 * 0.14)
    coll = fl.ring_allreduce_seconds(1.1e9 * 4 / 8 / 8, 4, 10.0, 0.05)
    assert st.collective_s == pytest.approx(coll)
    assert st.link_share == pytest.approx(coll / (32 * 0.14 - 0.5 - 1.5 / 8))
    # documented interference: base * (host_share + (1 - host_share) * share ** gamma)
    assert st.slowdowns[0] == pytest.approx(0.5 * (0.25 + 0.75 * st.link_share))


def test_merge_seconds_given_directly():
    one = fl.FleetParams(sites=(fl.SiteConfig(),), merge_seconds=8.0)
    assert fl.sync_plan(one, [SidecarParams()], 0.14).window_s == 8.0
    frag = fl.FleetParams(sites=(fl.SiteConfig(),), merge_seconds=8.0, fragments=2, bits=16)
    window = fl.sync_plan(frag, [SidecarParams()], 0.14).window_s
    assert window == pytest.approx(0.5 + 7.5 * 0.5 / 2)


def test_progress_factor():
    assert fl.progress_factor(32, 0.01) == 1.0
    assert fl.progress_factor(4, 0.01) == pytest.approx(1 - 0.03)
    assert fl.progress_factor(8, 0.05) == pytest.approx(1 - 0.1)


def test_interference_is_monotone_in_share():
    vals = [fl.sync_slowdown(0.5, u, 0.25, 1.0) for u in (0.1, 0.5, 0.9, 1.0)]
    assert vals == sorted(vals) and vals[-1] == 0.5 and vals[0] > 0


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"bits": 12}, "bits must be one of"),
        ({"fragments": 0}, "fragments must be an integer >= 1"),
        ({"mode": "fast"}, "mode must be one of"),
        ({"host_share": 2.0}, "host_share must be in"),
        ({"quant_penalty": 0.5}, "would credit no progress"),
        ({"sites": ()}, "at least one site"),
        ({"merge_seconds": 0.1}, "must be >= fixed_s"),
    ],
)
def test_fleet_params_errors(kw, msg):
    with pytest.raises(fl.FleetConfigError, match=msg):
        fl.FleetParams(**kw)


def test_site_errors():
    with pytest.raises(fl.FleetConfigError, match="exactly one of 'regime' and 'trace'"):
        fl.SiteConfig(regime=None)
    with pytest.raises(fl.FleetConfigError, match="link_gbps"):
        fl.SiteConfig(link_gbps=0.0)
    with pytest.raises(fl.FleetConfigError, match="unknown sidecar key 'slot'"):
        fl.SiteConfig(sidecar=(("slot", 1.0),))
    with pytest.raises(fl.FleetConfigError, match="apply to a trace site only"):
        fl.SiteConfig(start_s=5.0)


def test_fleet_sites_are_counted_before_anything_is_built(monkeypatch):
    """A fleet's sites are within DILOCO_GYM_MAX_FLEET_SITES, in FleetParams too (each site
    holds its own episode, about 2 MB: 10,000 sites exhausted memory)."""
    from diloco_gym.sim.fleet import FleetConfigError, FleetParams, SiteConfig
    from diloco_gym.sim.fleet_toml import fleet_from_dict

    monkeypatch.setenv("DILOCO_GYM_MAX_FLEET_SITES", "2")
    sites = tuple(SiteConfig(name=f"s{i}", regime="bursty") for i in range(3))
    with pytest.raises(FleetConfigError, match=r"sites: 3 is above the limit of 2 sites"):
        FleetParams(sites=sites)
    assert len(FleetParams(sites=sites[:2]).sites) == 2
    tables = {"site": [{"name": f"s{i}", "regime": "bursty"} for i in range(3)]}
    with pytest.raises(FleetConfigError, match=r"^f\.toml: \[\[site\]\] tables: 3 is above"):
        fleet_from_dict(tables, where="f.toml")
