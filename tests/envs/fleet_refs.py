"""Reference digests of fleet episodes, recorded before the fleet env's speed work and
checked by ``tests/envs/test_fleet_speed.py``: every observation, reward, flag, info and
episode summary of a few fleets (the default four bursty sites, fragments with the
precision action, a capped fleet with a worst-site weight, per-site timing, one site) for
episode seeds 0..4 under a fixed action sequence, as one SHA-256 digest per episode.

Floats enter the digest by their exact bits, so a digest changes if any value changes in
its last bit. Values that go through ``pow`` / ``exp`` (the learner model, the EWMA
correction) may differ in their last bits between NumPy, numba and libm versions; the
file records the versions it was made with, and the test skips (saying why) under others.

``python tests/envs/fleet_refs.py``, run from the repository root with ``PYTHONPATH`` at a
checkout of the code before the speed work, rewrites the file. It was recorded at commit
``5dcfec7`` and re-recorded at ``f679d2b`` (main just before the speed work was merged, whose
per-site timing env had changed on purpose since: token-weighted drops; every other case
kept its digest). Never re-run it on newer code to make a failing test pass.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

REF_PATH = Path(__file__).resolve().parents[1] / "data" / "fleet_refs.json"
SEEDS = range(5)
STEPS_PER_EPISODE = 1000  # more than any case's decisions: each episode runs to its end

#: name -> gym.make keywords of ``DiLoCoFleet-v1``.
CASES: dict[str, dict[str, Any]] = {
    "default": {},
    "one_site": {"fleet": "ONE_SITE"},
    "fragments_bits": {"fragments": 2, "bits_options": (32, 8)},
    "cap_worst": {"site_cap_pp": 2.0, "worst_site_weight": 0.5, "fragments": 2},
    "rounds": {"timing": "rounds", "grace_s": 4.5, "quorum": 3, "h_min_steps": 256},
    "forced": {"skip_forced": False, "progress_weight": 1.0},
}


def make(case: str):
    import gymnasium as gym

    import diloco_gym  # noqa: F401  (registers the ids)
    from diloco_gym.sim import fleet as fl

    kw = dict(CASES[case])
    if kw.get("fleet") == "ONE_SITE":
        kw["fleet"] = fl.FleetParams(sites=(fl.SiteConfig(name="site0", regime="bursty"),))
    return gym.make("DiLoCoFleet-v1", **kw).unwrapped


def feed(h: Any, x: Any) -> None:
    """Feed a value into the digest, exactly (floats by their bits, arrays with dtype and
    shape, dicts by sorted key)."""
    if isinstance(x, dict):
        h.update(b"{")
        for k in sorted(x, key=str):
            h.update(str(k).encode() + b":")
            feed(h, x[k])
        h.update(b"}")
    elif isinstance(x, (list, tuple)):
        h.update(b"[")
        for v in x:
            feed(h, v)
        h.update(b"]")
    elif isinstance(x, np.ndarray):
        a = np.ascontiguousarray(x)
        h.update(f"a{a.dtype}{a.shape}".encode() + a.tobytes())
    elif isinstance(x, (bool, np.bool_)):
        h.update(b"T" if x else b"F")
    elif isinstance(x, (int, np.integer)):
        h.update(b"i%d" % int(x))
    elif isinstance(x, (float, np.floating)):
        h.update(b"f" + float(x).hex().encode())
    elif x is None or isinstance(x, str):
        h.update(repr(x).encode())
    else:
        raise TypeError(f"cannot digest {type(x).__name__}")


def actions(env: Any, seed: int, n: int) -> list[Any]:
    """A fixed action sequence for ``env``'s action space (independent of the env)."""
    rng = np.random.default_rng(1000 + seed)
    space = env.action_space
    shape = getattr(space, "nvec", None)
    if shape is not None:
        return [rng.integers(0, shape) for _ in range(n)]
    if space.shape:  # MultiBinary
        return [rng.integers(0, 2, space.shape) for _ in range(n)]
    return rng.integers(0, 2, n).tolist()


def episode_digest(env: Any, seed: int) -> str:
    """The episode of ``seed``, then the next (its seed drawn by the env), under
    :func:`actions`: every output, digested."""
    h = hashlib.sha256()
    for k, s in enumerate((seed, None)):
        obs, info = env.reset(seed=s)
        feed(h, [obs, info, env.action_masks()])
        for a in actions(env, seed + 100 * k, STEPS_PER_EPISODE):
            obs, reward, term, trunc, info = env.step(a)
            feed(h, [obs, reward, term, trunc, info, env.action_masks()])
            if term or trunc:
                break
        else:
            raise AssertionError("the episode did not end")
        feed(h, env.episode_summary())
    return h.hexdigest()[:32]


def versions() -> dict[str, str]:
    import numba

    return {"numpy": np.__version__, "numba": numba.__version__}


def record() -> dict[str, Any]:
    out: dict[str, Any] = {"versions": versions(), "digests": {}}
    for case in CASES:
        env = make(case)
        out["digests"][case] = [episode_digest(env, s) for s in SEEDS]
    return out


if __name__ == "__main__":
    REF_PATH.write_text(json.dumps(record(), indent=1) + "\n")
    print(f"wrote {REF_PATH}")
