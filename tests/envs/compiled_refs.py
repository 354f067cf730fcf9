"""Reference outputs of the envs, recorded from diloco-gym 0.4.0 (the NumPy kernel) and checked
against the compiled kernel by ``tests/envs/test_compiled_equivalence.py``.

Two kinds of value are recorded:

* **exact**: integers, booleans, and floats computed from the seed's draws by IEEE
  arithmetic alone (+, -, *, /, sqrt, comparisons, min/max), which every conforming
  library computes bit for bit; kept as SHA-256 digests (``digest``) or as plain JSON.
* **raw floats**: every value that goes through a transcendental function of the C or
  NumPy library (``pow`` in the learners' loss curve and the EWMA bias correction, ``exp``
  in the learner throughputs), whose last bits may differ between NumPy, numba and libm
  versions: the observation's learner block, serving pressure and rate forecasts
  (:data:`FLOAT_COLS`), the ``progress`` reward terms and every float of the episode
  summaries. They are stored as values (JSON numbers, or float32 arrays in
  ``compiled_refs_obs.npz``) and compared with a tolerance (see the test module).

``python tests/envs/compiled_refs.py [results.csv]``, run from the repository root with
``PYTHONPATH`` pointing at a checkout of the 0.4.0 code (commit ``c1f0745``), rewrites both
files. Never re-run it on newer code to make a failing equivalence test pass.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

REF_PATH = Path(__file__).resolve().parents[1] / "data" / "compiled_refs.json"
OBS_PATH = REF_PATH.with_name("compiled_refs_obs.npz")
REGIMES = ("ordinary", "pressure-heavy", "sync-heavy", "bursty", "non-periodic")
SEEDS = range(5)
#: (skip_forced, merge_budget) cases of the single env.
CASES = ((True, None), (False, None), (True, 12), (False, 12))
VEC_ENVS, VEC_STEPS = 8, 400

#: Observation columns that depend on a transcendental function: the learner block
#: (loss_progress_mean .. staleness: ``pow``), serving pressure and the rate forecast,
#: baseline and trend (the EWMA's bias correction ``1 - (1 - alpha) ** d``). The others
#: (gap, corridor, network, checkpoint, rate_now, merges, time_left, budget_left) are exact.
FLOAT_COLS = (2, 3, 4, 5, 6, 8, 11, 12, 13)
EXACT_COLS = tuple(c for c in range(17) if c not in FLOAT_COLS)
#: Info keys whose values are raw floats (the learners' loss decrease).
FLOAT_INFO_KEYS = ("progress",)


def digest(*arrays: Any) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(np.asarray(a))
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:32]


def _plain(x: Any) -> Any:
    """JSON-safe copy of a value (arrays as digests, floats by ``repr``: exact)."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        if x.dtype == object:  # e.g. same-step autoreset's final_obs
            return [_plain(v) for v in x.tolist()]
        return digest(x)
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return repr(float(x))
    return x if x is None or isinstance(x, str) else repr(x)


def _raw(x: Any) -> Any:
    """JSON copy of a value with floats as JSON numbers (``repr``: round-trips exactly)."""
    if isinstance(x, dict):
        return {k: _raw(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_raw(v) for v in x]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x)
    return x


def _split_floats(info: dict, step: int, out: list, prefix: str = "") -> dict:
    """``info`` without its raw-float entries (:data:`FLOAT_INFO_KEYS`, at any depth), which
    are appended to ``out`` as ``[step, path, value]`` (a scalar) or ``[step, path, env,
    value]`` (an array over envs: its non-zero entries); ``path`` is the dotted key."""
    kept = {}
    for k, v in info.items():
        path = prefix + k
        if isinstance(v, dict):
            kept[k] = _split_floats(v, step, out, path + ".")
        elif k in FLOAT_INFO_KEYS:
            if isinstance(v, np.ndarray):
                for i in np.flatnonzero(v):
                    out.append([step, path, int(i), float(v[i])])
            elif v:
                out.append([step, path, float(v)])
        else:
            kept[k] = v
    return kept


