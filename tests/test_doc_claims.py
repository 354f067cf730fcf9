"""Statements of the documentation that the code decides: each is read from the page and
checked against what the code does."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _reward_formulas() -> dict[str, str]:
    """The reward formula as README.md, docs/model.md and the env's docstring write it."""
    from diloco_gym.envs.env import DiLoCoSyncEnv

    readme = (ROOT / "README.md").read_text()
    model = (ROOT / "docs" / "model.md").read_text()
    found = {
        "README.md": re.search(r"\*\*Reward\*\*: `([^`]+)`", readme),
        "docs/model.md": re.search(r"^ {4}reward = (.+)$", model, flags=re.M),
        "DiLoCoSyncEnv": re.search(r"``reward = ([^`]+)``", DiLoCoSyncEnv.__doc__ or ""),
    }
    assert all(found.values()), found
    return {k: " ".join(m.group(1).split()) for k, m in found.items() if m}


def test_the_reward_formula_is_the_same_everywhere_and_is_the_codes():
    """One formula in the README, docs/model.md and the env's docstring, and the env's
    rewards are that formula of its ``info["reward_terms"]``, with ``sync_excess <= 0``."""
    import gymnasium as gym

    import diloco_gym  # noqa: F401

    formulas = _reward_formulas()
    assert len(set(formulas.values())) == 1, formulas
    assert formulas["docs/model.md"] == (
        "excess_weight * (sync_excess + shaping) + progress_weight * progress"
    )
    env = gym.make("DiLoCoSync-v2", excess_weight=2.0, progress_weight=3.0)
    env.reset(seed=0)
    seen_cost = False
    for _ in range(200):
        mask = env.unwrapped.action_masks()
        _, reward, terminated, truncated, info = env.step(1 if mask[1] else 0)
        terms = info["reward_terms"]
        assert terms["sync_excess"] <= 0.0
        seen_cost |= terms["sync_excess"] < 0.0
        want = 2.0 * (terms["sync_excess"] + terms["shaping"]) + 3.0 * terms["progress"]
        assert np.isclose(reward, want, rtol=1e-12, atol=1e-12), (reward, terms)
        if terminated or truncated:
            break
    assert seen_cost  # a merge cost something, so the sign was checked


# --------------------------------------------------------------- report.md's oracle note
def _rows(oracle: list[float], lower: list[float], kinds: list[str]):
    import pandas as pd

    from diloco_gym.eval import protocol

    n = len(oracle)
    return pd.DataFrame(
        {
            "regime": ["bursty"] * n,
            "oracle_same_budget_pct": oracle,
            "oracle_lower_bound_pct": lower,
            "oracle_schedule": kinds,
            "scoring": [protocol.SCORING_PROVEN] * n,
            "additive_exact_gap_pp": [0.0] * n,
        }
    )


def test_the_oracle_note_says_what_the_certified_bounds_prove():
    """report.md's note on the oracle follows the rows: a local-search oracle that its
    certified lower bound meets is optimal (never "no certified lower bound"), and one it
    does not meet is bracketed by the largest gap."""
    from diloco_gym.eval import protocol
    from diloco_gym.eval.report_render import _oracle_note, _regime_scoring
    from diloco_gym.eval.summary import scoring_summary

    bound, exact = protocol.ORACLE_BOUND, protocol.ORACLE_EXACT
    met = _rows([1.0, 2.0, 3.0], [1.0, 2.0 - 1e-12, 3.0], [bound, bound, exact])
    note = _oracle_note(scoring_summary(met))
    assert "no certified" not in note
    assert "(2 of 3 agent-episodes)" in note
    assert "meets the local search's value in all 2, so every oracle here is optimal" in note
    assert "oracle: exact optimum in every episode." in _regime_scoring({"rows": met}, "bursty")

    open_ = _rows([1.0, 2.5, 3.0, 4.0], [1.0, 2.0, 3.0, float("nan")], [bound] * 3 + [exact])
    note = _oracle_note(scoring_summary(open_))
    assert "meets the local search's value in 2 of 3 (those oracles are optimal)" in note
    assert "in the other 1 the exact optimum lies between the bound and the oracle" in note
    assert "at most 0.5 pp apart" in note
    assert "oracle: upper bound in 1 of 4 agent-episodes." in _regime_scoring(
        {"rows": open_}, "bursty"
    )

    none = _rows([1.0], [1.0], [exact])
    assert "no episode needed it here" in _oracle_note(scoring_summary(none))


def test_the_frontier_labels_the_local_search_oracle_as_such():
    """frontier.md's scoring sentence: the local-search oracle is never called the "exact
    replay of the additive optimum"; one its certified lower bound meets is the exact
    optimum; an enumerated oracle is exact; an open one is an upper bound with its gap."""
    from diloco_gym.eval import protocol
    from diloco_gym.eval.frontier_render import _scoring_sentence
    from diloco_gym.eval.oracle import ORACLE_ENUMERATED

    bound, exact = protocol.ORACLE_BOUND, protocol.ORACLE_EXACT
    met = _rows([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [bound, ORACLE_ENUMERATED, exact])
    text = _scoring_sentence(met, "bursty")
    assert "exact replay of the additive optimum" not in text
    assert "the oracle is the exact optimum in every agent-episode (in 1 the best" in text
    assert "proven optimal by the certified lower bound" in text
    open_ = _rows([1.0, 2.25, 3.0], [1.0, 2.0, 3.0], [bound, bound, exact])
    text = _scoring_sentence(open_, "bursty")
    assert "exact replay of the additive optimum" not in text
    assert "(the best schedule of an exact local search from the additive optimum)" in text
    assert "in 1 of 3 agent-episodes, at most 0.25 pp above the certified lower bound" in text


def test_every_trace_file_the_readme_names_says_where_it_comes_from():
    """A trace file named in the README's commands is shipped (traces/, tests/fixtures/) or
    the README says where to get it (the Azure trace: Azure/AzurePublicDataset)."""
    readme = (ROOT / "README.md").read_text()
    named = set(re.findall(r"--trace ([\w./-]+\.\w+)", readme))
    assert named  # the scan sees the commands
    sources = {"AzureLLMInferenceTrace_code.csv": "github.com/Azure/AzurePublicDataset"}
    for name in named:
        if (ROOT / name).is_file():
            continue
        assert name in sources, f"README.md names the trace {name} without saying where it is"
        at = readme.index(f"`{name}` is ")
        assert sources[name] in readme[at : at + 400], name
