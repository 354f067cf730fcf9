"""Deployable agents sealed in their own process: an agent that walks the garbage
collector and the call stack finds nothing of the episode there, while the same agent
run in-process finds the env, the episode and the seed (so the test can fail)."""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from diloco_gym import DiLoCoSyncEnv
from diloco_gym.agents.base import Agent
from diloco_gym.eval.rollout import run_episode
from diloco_gym.eval.sealed import SealedAgent, seal_agents

pytestmark = pytest.mark.slow  # starts worker processes


def _seed() -> int:
    """The episode seed, computed (not a literal: the worker imports this module to build
    the spy, and a module constant equal to the seed would be found there)."""
    return 987_000 + 654


def _instance_dict(o) -> dict:
    """``o.__dict__`` when it is a dict (some compiled objects expose another mapping, or a
    property that raises)."""
    try:
        d = getattr(o, "__dict__", None)
    except Exception:  # noqa: BLE001 - a hostile agent tolerates any object
        return {}
    return d if isinstance(d, dict) else {}


class GcSpy(Agent):
    """Deployable in name only: looks through every object of its process and every frame
    above it for the env, the episode, the trace's future arrivals and the seed, and writes
    what it found to ``out`` at each attach (its own file; nothing else leaves the worker)."""

    name = "gc-spy"

    def __init__(self, out: str) -> None:
        self.out = out

    def _search(self) -> dict:
        found: set[str] = set()
        ints: set[int] = set()
        arrays: list[list[float]] = []
        suspects = ("DiLoCoSyncEnv", "Episode", "Trace", "ReplayResult", "EpisodeScorer", "Env")
        for o in gc.get_objects():
            name = type(o).__name__
            if name in suspects:
                found.add(name)
            # Arrays are not tracked by the collector: reach them through the containers
            # and instance dicts (which are) that hold them.
            try:  # some objects raise on any look (absl's flags before parsing, ...)
                held = [
                    *(o.values() if isinstance(o, dict) else ()),
                    *(o if isinstance(o, list | tuple) else ()),
                    *(_instance_dict(o).values()),
                    *(
                        getattr(o, f.name, None)
                        for f in (dataclasses.fields(o) if dataclasses.is_dataclass(o) else ())
                        if not isinstance(o, type)
                    ),
                ]
            except Exception:  # noqa: BLE001 - a hostile agent tolerates any object
                continue
            ints.update(v for v in held if type(v) is int)
            if isinstance(o, dict):
                ints.update(k for k in o if type(k) is int)
            arrays.extend(
                v.ravel()[:2000].tolist()
                for v in held
                if isinstance(v, np.ndarray) and v.dtype.kind in "fiu" and v.size >= 50
            )
        f = sys._getframe()
        while f is not None:
            for v in f.f_locals.values():
                if type(v).__name__ in suspects:
                    found.add(type(v).__name__)
                if type(v) is int:
                    ints.add(v)
            f = f.f_back
        return {
            "found": sorted(found),
            "ints": sorted(i for i in ints if i > 1000),
            "arrays": arrays,
        }

    def attach(self, context) -> None:
        self.calls = 0
        Path(self.out).write_text(json.dumps(self._search()))

    def act(self, obs: np.ndarray) -> np.ndarray:
        self.calls += 1
        if self.calls == 100:  # again mid-episode (lazily computed data exists by then)
            first = json.loads(Path(self.out).read_text())
            now = self._search()
            merged = {
                "found": sorted(set(first["found"]) | set(now["found"])),
                "ints": sorted(set(first["ints"]) | set(now["ints"])),
                "arrays": first["arrays"] + now["arrays"],
            }
            Path(self.out).write_text(json.dumps(merged))
        return np.zeros(len(obs), dtype=np.int64)


def _array_seen(report: dict, arr: np.ndarray) -> bool:
    c = np.asarray(arr, dtype=float).ravel()[:2000]
    return any(
        len(a) == c.size and np.array_equal(np.asarray(a, dtype=float), c) for a in report["arrays"]
    )