#: Step-info keys added after 0.4.0 (Gymnasium's ``info["action_mask"]`` convention; it is
#: checked against ``action_masks()`` by the env tests), left out of the 0.4.0 fingerprint.
NEW_INFO_KEYS = ("action_mask", "_action_mask")

#: results.csv columns of 0.4.0's default report (0.5.0 adds ``verdict_unit``), and the
#: oracle labels 0.5.0 renamed (the same schedules and numbers: the default report's episodes
#: are below the enumeration limit or proven additive, or the local search finds no better
#: schedule than the additive optimum).
REPORT_COLUMNS_0_4_0 = (
    "regime,agent,deployable,seed,merges,merges_per_hour,sync_excess_pct,additive_excess_pct,"
    "matched_random_mean,matched_random_p05,matched_random_p95,matched_random_additive_mean,"
    "oracle_same_budget_pct,oracle_additive_pct,oracle_schedule,scoring,replayed_schedules,"
    "additive_exact_gap_pp,no_sync_violation_pct,violation_pct,p95_ms,requests,excess_requests,"
    "return,duration_s,unit,window_start_s,window_end_s,independent,independent_units"
).split(",")
ORACLE_LABELS_0_5_0 = {
    "upper bound (best exact schedule found: exact local search from the additive optimum)": (
        "upper bound (exact replay of the additive optimum)"
    ),
}


def _info_0_4_0(info: dict) -> dict:
    return {k: v for k, v in info.items() if k not in NEW_INFO_KEYS}


def report_fingerprint(csv_bytes: bytes) -> str:
    """SHA-256 of a results.csv restricted to 0.4.0's columns, in 0.4.0's order, with the
    renamed oracle labels mapped back; the cells' text is compared as written (exact). On a
    0.4.0 results.csv it equals the file's own SHA-256 (the rewrite is byte-identical)."""
    import csv
    import io

    rows = list(csv.DictReader(io.StringIO(csv_bytes.decode())))
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(REPORT_COLUMNS_0_4_0)
    for r in rows:
        r["oracle_schedule"] = ORACLE_LABELS_0_5_0.get(r["oracle_schedule"], r["oracle_schedule"])
        w.writerow([r[c] for c in REPORT_COLUMNS_0_4_0])
    return hashlib.sha256(out.getvalue().encode()).hexdigest()


def _obs_parts(obs: np.ndarray) -> tuple[str, np.ndarray]:
    """The exact columns' digest and the float columns' raw values of stacked observations
    (the last axis is the feature axis)."""
    exact = np.ascontiguousarray(obs[..., list(EXACT_COLS)])
    return digest(exact), np.ascontiguousarray(obs[..., list(FLOAT_COLS)])


def single_episode(regime: str, skip_forced: bool, budget: int | None, seed: int) -> dict:
    """One single-env episode under random actions (``obs_floats``: the raw columns)."""
    from diloco_gym.envs.env import DiLoCoSyncEnv

    env = DiLoCoSyncEnv(regime=regime, skip_forced=skip_forced, merge_budget=budget)
    obs, info = env.reset(seed=seed)
    acts = np.random.default_rng(1000 + seed).integers(0, 2, size=100_000)
    all_obs, rewards, infos, masks, floats = [obs], [], [], [], []
    t = 0
    while True:
        masks.append(env.action_masks())
        obs, r, term, trunc, info = env.step(int(acts[t]))
        t += 1
        all_obs.append(obs)
        rewards.append(r)
        summary = info.pop("episode_summary", None)
        infos.append(_split_floats(_info_0_4_0(info), t, floats))
        if term or trunc:
            break
    obs_exact, obs_floats = _obs_parts(np.stack(all_obs))
    return {
        "steps": t,
        "obs": obs_exact,
        "obs_floats": obs_floats,
        "rewards": digest(np.array(rewards, dtype=np.float64)),
        "reward_sum": float(np.sum(rewards)),
        "masks": digest(np.stack(masks)),
        "infos": digest(np.frombuffer(json.dumps(_plain(infos)).encode(), dtype=np.uint8)),
        "info_floats": floats,
        "summary": _raw(summary),
    }


