"""Reference fingerprints of the envs' outputs, recorded from diloco-gym 0.4.0 (the NumPy
kernel) and checked against the compiled kernel by ``tests/envs/test_compiled_equivalence.py``.

``python -m tests.envs.compiled_refs`` rewrites ``tests/data/compiled_refs.json``; it was run
once on the 0.4.0 code, before the compiled kernel replaced it, and must not be re-run to make
a failing equivalence test pass.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

REF_PATH = Path(__file__).resolve().parents[1] / "data" / "compiled_refs.json"
REGIMES = ("ordinary", "pressure-heavy", "sync-heavy", "bursty", "non-periodic")
SEEDS = range(5)
#: (skip_forced, merge_budget) cases of the single env.
CASES = ((True, None), (False, None), (True, 12), (False, 12))
VEC_ENVS, VEC_STEPS = 8, 400


def digest(*arrays: Any) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(np.asarray(a))
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:32]


def _plain(x: Any) -> Any:
    """JSON-safe copy of an info value (floats by repr, so the comparison is exact)."""
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


def single_episode(regime: str, skip_forced: bool, budget: int | None, seed: int) -> dict:
    from diloco_gym.envs.env import DiLoCoSyncEnv

    env = DiLoCoSyncEnv(regime=regime, skip_forced=skip_forced, merge_budget=budget)
    obs, info = env.reset(seed=seed)
    acts = np.random.default_rng(1000 + seed).integers(0, 2, size=100_000)
    all_obs, rewards, infos, masks = [obs], [], [], []
    t = 0
    while True:
        masks.append(env.action_masks())
        obs, r, term, trunc, info = env.step(int(acts[t]))
        t += 1
        all_obs.append(obs)
        rewards.append(r)
        summary = info.pop("episode_summary", None)
        infos.append(_info_0_4_0(info))
        if term or trunc:
            break
    return {
        "steps": t,
        "obs": digest(np.stack(all_obs)),
        "rewards": digest(np.array(rewards, dtype=np.float64)),
        "reward_sum": repr(float(np.sum(rewards))),
        "masks": digest(np.stack(masks)),
        "infos": digest(np.frombuffer(json.dumps(_plain(infos)).encode(), dtype=np.uint8)),
        "summary": _plain(summary),
    }


def vector_run(mode: str, pool: int | None) -> dict:
    from gymnasium.vector import AutoresetMode

    from diloco_gym.envs.vector import DiLoCoSyncVectorEnv

    env = DiLoCoSyncVectorEnv(
        VEC_ENVS, regime="bursty", episode_pool=pool, autoreset_mode=AutoresetMode[mode.upper()]
    )
    obs, info = env.reset(seed=7)
    rng = np.random.default_rng(99)
    h_obs, h_rew, h_flags, h_info = [obs], [], [], []
    for _ in range(VEC_STEPS):
        a = rng.integers(0, 2, size=VEC_ENVS)
        obs, r, term, trunc, info = env.step(a)
        h_obs.append(obs)
        h_rew.append(r)
        h_flags.append(np.stack([term, trunc]))
        h_info.append(_plain(_info_0_4_0(info)))
    return {
        "obs": digest(np.stack(h_obs)),
        "rewards": digest(np.stack(h_rew)),
        "reward_sum": repr(float(np.sum(h_rew))),
        "flags": digest(np.stack(h_flags)),
        "infos": digest(np.frombuffer(json.dumps(h_info).encode(), dtype=np.uint8)),
    }


def record() -> dict:
    out: dict[str, Any] = {"single": {}, "vector": {}}
    for regime in REGIMES:
        for skip, budget in CASES:
            for seed in SEEDS:
                key = f"{regime}|skip={skip}|budget={budget}|seed={seed}"
                out["single"][key] = single_episode(regime, skip, budget, seed)
    for mode in ("next_step", "same_step"):
        for pool in (None, 4):
            out["vector"][f"{mode}|pool={pool}"] = vector_run(mode, pool)
    return out


if __name__ == "__main__":
    import sys

    refs = record()
    if len(sys.argv) > 1:  # a report's results.csv to fingerprint as well
        refs["report_results_csv"] = hashlib.sha256(Path(sys.argv[1]).read_bytes()).hexdigest()
    REF_PATH.write_text(json.dumps(refs, indent=1, sort_keys=True) + "\n")
    print(f"wrote {REF_PATH} ({len(refs['single'])} single, {len(refs['vector'])} vector)")
