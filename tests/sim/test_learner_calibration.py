"""The calibrated learner surrogate: its file (schema, duplicate keys, BOM), its agreement
with the env's learner model, the env mapping and the quality price."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from diloco_gym.envs.env import DiLoCoSyncEnv
from diloco_gym.sim import learners as lrn
from diloco_gym.sim.learner_calibration import (
    LearnerCalibration,
    LearnerCalibrationError,
    env_schedule_loss,
    env_schedule_losses,
    learner_params,
    load_learner_calibration,
    predict_final_loss,
    predict_losses,
    quality_cost,
)

CAL = LearnerCalibration(
    loss_floor=1.5,
    loss_scale=4.0,
    loss_exponent=0.6,
    work_scale_steps=6.0,
    drift_steps=12.0,
    merge_overhead_steps=0.5,
    fragment_penalty=0.2,
    quant_efficiency={16: 1.0, 8: 0.97, 4: 0.8},
)


def _doc(**params):
    p = CAL.to_dict() | params
    return {
        "format": "diloco-gym-learner-calibration/1",
        "params": p,
        "env_mapping": {"env_steps_per_inner_step": 32, "step_seconds": 0.14},
    }


def test_round_trip_through_a_file_with_bom(tmp_path):
    f = tmp_path / "cal.json"
    f.write_text(json.dumps(_doc()), encoding="utf-8-sig")
    cal = load_learner_calibration(f)
    assert cal == CAL
    assert load_learner_calibration(_doc()) == CAL
    assert load_learner_calibration(CAL) is CAL


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"format": "x", "format": "y"}', "duplicate key 'format'"),
        ("{not json", "not valid JSON"),
        (json.dumps(_doc(drift_steps=-1.0)), "field params.drift_steps"),
        (json.dumps(_doc(quant_efficiency={"3": 0.5})), "field params.quant_efficiency"),
        (json.dumps({"params": {}}), "'format' is a required property"),
        (json.dumps(_doc()).replace("1.5", "NaN", 1), "NaN is not a number"),
    ],
)
def test_bad_files_name_the_file_and_the_field(tmp_path, text, match):
    f = tmp_path / "bad.json"
    f.write_text(text, encoding="utf-8")
    with pytest.raises(LearnerCalibrationError, match=match) as info:
        load_learner_calibration(f)
    assert str(f) in str(info.value)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(LearnerCalibrationError, match="cannot read"):
        load_learner_calibration(tmp_path / "nope.json")


def test_f1_full_precision_is_the_env_learner_model():
    """The surrogate at F = 1, 32 bits, equals the env's merge_gain chain mapped to seconds."""
    base = lrn.LearnerParams(num_learners=4, throughput_tokens_per_s=1000.0)
    lp = learner_params(CAL, base)
    gaps_inner = np.array([4.0, 9.0, 16.0, 5.0, 7.0])
    sec = CAL.env_steps_per_inner_step * CAL.step_seconds
    tokens = 0.0
    rate = np.full(4, 1000.0)
    for g in gaps_inner:
        added, _ = lrn.merge_gain(g * sec, tokens, rate, lp)
        tokens += float(added)
    env_loss = float(lrn.loss(tokens, lp))
    assert predict_final_loss(np.cumsum(gaps_inner), CAL) == pytest.approx(env_loss, rel=1e-12)
    assert env_schedule_loss(np.cumsum(gaps_inner) * sec, CAL) == pytest.approx(env_loss)


def test_fragments_and_bits_cost_work():
    s = [4, 8, 12, 16, 20, 24, 28, 32]
    full = predict_final_loss(s, CAL)
    assert predict_final_loss(s, CAL, fragments=2) > full
    assert predict_final_loss(s, CAL, bits=4) > predict_final_loss(s, CAL, bits=8) > full
    # F fragments: merge m syncs fragment m mod F with the gap since that fragment's sync
    f2 = predict_losses([4, 8, 12], replace(CAL, fragment_penalty=0.0), fragments=2)
    w = np.cumsum([0.5 * g / (1 + g / 12.0 + 0.5 / g) for g in (4, 8, 8)])
    np.testing.assert_allclose(f2, 1.5 + 4.0 * (1 + w / 6.0) ** -0.6)
    with pytest.raises(ValueError, match="bits=2"):
        predict_final_loss(s, CAL, bits=2)


def test_quality_cost_is_zero_for_even_and_positive_for_irregular():
    even = [20.0, 40.0, 60.0, 80.0]
    assert quality_cost(even, CAL) == pytest.approx(0.0, abs=1e-12)
    assert quality_cost([10.0, 20.0, 70.0, 80.0], CAL) > 0
    assert quality_cost([], CAL) == 0.0


