"""The executor backends (diloco_gym/backends.py): cells come back in the order given on
every backend, a raising cell is reported (or recorded), the arguments are checked before
anything runs, an empty list starts nothing, the progress display, and Ray's local
instance."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diloco_gym.backends import (
    BACKENDS,
    RAY_EXTRA_HINT,
    CellError,
    default_jobs,
    progress_bar,
    run_cells,
)

try:
    import ray  # noqa: F401

    HAVE_RAY = True
except ImportError:
    HAVE_RAY = False


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray instance of 2 CPUs for this module (the CI's size)."""
    if not HAVE_RAY:
        pytest.skip("Ray is not installed (the diloco-gym[ray] extra)")
    import ray

    from diloco_gym.backends import init_ray

    started = not ray.is_initialized()
    init_ray(jobs=2)
    yield ray
    if started:
        ray.shutdown()


def _square_slow_first(x: int) -> int:
    # Early cells finish last: the order of the results must not follow finishing order.
    time.sleep(0.05 * (3 - x) if x < 3 else 0)
    return x * x


def _fail_on_two(x: int) -> int:
    if x == 2:
        raise ValueError(f"cell {x} is broken\non two lines")
    return x


@pytest.mark.slow
def test_cells_come_back_in_order(local_ray):
    for backend in ("serial", "processes", "ray"):
        seen = []
        out = run_cells(
            _square_slow_first,
            list(range(6)),
            backend=backend,
            jobs=2,
            on_result=lambda i, r, seen=seen: seen.append(i),
        )
        assert out == [x * x for x in range(6)], backend
        assert sorted(seen) == list(range(6)), backend


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["serial", "processes", "ray"])
def test_raising_cell(backend, request):
    if backend == "ray":
        request.getfixturevalue("local_ray")
    # Recorded, the others complete.
    out = run_cells(_fail_on_two, list(range(5)), backend=backend, jobs=2, capture_errors=True)
    assert out[:2] == [0, 1] and out[3:] == [3, 4]
    assert isinstance(out[2], CellError)
    assert str(out[2]) == "ValueError: cell 2 is broken on two lines"
    # Not captured: the cell's own exception type reaches the caller on every backend.
    with pytest.raises(ValueError, match="cell 2 is broken"):
        run_cells(_fail_on_two, list(range(5)), backend=backend, jobs=2)


def test_bad_backend_arguments():
    with pytest.raises(ValueError, match="unknown backend 'spark'"):
        run_cells(abs, [1], backend="spark")
    with pytest.raises(ValueError, match="jobs must be >= 1"):
        run_cells(abs, [1], backend="processes", jobs=0)
    with pytest.raises(ValueError, match="needs backend 'ray'"):
        run_cells(abs, [1], backend="processes", ray_address="auto")


@pytest.mark.slow
def test_local_ray_starts_its_own_instance_whatever_cluster_is_advertised(tmp_path):
    """Without an address the backend starts a new local instance: an address that Ray would
    otherwise pick up (RAY_ADDRESS here; its current-cluster file after an unclean
    ``ray start``) names no running cluster and must not be attached to."""
    if not HAVE_RAY:
        pytest.skip("Ray is not installed (the diloco-gym[ray] extra)")
    root = Path(__file__).resolve().parents[1]
    code = (
        "from diloco_gym.backends import init_ray\n"
        "ray = init_ray(jobs=1)\n"
        "print('cpus', ray.cluster_resources()['CPU'])\n"
        "ray.shutdown()\n"
    )
    env = dict(os.environ, RAY_ADDRESS="127.0.0.1:9", PYTHONPATH=str(root))
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "cpus 1.0" in done.stdout


def test_progress_off_a_terminal_is_one_line_per_finished_cell_when_few(capsys):
    """In a log (stderr not a terminal) no bar redraws: with at most four cells, one
    flushed line per cell."""
    out = run_cells(_square_slow_first, list(range(3)), progress=True, desc="demo")
    assert out == [0, 1, 4]
    err = capsys.readouterr().err
    assert err.splitlines() == [f"demo: {i}/3 cells done" for i in (1, 2, 3)]
    assert "\r" not in err


def test_progress_off_a_terminal_is_a_few_summary_lines(capsys):
    """A report's 105 cells write four lines to a log, at each quarter, not 105."""
    from diloco_gym.backends import progress_bar

    bar = progress_bar(105, True, "report")
    for _ in range(105):
        bar.update(1)
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"report: {i}/105 cells done" for i in (27, 53, 79, 105)]
    bar = progress_bar(10, True, "sweep", "episode")
    bar.update(6)  # a batch crossing two quarters: one line
    bar.update(4)
    assert capsys.readouterr().err.splitlines() == [
        "sweep: 6/10 episodes done",
        "sweep: 10/10 episodes done",
    ]


