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


def _digest(value) -> str:
    """A short hash of an int or of an array's first 2,000 values (as float64): the spy
    carries the hashes of what it looks for, never the values."""
    import hashlib

    raw = (
        str(value).encode()
        if type(value) is int
        else np.asarray(value, dtype=np.float64).ravel()[:2000].tobytes()
    )
    return hashlib.sha256(raw).hexdigest()[:16]


class GcSpy(Agent):
    """Deployable in name only: looks through every object of its process and every frame
    above it for the env, the episode, the trace's future arrivals and the seed (known to
    it by their hashes only), and reports what it found by raising an error at its 101st
    decision (the one channel a sealed worker has besides its actions)."""

    name = "gc-spy"

    def __init__(self, targets: dict[str, str]) -> None:
        self.targets = targets

    def _search(self) -> set[str]:
        found: set[str] = set()
        digests: set[str] = set()
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
            digests.update(_digest(v) for v in held if type(v) is int and v > 1000)
            if isinstance(o, dict):
                digests.update(_digest(k) for k in o if type(k) is int and k > 1000)
            digests.update(
                _digest(v)
                for v in held
                if isinstance(v, np.ndarray) and v.dtype.kind in "fiu" and v.size >= 50
            )
        f = sys._getframe()
        while f is not None:
            for v in f.f_locals.values():
                if type(v).__name__ in suspects:
                    found.add(type(v).__name__)
                if type(v) is int and v > 1000:
                    digests.add(_digest(v))
            f = f.f_back
        found.update(label for label, h in self.targets.items() if h in digests)
        return found

    def attach(self, context) -> None:
        self.calls = 0
        self.found = self._search()

    def act(self, obs: np.ndarray) -> np.ndarray:
        self.calls += 1
        if self.calls == 100:  # again mid-episode (lazily computed data exists by then)
            self.found |= self._search()
        if self.calls == 101:
            raise LookupError("spy-report " + json.dumps(sorted(self.found)))
        return np.zeros(len(obs), dtype=np.int64)


def _spy_report(exc: BaseException) -> list[str]:
    text = str(exc)
    assert "spy-report " in text, text
    return json.loads(text.split("spy-report ", 1)[1])


def test_a_gc_and_frame_walking_agent_finds_nothing_when_sealed():
    env = DiLoCoSyncEnv("bursty")
    env.reset(seed=_seed())
    targets = {
        "seed": _digest(_seed()),
        "arrivals": _digest(env.unwrapped.episode.trace.arrival_s),
    }
    sealed = SealedAgent(GcSpy(targets))
    try:
        with pytest.raises(RuntimeError, match="sealed agent gc-spy: LookupError") as got:
            run_episode(env, sealed, _seed())
    finally:
        sealed.close()
    assert _spy_report(got.value) == []
    # The same agent in-process reaches all of it: the search works.
    with pytest.raises(LookupError) as got2:
        run_episode(env, GcSpy(targets), _seed())
    seen = _spy_report(got2.value)
    assert {"DiLoCoSyncEnv", "Episode", "seed", "arrivals"} <= set(seen), seen


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
def test_a_script_without_a_main_guard_and_stdin_work(tmp_path):
    """The worker is a fresh interpreter that never imports the calling script: a script
    without an ``if __name__ == '__main__':`` guard, and a program read from standard
    input, seal an agent defined in themselves (its code travels with it)."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    program = (
        "import numpy as np\n"
        "from diloco_gym import DiLoCoSyncEnv\n"
        "from diloco_gym.agents.base import Agent\n"
        "from diloco_gym.eval.rollout import run_episode\n"
        "from diloco_gym.eval.sealed import SealedAgent\n"
        "class Mine(Agent):\n"
        "    name = 'mine'\n"
        "    def act(self, obs):\n"
        "        return np.ones(len(obs), dtype=np.int64)\n"
        "a = SealedAgent(Mine())\n"
        "r = run_episode(DiLoCoSyncEnv('bursty'), a, 3)\n"
        "print('merges', len(r['merge_decisions']) > 0, r['deployable'])\n"
    )
    script = tmp_path / "noguard.py"
    script.write_text(program)
    env = {**os.environ, "PYTHONPATH": str(root)}
    for cmd, stdin in (([sys.executable, str(script)], None), ([sys.executable, "-"], program)):
        r = subprocess.run(
            cmd, input=stdin, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path
        )
        assert r.returncode == 0, r.stderr[-2000:]
        assert "merges True True" in r.stdout


@pytest.mark.slow
def test_a_report_leaves_no_sealed_worker_running(tmp_path):
    """A report run from Python stops its sealed agents' worker processes when it returns
    (they were cached for the run; later code must not find them running)."""
    import psutil

    from diloco_gym.eval.report import ReportConfig, run_protocol

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    config = ReportConfig(regimes=["bursty"], agents=["fixed-512", "wa-diloco"], seeds=2, draws=10)
    result = run_protocol(config, progress=False)
    assert result["agent_sealing"].startswith("sealed")
    left = [p for p in me.children(recursive=True) if p.pid not in before and p.is_running()]
    assert not left, left
