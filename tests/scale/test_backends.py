"""diloco_gym/scale/backends.py: the old name of :mod:`diloco_gym.backends` re-exports every
public name of it (the same objects) for one release. The backends' behaviour:
tests/test_backends.py."""

from __future__ import annotations

import diloco_gym.backends as backends
from diloco_gym.scale import backends as old


def test_every_public_name_is_the_same_object():
    for name in backends.__all__:
        assert getattr(old, name) is getattr(backends, name), name


def test_cells_run_through_the_old_name():
    assert old.run_cells(abs, [-2, 3]) == [2, 3]
