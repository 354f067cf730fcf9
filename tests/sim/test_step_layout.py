"""The compiled step's array layout matches the kernel's state and episode constants."""

from __future__ import annotations

import subprocess
import sys

from diloco_gym.envs import kernel
from diloco_gym.sim import step_layout as layout


def test_state_and_batch_fields_are_the_rows_of_the_layout():
    state = kernel.new_state(3)
    ints, floats = kernel.state_arrays(state)
    for k, name in enumerate(layout.STATE_INT):
        assert getattr(state, name).base is ints and getattr(state, name) is not None
        ints[k, 1] = 10 + k
        assert getattr(state, name)[1] == 10 + k
    for k, name in enumerate(layout.STATE_FLOAT):
        floats[k, 2] = 0.5 + k
        assert getattr(state, name)[2] == 0.5 + k
    batch = kernel.new_batch(3, 4)
    bi, bf = kernel.batch_arrays(batch)
    for k, name in enumerate(layout.BATCH_INT):
        bi[k, 0] = 7 + k
        assert getattr(batch, name)[0] == 7 + k
    for k, name in enumerate(layout.BATCH_FLOAT):
        bf[k, 0] = 1.25 + k
        assert getattr(batch, name)[0] == 1.25 + k
    assert set(layout.STATE_INT + layout.STATE_FLOAT) == set(kernel.EnvState._fields)


def test_the_layout_imports_without_numba():
    code = "import sys, diloco_gym.sim.step_layout; assert 'numba' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
