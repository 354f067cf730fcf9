"""Scale-out runs end to end: the report (synthetic and trace) is byte-identical on serial,
processes and Ray, a missing Ray names the extra (API and CLI), ``train --vec-env`` gives the
same model per vec env, a tiny Ray Tune search saves a model the report accepts, and a sweep on
Ray equals the serial one. The backends' own behaviour: tests/test_backends.py; tune files:
tests/scale/test_tune.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from diloco_gym.backends import RAY_EXTRA_HINT, require_ray
from diloco_gym.cli import main
from diloco_gym.eval.report import ReportConfig, run_protocol, write_report

ROOT = Path(__file__).resolve().parents[2]

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


def _report_files(config: ReportConfig, out: Path, **backend) -> tuple[bytes, dict]:
    result = run_protocol(config, progress=False, **backend)
    write_report(result, out, command=f"test {backend}")
    payload = json.loads((out / "report.json").read_text())
    for volatile in ("elapsed_s", "command"):  # timings and the command may differ
        payload.pop(volatile)
    return (out / "results.csv").read_bytes(), payload


SMALL = {
    "regimes": ["bursty", "sync-heavy"],
    "seeds": 3,
    "draws": 40,
    "agents": ["fixed-512", "random-deferral", "offline-oracle"],
}


@pytest.fixture(scope="module")
def serial_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("serial") / "r"
    return _report_files(ReportConfig(**SMALL), out)


@pytest.mark.slow
@pytest.mark.parametrize("jobs", [1, 2])
def test_report_identical_on_processes(serial_report, tmp_path, jobs):
    csv, payload = _report_files(
        ReportConfig(**SMALL), tmp_path / "r", backend="processes", jobs=jobs
    )
    assert csv == serial_report[0]
    assert payload == serial_report[1]
    assert b"random-deferral" in csv and len(csv.splitlines()) == 1 + 2 * 3 * 3


@pytest.mark.slow
def test_report_identical_on_ray(serial_report, tmp_path, local_ray):
    csv, payload = _report_files(ReportConfig(**SMALL), tmp_path / "r", backend="ray")
    assert csv == serial_report[0]
    assert payload == serial_report[1]


@pytest.mark.slow
def test_trace_report_identical_on_processes(tmp_path):
    """Trace windows (units rebuilt from the file by each worker) and their timeline."""
    config = ReportConfig(
        trace=str(ROOT / "traces" / "bursty.csv"),
        window_s=300.0,
        draws=30,
        agents=["fixed-512", "wa-diloco"],
    )
    serial = _report_files(config, tmp_path / "s")
    pooled = _report_files(config, tmp_path / "p", backend="processes", jobs=2)
    assert pooled == serial
    assert serial[1]["figures"], "the trace report draws its timeline figure"


def test_missing_ray_names_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ModuleNotFoundError) as exc:
        require_ray()
    assert str(exc.value) == RAY_EXTRA_HINT
    assert 'pip install "diloco-gym[ray]"' in RAY_EXTRA_HINT
    with pytest.raises(SystemExit, match=r'pip install "diloco-gym\[ray\]"') as ex:
        main(
            [
                "report",
                "--backend",
                "ray",
                "--out",
                str(tmp_path / "r"),
                "--seeds",
                "2",
                "--regimes",
                "bursty",
                "--no-progress",
            ]
        )
    err = capsys.readouterr().err
    assert ex.value.code != 0
    assert 'pip install "diloco-gym[ray]"' in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_cli_ray_address_needs_ray_backend(tmp_path, capsys):
    with pytest.raises(SystemExit) as ex:
        main(
            [
                "report",
                "--backend",
                "processes",
                "--ray-address",
                "auto",
                "--out",
                str(tmp_path / "r"),
                "--no-progress",
            ]
        )
    assert ex.value.code != 0
    assert "--ray-address needs --backend ray" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_report_processes(tmp_path, capsys):
    """The report command with --backend processes --jobs 2 writes the serial report."""
    args = [
        "report",
        "--seeds",
        "2",
        "--draws",
        "20",
        "--regimes",
        "sync-heavy",
        "--agents",
        "fixed-256",
        "wa-diloco",
        "--no-progress",
    ]
    assert main(args + ["--out", str(tmp_path / "s")]) == 0
    assert main(args + ["--out", str(tmp_path / "p"), "--backend", "processes", "--jobs", "2"]) == 0
    capsys.readouterr()
    assert (tmp_path / "s" / "results.csv").read_bytes() == (
        tmp_path / "p" / "results.csv"
    ).read_bytes()


# ----------------------------------------------------------------- train --vec-env
def _train_tiny(out: Path, kind: str, seed: int = 5) -> dict:
    pytest.importorskip("stable_baselines3")
    from diloco_gym.rl import train as tr

    tr.train(
        "ppo",
        regime="bursty",
        timesteps=512,
        seed=seed,
        out=out,
        n_envs=2,
        eval_episodes=0,
        checkpoint_freq=0,
        vec_env=kind,
        hyperparameters={"n_steps": 128, "batch_size": 128, "n_epochs": 1},
    )
    from stable_baselines3 import PPO

    meta = json.loads((out / "meta.json").read_text())
    assert meta["vec_env"] == kind and meta["timesteps"] >= 512
    assert meta["train_episodes_this_run"] >= 2
    return {k: v.numpy() for k, v in PPO.load(out / "model.zip").policy.state_dict().items()}


def _same(a: dict, b: dict) -> bool:
    import numpy as np

    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("kind", ["native", "dummy"])
def test_train_same_seed_same_model_per_vec_env(tmp_path, kind):
    first = _train_tiny(tmp_path / "a", kind)
    assert _same(first, _train_tiny(tmp_path / "b", kind))
    assert not _same(first, _train_tiny(tmp_path / "c", kind, seed=6))


@pytest.mark.slow
def test_train_subproc_equals_dummy(tmp_path):
    """The same envs one per process or one after another: the same model."""
    assert _same(_train_tiny(tmp_path / "s", "subproc"), _train_tiny(tmp_path / "d", "dummy"))


def test_native_vec_env_batches_the_training_episodes():
    """The native batch plays exactly the episodes of DummyVecEnv's envs, and every one of
    them has a training seed (never a report or validation seed)."""
    pytest.importorskip("stable_baselines3")
    import numpy as np

    from diloco_gym.rl import train as tr

    native = tr.make_train_vec_env("native", "bursty", seed=11, n_envs=3)
    dummy = tr.make_train_vec_env("dummy", "bursty", seed=11, n_envs=3)
    native.seed(11)
    dummy.seed(11)
    np.testing.assert_array_equal(native.reset(), dummy.reset())
    rng = np.random.default_rng(0)
    for _ in range(600):  # past the end of the first episodes (517 decisions at most)
        actions = rng.integers(2, size=3)
        o1, r1, d1, _ = native.step(actions)
        o2, r2, d2, _ = dummy.step(actions)
        np.testing.assert_array_equal(d1, d2)
        np.testing.assert_allclose(o1, o2, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(r1, r2, rtol=1e-6, atol=1e-6)
    seeds = tr._train_episode_seeds(native)
    assert len(seeds) >= 6 and sorted(seeds) == sorted(tr._train_episode_seeds(dummy))
    assert all(tr.TRAIN_SEED_LOW <= s < tr.TRAIN_SEED_HIGH for s in seeds)
    native.close()
    dummy.close()


# ----------------------------------------------------------------- tune
TINY_TUNE = """
name = "tiny"
timesteps = 256
eval_every = 128
grace_timesteps = 128
reduction_factor = 2
num_samples = 2
train_seeds = 2
validation_episodes = 2
n_envs = 2
seed = 1
[space]
learning_rate = { loguniform = [1e-4, 1e-3] }
n_steps = [64]
batch_size = 64
n_epochs = 1
"""


@pytest.mark.slow
def test_tiny_tune_saves_a_model_report_accepts(tmp_path, local_ray):
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("ray.tune")
    from diloco_gym.agents.registry import make_agents
    from diloco_gym.envs.env import DiLoCoSyncEnv
    from diloco_gym.eval.rollout import run_episode
    from diloco_gym.rl import train as tr
    from diloco_gym.scale.tune import load_tune, run_tune

    cfg = tmp_path / "t.toml"
    cfg.write_text(TINY_TUNE)
    res = run_tune(load_tune(cfg), tmp_path / "out", progress=False)
    assert res["trials"] == 2 and res["errored"] == 0
    best = tmp_path / "out" / "best"
    meta = json.loads((best / "meta.json").read_text())
    assert meta["algo"] == "ppo" and meta["timesteps"] == 256
    assert meta["seed_ranges"]["validation_seeds"] == [tr.VALIDATION_SEED0, tr.VALIDATION_SEED0 + 2]
    assert meta["seed_ranges"]["train_episode_seeds"][0] == tr.TRAIN_SEED_LOW == 10**6
    assert len(meta["tune"]["validation_per_seed"]) == 2
    assert meta["hyperparameters"]["learning_rate"] == res["config"]["learning_rate"]
    trials = json.loads((tmp_path / "out" / "trials.json").read_text())
    finished = [t for t in trials if t["timesteps"] == 256]
    assert res["metric"] == min(t["val_sync_excess_pct"] for t in finished)
    # A normal run directory: the report's agent loader takes it.
    (agent,) = make_agents([str(best)])
    out = run_episode(DiLoCoSyncEnv("bursty"), agent, 0)
    assert out["merges"] >= 1
    assert (
        main(
            [
                "report",
                "--agents",
                "fixed-512",
                "--agent",
                str(best),
                "--regimes",
                "bursty",
                "--seeds",
                "2",
                "--draws",
                "10",
                "--no-progress",
                "--out",
                str(tmp_path / "rep"),
            ]
        )
        == 0
    )


@pytest.mark.slow
def test_sweep_on_ray_equals_serial(tmp_path, local_ray):
    """A sweep with a failing point, on Ray and serially: the same files."""
    from diloco_gym.scale.sweep import load_sweep, run_sweep

    cfg = tmp_path / "s.toml"
    cfg.write_text(
        'agents = ["fixed-512"]\nseeds = 2\ndraws = 20\n[grid]\n'
        'regime = ["sync-heavy"]\nmerge_budget = [8, 1000]\n'
    )
    outs = {}
    for backend in ("serial", "ray"):
        res = run_sweep(load_sweep(cfg), tmp_path / backend, backend=backend, progress=False)
        assert res["complete"] and res["failed"] == 2
        outs[backend] = {
            n: (tmp_path / backend / n).read_bytes()
            for n in ("results.csv", "summary.csv", "errors.csv", "summary.md")
        }
    assert outs["ray"] == outs["serial"]


def test_tune_without_ray_names_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)
    cfg = tmp_path / "t.toml"
    cfg.write_text("[space]\ngamma = 0.99\n")
    with pytest.raises(SystemExit) as ex:
        main(["tune", str(cfg), "--out", str(tmp_path / "o")])
    assert ex.value.code == 2
    assert 'pip install "diloco-gym[ray]"' in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
