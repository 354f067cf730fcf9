"""Checks shared by the tests of the heuristics written for one fleet option
(agents/fleet_cap.py, agents/fleet_links.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diloco_gym.eval.fleet import FleetReportConfig
from diloco_gym.eval.report import run_protocol


def recording(cls: type) -> type:
    """A subclass of the agent class ``cls`` that keeps each observation and mask it
    decided on, and its action, in ``seen``."""

    class Recorder(cls):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[tuple[np.ndarray, np.ndarray, int]] = []

        def act(self, obs):
            assert self._ctx is not None
            out = super().act(obs)
            self.seen.append((np.array(obs, copy=True), self._ctx.action_mask(), int(out[0])))
            return out

    return Recorder


def sealed_rows_match_in_process(fleet: str, agent: str) -> pd.DataFrame:
    """Run ``agent`` sealed in its worker process (the report's default) and in process on
    two episodes of ``fleet``: the rows must be equal. Returns the in-process report."""
    kw = dict(fleet=fleet, agents=[agent], seeds=2, draws=20)
    sealed = run_protocol(FleetReportConfig(**kw))
    inproc = run_protocol(FleetReportConfig(**kw, in_process_agents=True))
    assert sealed["agent_sealing"].startswith("sealed")
    pd.testing.assert_frame_equal(sealed["rows"], inproc["rows"])
    return inproc
