"""Every command's ``--help`` states an option's default at most once: the help formatter
prints it, and no option's help shows ``(default`` twice (or for a ``None`` default)."""

from __future__ import annotations

import argparse
import re

import pytest

from diloco_gym.cli import build_parser


def _sub_parsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser(None)  # every command with all its options
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _option_helps(p: argparse.ArgumentParser) -> dict[str, str]:
    """Each option's help as ``format_help()`` prints it, on one line."""
    formatter = p._get_formatter()
    return {
        "/".join(a.option_strings) or a.dest: " ".join(formatter._expand_help(a).split())
        for a in p._actions
        if a.help and a.help is not argparse.SUPPRESS
    }


def test_every_command_is_walked():
    assert set(_sub_parsers()) >= {
        "run",
        "report",
        "frontier",
        "sweep",
        "tune",
        "train",
        "calibrate",
        "calibrate-learners",
    }


@pytest.mark.parametrize("name", sorted(_sub_parsers()))
def test_no_option_states_its_default_twice(name):
    p = _sub_parsers()[name]
    text = p.format_help()
    assert text.strip(), name
    doubled = {k: h for k, h in _option_helps(p).items() if len(re.findall(r"\(default", h)) > 1}
    assert not doubled, f"{name}: options whose help states the default twice: {doubled}"
    none_shown = [k for k, h in _option_helps(p).items() if "(default: None)" in h]
    assert not none_shown, f"{name}: options printing '(default: None)': {none_shown}"
    assert "(default: None)" not in " ".join(text.split())
