"""The agent registry (agents/registry.py): names, errors, deployability."""

from __future__ import annotations

import pytest

from diloco_gym.agents.registry import HEURISTICS, make_agent


def test_unknown_agent_lists_valid_names():
    with pytest.raises(ValueError, match="valid agents: no-sync, fixed-256"):
        make_agent("wa-dilocco")


def test_only_the_oracle_is_non_deployable():
    assert [n for n in HEURISTICS if not make_agent(n).deployable] == ["offline-oracle"]
