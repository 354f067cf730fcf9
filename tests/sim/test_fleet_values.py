"""Fleet files' values that used to be accepted, or to fail later without the file named:
a site name with a newline went unescaped into report.md, an unknown ``[env]`` key was a
``TypeError`` when the env was built, huge or non-finite numbers ended in an
``OverflowError``, and a value that broke the assembled fleet (a sync that does not fit the
corridor) named no file. Each is now one line naming the file (and the table or site)."""

from __future__ import annotations

from importlib import resources

import pytest

from diloco_gym.envs.fleet import DiLoCoFleetEnv
from diloco_gym.sim import fleet as fl
from diloco_gym.sim.fleet import FleetConfigError
from diloco_gym.sim.fleet_toml import load_fleet_toml

BIG = "1" + "0" * 400
SITES = '[[site]]\nname = "a"\nregime = "bursty"\n[[site]]\nname = "b"\nregime = "bursty"\n'


def _fleet(tmp_path, text: str):
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    return path


def _refused(path, *fragments: str) -> str:
    with pytest.raises(FleetConfigError) as exc:
        DiLoCoFleetEnv(fleet=str(path))
    msg = str(exc.value)
    assert msg.startswith(f"{path}: "), msg
    assert "\n" not in msg and len(msg) < 600, msg
    for fragment in fragments:
        assert fragment in msg, msg
    return msg


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("a\\n# Verdict: agent wins", "printable"),
        ("tab\\there", "printable"),
        ("x" * 101, "at most 100"),
    ],
)
def test_a_site_name_must_be_printable(tmp_path, name, why):
    path = _fleet(tmp_path, SITES.replace('name = "b"', f'name = "{name}"'))
    with pytest.raises(FleetConfigError) as exc:
        load_fleet_toml(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}: [[site]] #2: site name ") and why in msg
    assert "\n" not in msg


def test_an_unknown_env_key_names_the_file(tmp_path):
    path = _fleet(tmp_path, "[env]\nbogus = 1\n" + SITES)
    match = rf"^{path}: \[env\] has unknown key\(s\) \['bogus'\]"
    with pytest.raises(FleetConfigError, match=match):
        DiLoCoFleetEnv(fleet=str(path))  # was a TypeError naming no file


def test_a_bad_env_value_names_the_file(tmp_path):
    path = _fleet(tmp_path, "[env]\nexcess_weight = 1e308\n" + SITES)
    with pytest.raises(FleetConfigError, match=rf"^{path}: \[env\] EnvParams\.excess_weight"):
        DiLoCoFleetEnv(fleet=str(path))


@pytest.mark.parametrize(
    ("table", "key", "value", "fragment"),
    [
        ("fleet", "model_params", "1e308", "model_params must be a finite number in [0, 1e+15]"),
        ("fleet", "model_params", BIG, "'model_params' must be a finite number"),
        ("fleet", "fixed_s", "1e308", "fixed_s must be a finite number in [0, 86400]"),
        ("fleet", "overhead_s", "inf", "'overhead_s' must be a finite number"),
        ("fleet", "share_exponent", "1e308", "share_exponent must be a finite number"),
        ("fleet", "worst_site_weight", BIG, "'worst_site_weight' must be a finite number"),
        ("fleet", "fragments", BIG, "fragments must be a finite number in [1, 1.04858e+06]"),
        ("site", "latency_ms", "1e308", "latency_ms must be a finite number in [0, 1e+06]"),
        ("site", "link_gbps", BIG, "'link_gbps' must be a finite number"),
        ("sidecar", "tail_s", "1e308", "SidecarParams.tail_s must be at most 3600"),
        ("sidecar", "slots", BIG, "'slots' must be a finite number"),
    ],
)
def test_a_huge_number_names_the_file_and_the_key(tmp_path, table, key, value, fragment):
    if table == "fleet":
        text = f"[fleet]\n{key} = {value}\n" + SITES
    elif table == "site":
        text = SITES + f"{key} = {value}\n"
    else:
        text = SITES + f"sidecar = {{ {key} = {value} }}\n"
    path = _fleet(tmp_path, text)
    with pytest.raises(FleetConfigError) as exc:
        load_fleet_toml(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}: ") and fragment in msg and "\n" not in msg, msg
    assert len(msg) < 600  # a 400-digit value is quoted short


def test_a_sync_that_does_not_fit_names_the_file(tmp_path):
    """A thin link makes the fragment sync longer than the corridor allows: found only
    when the fleet is assembled; the message now names the file."""
    path = _fleet(tmp_path, "[fleet]\nbits = 32\n" + SITES + "link_gbps = 0.01\n")
    _refused(path, "does not fit")


def test_a_valid_fleet_file_still_builds(tmp_path):
    env = DiLoCoFleetEnv(fleet=str(_fleet(tmp_path, "[env]\nh_min_steps = 128\n" + SITES)))
    assert [s.name for s in env.fleet.sites] == ["a", "b"]


def test_fleet_ranges_keep_the_documented_defaults():
    fl.FleetParams()  # the defaults
    load_fleet_toml(resources.files("diloco_gym").parent / "docs" / "examples" / "fleet.toml")


def test_a_huge_integer_over_a_limit_is_shown_short():
    from diloco_gym.sim.limits import LimitError, check_limit

    with pytest.raises(LimitError, match=r"10000000\.\.\. \(401 digits\) is above the limit"):
        check_limit("MERGE_BUDGET", int(BIG), "merge_budget")


def test_sites_of_different_decision_counts_are_refused_when_built(tmp_path):
    """A site's ``tail_s`` sets how much of the window its episode uses: unequal ones
    failed at the first reset ("fleet sites have different decision counts"), naming no
    file; now when the env is built."""
    path = _fleet(tmp_path, SITES + "sidecar = { tail_s = 0.0 }\n")
    _refused(path, "different decision counts", "'a': ", "'b': ", "tail_s")