def vector_run(mode: str, pool: int | None) -> dict:
    """8 vector envs x 400 steps under random actions (``obs_floats``: the raw columns)."""
    from gymnasium.vector import AutoresetMode

    from diloco_gym.envs.vector import DiLoCoSyncVectorEnv

    env = DiLoCoSyncVectorEnv(
        VEC_ENVS, regime="bursty", episode_pool=pool, autoreset_mode=AutoresetMode[mode.upper()]
    )
    obs, info = env.reset(seed=7)
    rng = np.random.default_rng(99)
    h_obs, h_rew, h_flags, h_info, floats = [obs], [], [], [], []
    final_obs = []
    for t in range(1, VEC_STEPS + 1):
        a = rng.integers(0, 2, size=VEC_ENVS)
        obs, r, term, trunc, info = env.step(a)
        h_obs.append(obs)
        h_rew.append(r)
        h_flags.append(np.stack([term, trunc]))
        info = _info_0_4_0(info)
        fin = info.pop("final_obs", None)
        if fin is not None:  # same-step autoreset: the ended episodes' last observations
            for i in np.flatnonzero(info["_final_obs"]):
                final_obs.append(fin[i])
        h_info.append(_plain(_split_floats(info, t, floats)))
    obs_exact, obs_floats = _obs_parts(np.stack(h_obs))
    out = {
        "obs": obs_exact,
        "obs_floats": obs_floats,
        "rewards": digest(np.stack(h_rew)),
        "reward_sum": float(np.sum(h_rew)),
        "flags": digest(np.stack(h_flags)),
        "infos": digest(np.frombuffer(json.dumps(h_info).encode(), dtype=np.uint8)),
        "info_floats": floats,
    }
    if final_obs:
        out["final_obs"], out["final_obs_floats"] = _obs_parts(np.stack(final_obs))
    return out


def _store(entry: dict, key: str, arrays: dict) -> dict:
    """``entry`` with its float32 arrays moved into ``arrays`` under ``key`` (+ suffix)."""
    for name in ("obs_floats", "final_obs_floats"):
        if name in entry:
            arrays[f"{key}#{name}"] = entry.pop(name)
    return entry


def record() -> tuple[dict, dict]:
    out: dict[str, Any] = {"single": {}, "vector": {}}
    arrays: dict[str, np.ndarray] = {}
    for regime in REGIMES:
        for skip, budget in CASES:
            for seed in SEEDS:
                key = f"{regime}|skip={skip}|budget={budget}|seed={seed}"
                out["single"][key] = _store(
                    single_episode(regime, skip, budget, seed), f"single|{key}", arrays
                )
    for mode in ("next_step", "same_step"):
        for pool in (None, 4):
            key = f"{mode}|pool={pool}"
            out["vector"][key] = _store(vector_run(mode, pool), f"vector|{key}", arrays)
    return out, arrays


def load() -> tuple[dict, Any]:
    """The recorded references: the JSON document and the float32 arrays (an ``NpzFile``)."""
    return json.loads(REF_PATH.read_text()), np.load(OBS_PATH)


if __name__ == "__main__":
    import sys

    refs, arrays = record()
    if len(sys.argv) > 1:  # a report's results.csv to fingerprint as well
        refs["report_results_csv"] = hashlib.sha256(Path(sys.argv[1]).read_bytes()).hexdigest()
    else:  # keep the recorded one
        refs["report_results_csv"] = json.loads(REF_PATH.read_text())["report_results_csv"]
    REF_PATH.write_text(json.dumps(refs, sort_keys=True, separators=(",", ":")) + "\n")
    np.savez_compressed(OBS_PATH, **arrays)
    print(
        f"wrote {REF_PATH}, {OBS_PATH}: {len(refs['single'])} single, {len(refs['vector'])} vector"
    )
