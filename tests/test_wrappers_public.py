"""``diloco_gym.wrappers``: the public home of the protocol's wrappers (the classes
themselves are tested in tests/eval/test_matched_score.py and tests/eval/test_protocol.py)."""

from __future__ import annotations

import diloco_gym.wrappers as wrappers
from diloco_gym.eval import matched_score, protocol


def test_the_wrappers_are_the_protocols_own():
    assert wrappers.MatchedRandomScore is matched_score.MatchedRandomScore
    assert wrappers.MatchedRandomDeferral is protocol.MatchedRandomDeferral
    assert wrappers.SCORE_KEY == "matched_random_score"
    assert set(wrappers.__all__) == {
        "MatchedRandomScore",
        "MatchedRandomDeferral",
        "SCORE_KEY",
        "SCORE_FIELDS",
    }
