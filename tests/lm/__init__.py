"""Tests of :mod:`diloco_gym.lm` (a package, so that its test modules may share names with
those of other layers, e.g. ``test_cli`` and ``test_trainer``)."""