def test_progress_on_a_terminal_is_a_tqdm_bar(monkeypatch):
    from tqdm import tqdm

    from diloco_gym.backends import progress_bar

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    bar = progress_bar(4, True, "demo", "episode")
    assert isinstance(bar, tqdm) and bar.desc == "demo"
    bar.close()
    assert progress_bar(4, False, "demo") is None


# ----------------------------------------------------------------- unit behaviour
def _record_call(x: int) -> int:
    _CALLS.append(x)
    return -x


_CALLS: list[int] = []


def test_backends_are_the_three_documented():
    assert BACKENDS == ("serial", "processes", "ray")


def test_serial_runs_in_order_and_reports_each_result_as_it_finishes():
    _CALLS.clear()
    seen = []
    out = run_cells(_record_call, [3, 1, 2], on_result=lambda i, r: seen.append((i, r)))
    assert out == [-3, -1, -2]
    assert _CALLS == [3, 1, 2]  # serial: one after the other in the order given
    assert seen == [(0, -3), (1, -1), (2, -2)]


def test_one_cell_on_processes_with_more_workers_than_cells():
    assert run_cells(abs, [-7], backend="processes", jobs=4) == [7]


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_cells_start_nothing(backend, monkeypatch, capsys):
    """An empty list returns at once: no pool, no Ray (not even imported), no progress line."""
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    seen = []
    assert run_cells(abs, [], backend=backend, progress=True, on_result=seen.append) == []
    assert seen == []
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"backend": "spark"}, "unknown backend 'spark'; choose one of serial, processes, ray"),
        ({"backend": "serial", "jobs": 0}, "jobs must be >= 1, got 0"),
        ({"backend": "processes", "jobs": -3}, "jobs must be >= 1, got -3"),
        ({"backend": "serial", "ray_address": "host:6379"}, "'host:6379'"),
    ],
)
def test_bad_arguments_are_refused_before_any_cell_runs(kwargs, message):
    _CALLS.clear()
    with pytest.raises(ValueError) as info:
        run_cells(_record_call, [1, 2], **kwargs)
    assert message in str(info.value)
    assert _CALLS == []


def test_captured_error_is_one_line_with_the_class_name():
    out = run_cells(_fail_on_two, [2], capture_errors=True)
    assert out == [CellError("ValueError", "cell 2 is broken on two lines")]
    assert "\n" not in out[0].message


def test_uncaptured_error_stops_the_serial_run_at_the_failing_cell():
    _CALLS.clear()

    def fn(x):
        if x == 2:
            raise KeyError(x)
        return _record_call(x)

    with pytest.raises(KeyError):
        run_cells(fn, [1, 2, 3])
    assert _CALLS == [1]  # cell 3 never ran


def test_default_jobs_is_the_cpus_this_process_may_use():
    jobs = default_jobs()
    assert jobs >= 1
    if hasattr(os, "sched_getaffinity"):
        assert jobs == len(os.sched_getaffinity(0))


def test_line_progress_names_its_unit_in_the_singular_for_one_item(capsys):
    assert run_cells(abs, [-1], progress=True, desc="one") == [1]
    assert capsys.readouterr().err == "one: 1/1 cell done\n"
    bar = progress_bar(2, True, "eps", "episode")
    bar.update()
    bar.update()
    bar.close()
    assert capsys.readouterr().err.splitlines() == [
        "eps: 1/2 episodes done",
        "eps: 2/2 episodes done",
    ]


def test_require_ray_returns_the_module_when_installed():
    if not HAVE_RAY:
        pytest.skip("Ray is not installed (the diloco-gym[ray] extra)")
    import ray

    from diloco_gym.backends import require_ray

    assert require_ray() is ray
    assert "diloco-gym[ray]" in RAY_EXTRA_HINT


def test_init_ray_reuses_an_initialised_instance(local_ray):
    """An instance already running in this process is kept as it is: asking for 1 CPU
    neither restarts it nor shrinks it."""
    from diloco_gym.backends import init_ray

    assert init_ray(jobs=1) is local_ray and local_ray.is_initialized()
    assert local_ray.cluster_resources()["CPU"] == 2.0


def _trusts_model_files(_: int) -> bool:
    from diloco_gym.agents.learned import model_files_trusted

    return model_files_trusted()


def test_process_workers_are_told_the_trust_setting_explicitly(monkeypatch):
    """``--trust-model-file`` reaches spawned workers as an argument; the environment
    variable that once carried it switches nothing on."""
    from diloco_gym.agents.learned import trusting_model_files

    monkeypatch.setenv("DILOCO_GYM_TRUST_MODEL_FILES", "1")
    assert run_cells(_trusts_model_files, [0, 1], backend="processes", jobs=2) == [False] * 2
    with trusting_model_files():
        assert run_cells(_trusts_model_files, [0, 1], backend="processes", jobs=2) == [True] * 2
        assert run_cells(_trusts_model_files, [0], backend="serial") == [True]
    assert run_cells(_trusts_model_files, [0], backend="serial") == [False]