def test_env_schedule_losses_price_each_row_as_env_schedule_loss():
    """The batched form (a matched-random control's draws) equals the one-schedule form row
    by row, merge overhead included; no merge is the initial loss; a schedule that is not
    strictly increasing and positive is refused as by the one-schedule form."""
    rows = np.array([[20.0, 40.0, 60.0, 80.0], [10.0, 20.0, 70.0, 80.0], [1.0, 2.0, 3.0, 90.0]])
    got = env_schedule_losses(rows, CAL)
    want = [env_schedule_loss(r, CAL) for r in rows]
    np.testing.assert_allclose(got, want, rtol=1e-13)
    assert len(set(got.tolist())) == 3  # the rows' prices differ: the check can tell them apart
    np.testing.assert_allclose(
        env_schedule_losses(np.empty((2, 0)), CAL), env_schedule_loss([], CAL)
    )
    for bad in ([[0.0, 10.0]], [[10.0, 10.0]], [[10.0, np.nan]]):
        with pytest.raises(ValueError, match="strictly increasing and positive"):
            env_schedule_losses(np.array(bad), CAL)
    with pytest.raises(ValueError, match=r"\(K, M\) array"):
        env_schedule_losses(np.array([10.0, 20.0]), CAL)


def test_env_uses_the_calibrated_learner_model():
    env = DiLoCoSyncEnv(regime="bursty", learner_calibration=_doc())
    assert env.learner_params.drift_s == pytest.approx(CAL.drift_s)
    assert env.learner_params.loss_floor == CAL.loss_floor
    default = DiLoCoSyncEnv(regime="bursty")
    progress = []
    for e in (env, default):
        e.reset(seed=0)
        total = 0.0
        while True:
            _, _, term, trunc, info = e.step(1)
            total += info["reward_terms"]["progress"]
            if term or trunc:
                break
        progress.append(total)
    # the summed loss decrease of the episode is the calibrated curve's, not the default's
    assert progress[0] != pytest.approx(progress[1])
    assert 0 < progress[0] < CAL.loss_scale
    with pytest.raises(LearnerCalibrationError, match="field params.drift_steps"):
        DiLoCoSyncEnv(regime="bursty", learner_calibration=_doc(drift_steps="x"))


def test_the_shipped_calibration_loads_and_records_how_it_was_made():
    from importlib import resources

    from diloco_gym.lm.calibrate import check_disjoint

    path = resources.files("diloco_gym").joinpath("data/learner_calibration_default.json")
    cal = load_learner_calibration(str(path))
    doc = cal.document
    # made by the default configuration of calibrate-learners: runs that cover an episode
    trainer, meta = doc["meta"]["trainer"], doc["meta"]
    assert (trainer["d_model"], trainer["n_layers"], trainer["total_steps"]) == (128, 4, 160)
    assert trainer["num_learners"] == 4 and meta["parameters"] == 834_304
    assert meta["covers_episode"] is True and meta["episode_inner_steps"] <= 160
    assert "/" not in meta["command"]  # no machine path recorded
    assert meta["command"].startswith("diloco-gym calibrate-learners")
    assert meta["fit_seeds"] == list(range(7)) and meta["heldout_seeds"] == [7, 8, 9]
    runs = doc["runs"]
    assert {r["role"] for r in runs} == {"fit", "heldout", "mapping"}
    # every schedule with every seed (common random numbers), held-out gaps never fitted
    by_name: dict[str, set] = {}
    for r in runs:
        by_name.setdefault(r["name"], set()).add(r["seed"])
    assert all(seeds == set(range(10)) for seeds in by_name.values())
    check_disjoint([r for r in runs if r["seed"] == 0 and r["role"] != "mapping"])
    v = doc["validation"]
    assert v["seeds"] == [7, 8, 9] and v["schedules"] >= 5 and 0 < v["spearman_p"] <= 1
    assert v["mae_interval"][0] <= v["mae"] <= v["mae_interval"][1]
    effect = doc["effects"]
    assert effect["contrast"]["n"] == 10 and effect["power"]["verdict"].startswith("detected")
    assert len(effect["mapping_check"]) == 2
    for name in ("drift_steps", "merge_overhead_steps", "fragment_penalty", "loss_exponent"):
        lo, hi = doc["intervals"][name]
        assert np.isfinite([lo, hi]).all() and lo <= hi, name
    env = DiLoCoSyncEnv(regime="bursty", learner_calibration=str(path))
    assert env.learner_params.drift_s == pytest.approx(cal.drift_s)
