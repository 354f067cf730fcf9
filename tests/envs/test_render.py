"""The episode pictures (diloco_gym/envs/render.py): the env's ``rgb_array`` frame, the
timeline's shape and dtype, that it changes with a merge and with how far the episode has
run, and the timeline panels' rows and labels."""

from __future__ import annotations

import numpy as np
import pytest

from diloco_gym.envs.env import DiLoCoSyncEnv
from diloco_gym.envs.render import plot_timeline, plot_timeline_panels, timeline_rgb


@pytest.fixture(scope="module")
def env():
    e = DiLoCoSyncEnv("bursty")
    e.reset(seed=0)
    return e


def _rgb(env, merges, upto=None):
    return timeline_rgb(env.episode, merges, env.params, env.sidecar, upto=upto)


def _figure():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3))
    FigureCanvasAgg(fig)
    return fig


def test_render_rgb_array_returns_an_image():
    env = DiLoCoSyncEnv("bursty", render_mode="rgb_array")
    env.reset(seed=0)
    for _ in range(3):
        env.step(1)
    img = env.render()
    assert isinstance(img, np.ndarray)
    assert img.ndim == 3 and img.shape[2] == 3 and img.shape[0] > 50 and img.shape[1] > 50
    assert img.dtype == np.uint8
    assert img.min() < img.max()  # not a blank canvas


def test_the_frame_is_an_8_by_3_inch_rgb_image_at_80_dpi(env):
    img = _rgb(env, [])
    assert img.shape == (240, 640, 3) and img.dtype == np.uint8
    assert img.flags["C_CONTIGUOUS"] and img.base is None  # a copy, not the canvas buffer


def test_the_frame_changes_with_a_merge_and_is_deterministic(env):
    none, merged, again = _rgb(env, []), _rgb(env, [100]), _rgb(env, [100])
    assert not np.array_equal(none, merged)
    np.testing.assert_array_equal(merged, again)

    # red merge bars appear where there was no red
    def red(img):
        return int(((img[..., 0] > 180) & (img[..., 1] < 90) & (img[..., 2] < 90)).sum())

    assert red(none) == 0 and red(merged) > 0


def test_a_running_episode_is_drawn_up_to_its_decision(env):
    whole = _rgb(env, [100, 300])
    early = _rgb(env, [100, 300], upto=200)
    assert not np.array_equal(whole, early)
    # a merge after ``upto`` is not drawn yet
    np.testing.assert_array_equal(early, _rgb(env, [100], upto=200))


def test_plot_timeline_draws_one_row_of_windows_per_schedule(env):
    fig = _figure()
    ax = fig.add_subplot(1, 1, 1)
    plot_timeline(ax, env.episode, {"a": [10, 200], "b": []}, env.params, env.sidecar)
    assert [t.get_text() for t in ax.texts] == ["a", "b"]
    assert len(ax.collections) == 1 + 2  # the rate, then schedule a's two merge bars
    assert ax.get_xlim() == (0.0, env.episode.trace.duration_s)
    assert ax.get_xlabel() == "time (s)" and ax.get_ylabel() == "requests / s"


def test_the_panels_label_each_schedule_with_its_merges_and_excess(env):
    fig = _figure()
    plot_timeline_panels(fig, env.episode, {"one": [100], "none": []}, env.params, env.sidecar)
    ax_rate, ax = fig.axes
    assert [t.get_text() for t in ax.get_yticklabels()] == ["none", "one"]
    texts = [t.get_text() for t in ax.texts]
    assert texts[0].startswith("1 merge, +") and texts[0].endswith(" pp")
    assert texts[1] == "0 merges, +0.0 pp"
    legend = [t.get_text() for t in ax_rate.get_legend().get_texts()]
    assert legend[0] == "requests per second" and "only because of a merge" in legend[2]
