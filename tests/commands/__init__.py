"""The command tests are a package so that their module names (``test_report``, ...) do not
clash with those of other layers, e.g. ``tests/eval/test_report.py``."""
