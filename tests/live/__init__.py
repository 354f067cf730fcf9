"""Tests of :mod:`diloco_gym.live` (a package, so that its test modules may share names
with those of other layers, e.g. ``test_cli``)."""