def test_a_gc_and_frame_walking_agent_finds_nothing_when_sealed(tmp_path):
    env = DiLoCoSyncEnv("bursty")
    out = tmp_path / "sealed.json"
    sealed = SealedAgent(GcSpy(str(out)))
    try:
        res = run_episode(env, sealed, _seed())
    finally:
        sealed.close()
    assert res["steps"] > 100 and res["deployable"]
    seen = json.loads(out.read_text())
    assert seen["found"] == [] and _seed() not in seen["ints"]
    assert not _array_seen(seen, env.unwrapped.episode.trace.arrival_s)
    # The same agent in-process reaches all of it: the search works.
    out2 = tmp_path / "inproc.json"
    run_episode(env, GcSpy(str(out2)), _seed())
    seen2 = json.loads(out2.read_text())
    assert "DiLoCoSyncEnv" in seen2["found"] and "Episode" in seen2["found"]
    assert _seed() in seen2["ints"]
    assert _array_seen(seen2, env.unwrapped.episode.trace.arrival_s)


def test_sealed_agents_act_exactly_as_in_process():
    from diloco_gym.agents.registry import make_agents

    names = ["online-forecast", "wa-diloco", "fixed-budget"]
    env = DiLoCoSyncEnv("bursty", merge_budget=10)
    plain = make_agents(names)
    sealed = seal_agents(make_agents(names))
    try:
        for a, s in zip(plain, sealed, strict=True):
            assert isinstance(s, SealedAgent) and s.name == a.name
            for seed in (0, 1):
                r1, r2 = run_episode(env, a, seed), run_episode(env, s, seed)
                assert r1["merge_decisions"] == r2["merge_decisions"]
                assert r1["return"] == r2["return"]
    finally:
        for s in sealed:
            s.close()


def test_the_oracle_is_never_sealed_and_errors_name_the_agent():
    from diloco_gym.agents.registry import make_agents

    oracle, fixed = make_agents(["offline-oracle", "fixed-512"])
    out = seal_agents([oracle, fixed])
    assert out[0] is oracle and isinstance(out[1], SealedAgent)
    assert seal_agents([fixed], in_process=True)[0] is fixed
    with pytest.raises(ValueError, match="not deployable"):
        SealedAgent(oracle)
    out[1].close()


class _Broken(Agent):
    name = "broken"

    def act(self, obs):
        raise ZeroDivisionError("no plan")


def test_an_agent_error_in_the_worker_is_one_clear_error():
    s = SealedAgent(_Broken())
    try:
        with pytest.raises(RuntimeError, match="sealed agent broken: ZeroDivisionError: no plan"):
            run_episode(DiLoCoSyncEnv("bursty"), s, 0)
    finally:
        s.close()


@pytest.mark.slow
def test_a_script_without_a_main_guard_gets_a_clear_error(tmp_path):
    """The worker imports the calling script afresh (spawn); a script with no main guard
    makes it fail at start: the parent names the cause and the opt-out, not a bare
    ConnectionResetError."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    script = tmp_path / "noguard.py"
    script.write_text(
        "import numpy as np\n"
        "from diloco_gym.agents.base import AgentContext\n"
        "from diloco_gym.agents.registry import make_agent\n"
        "from diloco_gym.envs.params import EnvParams\n"
        "from diloco_gym.eval.sealed import SealedAgent\n"
        "a = SealedAgent(make_agent('online-forecast'))\n"
        "a.attach(AgentContext(params=EnvParams(), regime='bursty'))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(root)}
    r = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode != 0
    assert "if __name__ == '__main__':" in r.stderr, r.stderr[-2000:]
    assert "in_process_agents=True" in r.stderr


@pytest.mark.slow
def test_a_report_leaves_no_sealed_worker_running(tmp_path):
    """A report run from Python stops its sealed agents' worker processes when it returns
    (they were cached for the run; later code must not find them running)."""
    import multiprocessing as mp

    from diloco_gym.eval.report import ReportConfig, run_protocol

    before = set(mp.active_children())
    config = ReportConfig(regimes=["bursty"], agents=["fixed-512", "wa-diloco"], seeds=2, draws=10)
    result = run_protocol(config, progress=False)
    assert result["agent_sealing"].startswith("sealed")
    left = [p for p in mp.active_children() if p not in before and p.is_alive()]
    assert not left, left
