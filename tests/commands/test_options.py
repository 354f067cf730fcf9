"""The shared options (:mod:`diloco_gym.commands.options`): ``positive_int`` at its
boundaries, the option groups each helper adds (names, defaults, the exclusive load
options), and what ``replay_options`` takes from the command line."""

from __future__ import annotations

import argparse

import pytest

from diloco_gym.commands import options


def _parser(*adders) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="t", exit_on_error=False)
    for add in adders:
        add(p)
    return p


@pytest.mark.parametrize("minimum", [0, 1, 2])
def test_positive_int_accepts_the_minimum_and_above(minimum):
    parse = options.positive_int(minimum)
    assert parse(str(minimum)) == minimum
    assert parse(str(minimum + 1)) == minimum + 1
    assert parse(f" {minimum + 7} ") == minimum + 7  # int() strips blanks
    assert parse.__name__ == f"integer >= {minimum}"


@pytest.mark.parametrize("minimum", [0, 1, 2])
def test_positive_int_refuses_one_below_the_minimum(minimum):
    with pytest.raises(
        argparse.ArgumentTypeError, match=rf"^must be >= {minimum}, got {minimum - 1}$"
    ):
        options.positive_int(minimum)(str(minimum - 1))


@pytest.mark.parametrize("text", ["two", "1.5", "", "1e3", "0x10"])
def test_positive_int_refuses_what_is_not_an_integer(text):
    with pytest.raises(argparse.ArgumentTypeError) as err:
        options.positive_int(1)(text)
    assert str(err.value) == f"not an integer: {text!r}"


def test_trace_args_defaults_and_names():
    args = _parser(options.add_trace_args).parse_args([])
    assert (args.trace, args.trace_format, args.window_s, args.stride_s) == (
        None,
        "auto",
        600.0,
        None,
    )
    assert (args.sidecar, args.rate_scale, args.target_utilization) == (None, None, None)
    args = _parser(options.add_trace_args).parse_args(
        ["--trace", "t.csv", "--format", "azure", "--window-s", "30", "--rate-scale", "2"]
    )
    assert (args.trace, args.trace_format, args.window_s, args.rate_scale) == (
        "t.csv",
        "azure",
        30.0,
        2.0,
    )


def test_rate_scale_and_target_utilization_exclude_each_other():
    p = _parser(options.add_trace_args)
    with pytest.raises(argparse.ArgumentError, match="not allowed with argument"):
        p.parse_args(["--rate-scale", "2", "--target-utilization", "0.5"])
    with pytest.raises(argparse.ArgumentError, match="invalid choice: 'csv'"):
        p.parse_args(["--format", "csv"])


def test_backend_args():
    p = _parser(options.add_backend_args)
    args = p.parse_args([])
    assert (args.backend, args.jobs, args.ray_address) == ("serial", None, None)
    assert p.parse_args(["--jobs", "1", "--backend", "ray"]).jobs == 1
    with pytest.raises(argparse.ArgumentError, match="must be >= 1, got 0"):
        p.parse_args(["--jobs", "0"])
    with pytest.raises(argparse.ArgumentError, match="invalid choice: 'gpu'"):
        p.parse_args(["--backend", "gpu"])


def test_seed0_accepts_zero_and_refuses_negatives():
    p = _parser(options.add_seed0_arg)
    assert p.parse_args([]).seed0 == 0
    assert p.parse_args(["--seed0", "0"]).seed0 == 0
    assert p.parse_args(["--seed0", "1000000"]).seed0 == 10**6
    with pytest.raises(argparse.ArgumentError, match="must be >= 0, got -1"):
        p.parse_args(["--seed0", "-1"])
    (action,) = [a for a in p._actions if a.dest == "seed0"]
    assert "%(default)s" not in action.help and "SEED0 .. SEED0+SEEDS-1" in action.help


def test_flag_and_file_options_default_off():
    p = _parser(
        options.add_calibration_arg,
        options.add_trust_arg,
        options.add_sealing_arg,
        options.add_fleet_arg,
        options.add_learner_calibration_arg,
        lambda q: options.add_holm_arg(q, "regime"),
    )
    args = p.parse_args([])
    assert args.calibration is None and args.fleet is None and args.learner_calibration is None
    assert not args.trust_model_file and not args.in_process_agents
    assert not args.holm_across_settings
    on = p.parse_args(
        ["--trust-model-file", "--in-process-agents", "--holm-across-settings", "--fleet", "f"]
    )
    assert on.trust_model_file and on.in_process_agents and on.holm_across_settings
    assert on.fleet == "f"
    (holm,) = [a for a in p._actions if a.dest == "holm_across_settings"]
    assert "across every regime at once" in holm.help


def test_fleet_help_names_the_files_model_version():
    """``--fleet``'s help says the file picks the fleet model (0 by default, 1 with
    ``model_version = 1``), not that every fleet file runs DiLoCoFleet-v0."""
    p = _parser(options.add_fleet_arg)
    (fleet,) = [a for a in p._actions if a.dest == "fleet"]
    assert "model_version = 1" in fleet.help and "DiLoCoFleet-v1" in fleet.help
    assert "0 by default" in fleet.help
    p.format_help()  # the help text formats (no stray % in it)


def test_replay_options_with_and_without_the_stride():
    p = _parser(options.add_trace_args)
    args = p.parse_args(["--trace", "t.csv", "--stride-s", "100", "--target-utilization", "0.7"])
    assert options.replay_options(args) == {
        "trace": "t.csv",
        "trace_format": "auto",
        "window_s": 600.0,
        "sidecar": None,
        "rate_scale": None,
        "target_utilization": 0.7,
        "stride_s": 100.0,
    }
    assert "stride_s" not in options.replay_options(args, stride=False)


def test_backend_kwargs_are_the_backend_options_as_given():
    import argparse

    from diloco_gym.commands.options import add_backend_args, backend_kwargs

    p = argparse.ArgumentParser()
    add_backend_args(p)
    args = p.parse_args(["--backend", "processes", "--jobs", "2"])
    assert backend_kwargs(args) == {"backend": "processes", "jobs": 2, "ray_address": None}
    assert backend_kwargs(p.parse_args([]))["backend"] == "serial"
