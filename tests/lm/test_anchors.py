"""The published H-effect anchors (diloco_gym/lm/anchors.py): the data's relative changes
recomputed by hand, our measured and surrogate H effects, the figure, and bad input."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diloco_gym.lm.anchors import (
    PUBLISHED,
    Series,
    measured_h_effect,
    plot_h_effect,
    relative_change,
    surrogate_h_effect,
)
from diloco_gym.sim.learner_calibration import load_learner_calibration, predict_final_loss

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "diloco_gym" / "data" / "learner_calibration_default.json"


def _by_h(key: str) -> dict[float, tuple[float, float, float]]:
    return {c.h: (c.change, c.low, c.high) for c in relative_change()[key]}


def test_khaled_nesterov_changes_recomputed_by_hand():
    """Khaled et al. 2025, appendix Table 3, Nesterov outer lr 0.7, 150M, M = 4: perplexity
    17.25 at H = 50 (the reference), 17.90 / 18.09 / 17.95 / 18.16 / 18.40 at H = 150 /
    250 / 500 / 1000 / 2000; loss = ln(perplexity)."""
    got = _by_h("khaled-2025-nesterov-0.7")
    table = {50: 17.25, 150: 17.90, 250: 18.09, 500: 17.95, 1000: 18.16, 2000: 18.40}
    assert sorted(got) == sorted(table)
    for h, ppl in table.items():
        assert got[h][0] == pytest.approx(math.log(ppl) / math.log(17.25) - 1, abs=1e-12)
    # H = 2000: +2.27 %; its rounding interval takes both perplexities at +-0.005
    assert got[2000][0] == pytest.approx(0.02266, abs=1e-5)
    assert got[2000][1] == pytest.approx(math.log(18.395) / math.log(17.255) - 1, abs=1e-12)
    assert got[2000][2] == pytest.approx(math.log(18.405) / math.log(17.245) - 1, abs=1e-12)
    assert got[50] == (0.0, 0.0, 0.0)


def test_streaming_diloco_changes_recomputed_by_hand():
    """Streaming DiLoCo, Table 6: 1B, M = 4, evaluation loss 2.50 at H = 30 and 2.53 at
    H = 100; 35M, M = 2: 3.53 and 3.56."""
    one_b = _by_h("streaming-2025-1B-m4")
    assert one_b[100.0][0] == pytest.approx(2.53 / 2.50 - 1, abs=1e-12)
    assert one_b[100.0][1] == pytest.approx(2.525 / 2.505 - 1, abs=1e-12)
    assert one_b[100.0][2] == pytest.approx(2.535 / 2.495 - 1, abs=1e-12)
    assert _by_h("streaming-2025-35M-m2")[100.0][0] == pytest.approx(3.56 / 3.53 - 1, abs=1e-12)
    rel = relative_change()["streaming-2025-1B-m4"]
    assert [c.h_relative for c in rel] == pytest.approx([1.0, 100 / 30])


def test_diloco_ratio_converted_to_loss_by_hand():
    """DiLoCo 2023: the perplexity at H = 1000 is 2.9 % above that at H = 50, whose own
    perplexity lies in [15.02 / 1.029, 15.02]; the loss change is ln(1.029) / ln(P_50)."""
    got = _by_h("diloco-2023")
    p_lo, p_hi = 15.02 / 1.029, 15.02
    assert got[1000.0][0] == pytest.approx(math.log(1.029) / math.log((p_lo + p_hi) / 2))
    assert got[1000.0][1] == pytest.approx(math.log(1.0285) / math.log(p_hi))
    assert got[1000.0][2] == pytest.approx(math.log(1.0295) / math.log(p_lo))
    assert 0.0103 < got[1000.0][1] < got[1000.0][0] < got[1000.0][2] < 0.0109


def test_every_series_names_its_source_and_reference():
    arxiv = {"2311.08105", "2509.10439", "2501.18512"}
    keys = [s.key for s in PUBLISHED]
    assert len(keys) == len(set(keys)) == 1 + 4 + 12
    for s in PUBLISHED:
        assert s.arxiv in arxiv and s.where and s.source and s.model
        rows = relative_change([s])[s.key]
        assert [c.h for c in rows if c.change == 0.0 and c.low == c.high == 0.0] == [s.reference_h]


def test_plot_writes_a_png(tmp_path):
    out = tmp_path / "h.png"
    measured = [(1.0, 0.0, 0.0, 0.0), (2.0, -0.003, -0.005, 0.001), (4.0, 0.01, 0.0, 0.02)]
    surrogate = [(1.0, 0.0, 0.0, 0.0), (4.0, -0.006, -0.006, -0.006)]
    plot_h_effect(measured, out, also=[("surrogate", surrogate)])
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.png"]  # no partial file left


def test_plot_leaves_pyplot_unloaded(tmp_path):
    """Importing the module loads neither torch nor matplotlib; drawing uses matplotlib's
    Figure on its own canvas, never pyplot."""
    code = (
        "import sys\nimport diloco_gym.lm.anchors as a\n"
        "assert 'torch' not in sys.modules and 'matplotlib' not in sys.modules\n"
        f"a.plot_h_effect([(1.0, 0.0, 0.0, 0.0)], {str(tmp_path / 'x.png')!r})\n"
        "assert 'matplotlib.pyplot' not in sys.modules and 'torch' not in sys.modules\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize(
    "measured, match",
    [
        ([], "measured is empty"),
        ([(0.0, 0.0, 0.0, 0.0)], r"measured\[0\]\.h_relative_to_reference must be > 0"),
        ([(1.0, 0.0, 0.0, 0.0), (-2.0, 0.1, 0.0, 0.2)], r"measured\[1\]\.h_relative"),
        ([(1.0, float("nan"), 0.0, 0.0)], r"measured\[0\]\.relative_loss_change must be finite"),
        ([(1.0, 0.5, 0.0, 0.2)], r"measured\[0\] needs ci_low <= change <= ci_high"),
        ([(1.0, 0.0, 0.0)], r"measured\[0\] must have 4 fields"),
    ],
)
def test_plot_refuses_bad_measured_before_writing(tmp_path, measured, match):
    out = tmp_path / "h.png"
    with pytest.raises(ValueError, match=match):
        plot_h_effect(measured, out)
    assert not out.exists()


def test_plot_refuses_a_bad_extra_line(tmp_path):
    with pytest.raises(ValueError, match=r"also\[0\]\[0\]\.h_relative_to_reference"):
        plot_h_effect([(1.0, 0.0, 0.0, 0.0)], tmp_path / "h.png", also=[("s", [(0, 0, 0, 0)])])


def _series(**over):
    base = dict(
        key="k",
        source="s",
        arxiv="0000.00000",
        where="Table 1",
        model="1M",
        replicas=2,
        setting="x",
        metric="loss",
        reference_h=10,
        points=((10, 3.0), (20, 3.1)),
        resolution=0.005,
        label="l",
    )
    base.update(over)
    return Series(**base)


@pytest.mark.parametrize(
    "over, match",
    [
        ({"points": ((10, 3.0), (0, 3.1))}, r"points\[1\] H must be > 0, got 0"),
        ({"points": ((10, 3.0), (-5, 3.1))}, r"points\[1\] H must be > 0"),
        ({"reference_h": 0}, "reference_h must be > 0"),
        ({"reference_h": 30}, "reference_h 30 is not one of the series' H"),
        ({"points": ()}, "points is empty"),
        ({"metric": "accuracy"}, "metric must be one of"),
        ({"metric": "perplexity", "points": ((10, 1.0), (20, 3.0))}, r"points\[0\] value"),
        ({"metric": "perplexity_ratio", "points": ((20, 1.02),)}, "finite reference_range"),
    ],
)
def test_series_refuses_bad_data(over, match):
    with pytest.raises(ValueError, match=match):
        _series(**over)


def test_relative_change_refuses_empty_and_duplicate_input():
    with pytest.raises(ValueError, match="points is empty"):
        relative_change([])
    with pytest.raises(ValueError, match="appears twice"):
        relative_change([_series(), _series()])


def _run(h, total, seed, final, **over):
    sched = list(range(h, total + 1, h))
    run = {
        "name": f"fixed-{h}",
        "schedule": sched,
        "fragments": 1,
        "bits": 32,
        "seed": seed,
        "initial_loss": 5.0,
        "merge_losses": [4.0] * (len(sched) - 1) + [final],
    }
    run.update(over)
    return run


def test_measured_h_effect_by_hand():
    """Fixed H = 2 and 4 over 8 steps, seeds 0 and 1, paired by seed; the fragment, the
    4-bit, the irregular and the different-budget runs are left out."""
    runs = [
        _run(2, 8, 0, 3.0),
        _run(2, 8, 1, 3.2),
        _run(4, 8, 0, 3.03),
        _run(4, 8, 1, 3.2),
        _run(4, 8, 2, 9.9),  # no seed-2 reference: unpaired, ignored
        _run(4, 8, 0, 1.0, fragments=2),
        _run(4, 8, 1, 1.0, bits=4),
        {**_run(2, 8, 0, 1.0), "schedule": [2, 5, 8], "merge_losses": [4.0, 4.0, 1.0]},
        _run(3, 6, 0, 1.0),  # ends at step 6, not 8
    ]
    got = measured_h_effect(runs, 2, draws=2000)
    assert [g[0] for g in got] == [1.0, 2.0]
    assert got[0] == (1.0, 0.0, 0.0, 0.0)
    rel = [3.03 / 3.0 - 1, 3.2 / 3.2 - 1]
    assert got[1][1] == pytest.approx(sum(rel) / 2)
    # the bootstrap mean over 2 seeds ranges over {rel0, mean, rel1}
    assert got[1][2] == pytest.approx(min(rel)) and got[1][3] == pytest.approx(max(rel))


def test_measured_h_effect_on_the_shipped_calibration():
    """docs/learners.md quotes it: at 160 inner steps fixed H = 16 ends 1.0 % above fixed
    H = 4 (paired over 10 seeds), fixed 2 0.8 % above; the mapping check's runs (another
    budget) are not mixed in."""
    runs = json.loads(SHIPPED.read_text())["runs"]
    got = {round(g[0], 2): g for g in measured_h_effect(runs, 4)}
    assert sorted(got) == [0.5, 1.0, 2.0, 4.0, 8.0]
    assert got[4.0][1] == pytest.approx(0.0102, abs=5e-4)
    assert got[4.0][2] > 0  # the whole interval above zero
    assert got[0.5][1] == pytest.approx(0.0076, abs=5e-4)


def test_measured_h_effect_refuses_two_budgets_of_one_interval():
    runs = [_run(2, 8, 0, 3.0), _run(4, 8, 0, 3.1), {**_run(4, 16, 1, 3.2)}]
    with pytest.raises(ValueError, match=r"runs\[2\] is fixed H = 4 at a budget ending at step 16"):
        measured_h_effect(runs, 2)
    mapping = {**_run(4, 16, 1, 3.2), "role": "mapping"}
    assert len(measured_h_effect([*runs[:2], mapping], 2)) == 2  # a mapping run: left out


def test_measured_h_effect_refuses_bad_input():
    with pytest.raises(ValueError, match="reference_h must be > 0"):
        measured_h_effect([_run(2, 8, 0, 3.0)], 0)
    with pytest.raises(ValueError, match="no fixed-H run at reference_h = 5"):
        measured_h_effect([_run(2, 8, 0, 3.0)], 5)
    with pytest.raises(ValueError, match=r"runs\[0\]\.schedule\[0\] must be > 0"):
        measured_h_effect([{**_run(2, 8, 0, 3.0), "schedule": [0, 0]}], 2)
    with pytest.raises(ValueError, match=r"runs\[0\]\.merge_losses"):
        measured_h_effect([{**_run(2, 8, 0, 3.0), "merge_losses": [3.0]}], 2)


def test_surrogate_h_effect_is_the_surrogates_final_loss_ratio():
    cal = load_learner_calibration(SHIPPED)
    got = surrogate_h_effect(cal, [4, 8, 16], 4, 160)
    assert [g[0] for g in got] == [1.0, 2.0, 4.0]
    ref = predict_final_loss(list(range(4, 161, 4)), cal)
    want = predict_final_loss(list(range(16, 161, 16)), cal) / ref - 1
    assert got[2] == pytest.approx((4.0, want, want, want))
    assert want > 0  # the fitted drift: rarer merges, higher loss
    with pytest.raises(ValueError, match="H = 7 does not divide total_steps = 160"):
        surrogate_h_effect(cal, [4, 7], 4, 160)
    with pytest.raises(ValueError, match=r"hs\[0\] must be an int > 0, got 0"):
        surrogate_h_effect(cal, [0], 4, 160)


def test_env_default_h_effect_by_hand():
    from diloco_gym.lm.anchors import env_default_h_effect
    from diloco_gym.sim.learners import LearnerParams

    p = LearnerParams(
        num_learners=2,
        throughput_tokens_per_s=100.0,
        loss_floor=1.0,
        loss_scale=2.0,
        loss_exponent=0.5,
        tokens_scale=1000.0,
        drift_s=10.0,
    )

    def by_hand(h: int) -> float:
        gap, tokens = h * 0.5, 0.0
        for _ in range(int(20.0 // gap)):
            tokens += 2 * 100.0 * gap / (1 + gap / 10.0)
        return 1.0 + 2.0 * (1 + tokens / 1000.0) ** -0.5

    rows = env_default_h_effect([2, 4, 8], 2, duration_s=20.0, learners=p, step_seconds=0.5)
    assert [r[0] for r in rows] == [1.0, 2.0, 4.0]
    for (_, change, low, high), h in zip(rows, [2, 4, 8], strict=True):
        assert change == pytest.approx(by_hand(h) / by_hand(2) - 1, rel=1e-9)
        assert low == change == high
    assert rows[2][1] > rows[1][1] > 0  # with drift, rarer merges end higher
    with pytest.raises(ValueError, match="hs\\[0\\] must be an int > 0"):
        env_default_h_effect([0], 2)
    with pytest.raises(ValueError, match="hs is empty"):
        env_default_h_effect([], 2)


def test_v2_learner_model_prices_the_corridor_as_published_and_measured():
    """``DiLoCoSync-v2``'s learner model (the shipped calibration's) prices the corridor's
    4-fold longer interval (512 against 128 env steps) inside the published 3- to 4-fold
    changes of DiLoCo's outer optimiser (Nesterov, as in DiLoCo, and Streaming DiLoCo; plain
    averaging left out) and inside the bootstrap interval of the shipped calibration's own
    paired runs; v0/v1's learner model prices it above every published change."""
    import gymnasium as gym

    import diloco_gym  # noqa: F401  (registers the ids)
    from diloco_gym.lm.anchors import env_default_h_effect, measured_h_effect, relative_change
    from diloco_gym.sim.learner_calibration import shipped_path

    published = [
        c.change
        for key, changes in relative_change().items()
        if "sgd-1.0" not in key
        for c in changes
        if 3.0 <= c.h_relative <= 4.0
    ]
    assert len(published) >= 10
    v2 = gym.make("DiLoCoSync-v2").unwrapped.learner_params
    ratio, change, _, _ = env_default_h_effect([512], 128, learners=v2)[-1]
    assert ratio == 4.0
    assert min(published) <= change <= max(published)
    doc = json.loads(Path(shipped_path()).read_text())
    rows = {round(r[0], 6): r for r in measured_h_effect(doc["runs"], 4)}
    _, measured, low, high = rows[4.0]
    assert low <= change <= high and low > 0
    _, legacy, _, _ = env_default_h_effect([512], 128)[-1]
    assert legacy > max(published)
