"""``diloco-gym calibrate-learners``: real DiLoCo runs under a designed set of schedules,
the surrogate fit, its held-out validation, and the learner calibration file.

**Design** (every schedule at the same token budget, ``total_steps`` inner steps per
learner; every schedule run with each seed). The env's corridor ``[H_min, H_max]`` (128
and 512 env steps) is ``[h_lo, h_hi]`` inner steps (``env_steps_per_inner_step`` env steps
per inner step; default 32, so 4 and 16):

* fit set: fixed ``h_lo``, ``2 h_lo`` and ``h_hi``; two irregular schedules drawn like a
  matched-random baseline (the merge count of fixed ``2 h_lo``, gaps drawn at random inside
  the corridor); fragments ``F = 2`` and ``F = 4`` at fixed ``h_lo``; 16-, 8- and 4-bit
  pseudo-gradients at fixed ``2 h_lo``;
* held-out set (never seen by the fit): fixed ``1.5 h_lo`` and ``3 h_lo``; two irregular
  schedules with other merge counts; the gap sequences of two of the env's agents
  (``online-forecast`` and ``wa-diloco`` on the bursty regime, episode seed 0, gaps
  converted to inner steps); ``F = 2`` at ``2 h_lo``; 8 and 4 bits at ``h_lo``.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from diloco_gym.io import write_text_atomic
from diloco_gym.sim.learner_calibration import load_learner_calibration

__all__ = [
    "TINY",
    "DEFAULT_TARGET_EFFECT",
    "design",
    "check_disjoint",
    "gap_sequence",
    "mapping_plan",
    "calibrate_learners",
    "agent_gaps",
    "covering_steps",
    "episode_inner_steps",
]

#: The effect the design's power is stated for: a relative loss change of the corridor's
#: ends (fixed ``H_max`` against fixed ``H_min``), see docs/learners.md.
DEFAULT_TARGET_EFFECT = 0.01

#: The configuration the tests run (seconds, not minutes).
TINY: dict[str, Any] = {
    "num_learners": 2,
    "total_steps": 16,
    "batch_size": 2,
    "seq_len": 16,
    "d_model": 16,
    "n_layers": 1,
    "n_heads": 2,
    "eval_windows": 8,
    "inner_warmup": 2,
}


def _random_gaps(rng: np.random.Generator, n: int, total: int, lo: int, hi: int) -> list[int]:
    """``n`` gaps in ``[lo, hi]`` summing to ``total``: start at ``lo`` each and hand out
    the rest one step at a time to gaps drawn at random among those below ``hi``."""
    if not n * lo <= total <= n * hi:
        raise ValueError(f"{n} gaps in [{lo}, {hi}] cannot sum to {total}")
    gaps = [lo] * n
    for _ in range(total - n * lo):
        open_ = [i for i in range(n) if gaps[i] < hi]
        gaps[open_[int(rng.integers(len(open_)))]] += 1
    return gaps


def _from_gaps(gaps: list[int], total: int) -> list[int]:
    out, t = [], 0
    for g in gaps:
        if t + g > total:
            break
        t += g
        out.append(t)
    return out


def agent_gaps(
    agent: str, regime: str, seed: int, env_steps_per_inner_step: float, lo: int, hi: int
) -> list[int]:
    """The gaps of ``agent``'s merges in one env episode, in inner steps (rounded and kept
    inside ``[lo, hi]``)."""
    from diloco_gym.agents.registry import make_agent
    from diloco_gym.envs.env import DiLoCoSyncEnv
    from diloco_gym.eval.rollout import run_episode

    env = DiLoCoSyncEnv(regime=regime)
    summary = run_episode(env, make_agent(agent), seed=seed)
    times = np.asarray(summary["merge_times_s"], dtype=np.float64)
    steps = np.diff(np.concatenate([[0.0], times])) / env.params.step_seconds
    return [int(np.clip(round(g / env_steps_per_inner_step), lo, hi)) for g in steps]


def gap_sequence(schedule: list[int]) -> tuple[int, ...]:
    """The gaps between a schedule's merges (the first counted from step 0)."""
    return tuple(int(g) for g in np.diff([0, *schedule]))


def check_disjoint(plan: list[dict[str, Any]]) -> None:
    """``ValueError`` when a held-out schedule's gap sequence equals a fitted one's: the
    held-out set must test the surrogate on merge timings the fit never saw (fragments and
    bits aside, so that a held-out fragment or precision run is a new timing as well)."""
    fitted = {gap_sequence(p["schedule"]): p["name"] for p in plan if p["role"] == "fit"}
    for p in plan:
        if p["role"] == "heldout" and gap_sequence(p["schedule"]) in fitted:
            raise ValueError(
                f"held-out schedule {p['name']!r} has the gap sequence of the fitted "
                f"schedule {fitted[gap_sequence(p['schedule'])]!r}"
            )


def design(
    total: int,
    lo: int,
    hi: int,
    *,
    seed: int = 0,
    agent_schedules: dict[str, list[int]] | None = None,
) -> list[dict[str, Any]]:
    """The designed schedules: dicts with ``name``, ``role``, ``schedule``, ``fragments``,
    ``bits`` (see the module docstring). No held-out schedule shares its gap sequence with
    a fitted one (:func:`check_disjoint`): a random held-out schedule is redrawn until it
    does not, an agent's schedule that coincides with a fitted one is left out."""
    if not 1 <= lo < hi <= total:
        raise ValueError(f"corridor [{lo}, {hi}] must satisfy 1 <= lo < hi <= total ({total})")
    rng = np.random.default_rng([seed, 25])
    mid = min(2 * lo, hi)

    def fixed(h: int) -> list[int]:
        return list(range(h, total + 1, h))

    def rand(n: int) -> list[int]:
        n = max(1, min(n, total // lo))
        n = max(n, -(-total // hi))
        return _from_gaps(_random_gaps(rng, n, total, lo, hi), total)

    out: list[dict[str, Any]] = []

    def add(name: str, role: str, schedule: list[int], fragments: int = 1, bits: int = 32):
        out.append(
            {"name": name, "role": role, "schedule": schedule, "fragments": fragments, "bits": bits}
        )

    n_mid = len(fixed(mid))
    fit_h = sorted({h for h in (lo // 2, lo, mid, hi, 2 * hi) if 1 <= h and 2 * h <= total})
    fit_h = sorted(set(fit_h) | {lo, mid, hi})
    for h in fit_h:
        add(f"fixed-{h}", "fit", fixed(h))
    add("random-a", "fit", rand(n_mid))
    add("random-b", "fit", rand(n_mid))
    add(f"fixed-{lo}-F2", "fit", fixed(lo), fragments=2)
    add(f"fixed-{lo}-F4", "fit", fixed(lo), fragments=4)
    add(f"fixed-{mid}-8bit", "fit", fixed(mid), bits=8)
    add(f"fixed-{mid}-4bit", "fit", fixed(mid), bits=4)
    add(f"fixed-{mid}-16bit", "fit", fixed(mid), bits=16)
    seen = {gap_sequence(p["schedule"]) for p in out}
    held_h = [h for h in ((3 * lo) // 2, 3 * lo, (3 * hi) // 2) if h <= total]
    held_h = [h for h in dict.fromkeys(held_h) if gap_sequence(fixed(h)) not in seen]
    for h in held_h:
        add(f"fixed-{h}", "heldout", fixed(h))

    def fresh(n: int) -> list[int]:
        """A random schedule of about ``n`` merges whose gaps no fitted schedule has (``n``
        first, then one more or one fewer when every draw of ``n`` coincides)."""
        for k in (n, n + 1, n - 1, n + 2):
            for _ in range(100):
                s = rand(k)
                if gap_sequence(s) not in seen:
                    return s
        raise ValueError(f"no random schedule of about {n} merges differs from the fitted ones")

    add("random-c", "heldout", fresh(max(1, round(total / (1.5 * lo)))))
    add("random-d", "heldout", fresh(max(1, round(total / (0.75 * (lo + hi))))))
    for agent, gaps in (agent_schedules or {}).items():
        sched = _from_gaps(gaps, total)
        if sched and gap_sequence(sched) not in seen:
            add(f"agent-{agent}", "heldout", sched)
    h_f = held_h[0] if held_h else mid
    h_b = held_h[1] if len(held_h) > 1 else h_f
    add(f"fixed-{h_f}-F2", "heldout", fixed(h_f), fragments=2)
    add(f"fixed-{h_b}-8bit", "heldout", fixed(h_b), bits=8)
    add(f"fixed-{h_b}-4bit", "heldout", fixed(h_b), bits=4)
    check_disjoint(out)
    return out


def mapping_plan(total: int, lo: int, hi: int) -> list[dict[str, Any]]:
    """The mapping check's schedules: the corridor's two ends, fixed ``lo`` and ``hi`` inner
    steps, at a budget of ``total`` inner steps (role ``"mapping"``; run with every seed)."""
    return [
        {
            "name": f"map-fixed-{h}",
            "role": "mapping",
            "schedule": list(range(h, total + 1, h)),
            "fragments": 1,
            "bits": 32,
            "total_steps": total,
        }
        for h in (lo, hi)
    ]


def episode_inner_steps(env_steps_per_inner_step: float, regime: str = "bursty") -> float:
    """One env episode of ``regime`` in inner steps: its duration over ``step_seconds``
    env steps, over the mapping."""
    from diloco_gym.envs.params import EnvParams
    from diloco_gym.sim.regimes import REGIMES

    ep = EnvParams()
    return REGIMES[regime].duration_s / ep.step_seconds / env_steps_per_inner_step


def covering_steps(env_steps_per_inner_step: float) -> int:
    """The default budget: the shortest whole number of ``2 * hi`` inner steps that covers
    one env episode (so fixed ``2 hi`` merges a whole number of times and fixed ``hi`` at
    least twice as often)."""
    _lo, hi, _ = _corridor(env_steps_per_inner_step)
    block = 2 * hi
    return int(block * np.ceil(episode_inner_steps(env_steps_per_inner_step) / block - 1e-9))


def calibrate_learners(
    *,
    out: str | Path,
    seeds: int = 3,
    heldout_seeds: int = 1,
    config: dict[str, Any] | None = None,
    env_steps_per_inner_step: float = 32.0,
    mapping_check: float | None = None,
    target_effect: float = DEFAULT_TARGET_EFFECT,
    bootstrap: int = 100,
    agents: tuple[str, ...] = ("online-forecast", "wa-diloco"),
    command: str = "",
    corpus_dir: str | Path | None = None,
    max_bytes: int = 8_000_000,
    progress: Callable[[str], None] | None = None,
    resume: bool = False,
    jobs: int = 1,
) -> dict[str, Any]:
    """Run the design, fit, validate and write the calibration file ``out``; returns the
    document. Every schedule runs with every seed (common random numbers); the fit sees
    the fit schedules on the first ``seeds - heldout_seeds`` seeds, the validation is the
    held-out schedules on the last ``heldout_seeds`` (and, for comparison, on the fit
    seeds); the paired effects (:mod:`diloco_gym.lm.effects`) use all seeds, with the
    power stated for ``target_effect`` (a relative loss change). ``mapping_check``: a
    second mapping at which the corridor's ends also run, each covering one episode there.
    Each finished run is appended to ``<out>.runs.jsonl``; ``resume`` reuses the runs
    logged there with the same trainer configuration. ``jobs`` trainings run at once.
    """
    from diloco_gym.lm.data import load_corpus
    from diloco_gym.lm.trainer import TinyLM, TrainConfig

    say = progress or (lambda s: None)
    if seeds < 2 or not 1 <= heldout_seeds <= seeds - 2:
        raise ValueError(
            f"seeds ({seeds}) must leave >= 2 fit seeds after {heldout_seeds} held-out "
            "seed(s) (intervals resample the fit seeds), and at least 1 seed is held out"
        )
    cfg = TrainConfig(**(config or {}))
    lo, hi, env_mapping = _corridor(env_steps_per_inner_step)
    corpus = load_corpus(corpus_dir, max_bytes=max_bytes)
    plan = _plan(cfg.total_steps, env_steps_per_inner_step, mapping_check, agents)
    say(
        f"calibrate-learners: {len(plan)} schedules x {seeds} seeds = {len(plan) * seeds} "
        f"runs of {cfg.total_steps} inner steps x {cfg.num_learners} learners "
        f"({sum(p.numel() for p in TinyLM(cfg).parameters())} parameters; "
        f"one episode is {episode_inner_steps(env_steps_per_inner_step):.0f} inner steps)"
    )
    started = (time.perf_counter(), time.process_time())
    log = Path(f"{out}.runs.jsonl")
    done = _logged_runs(log, asdict(cfg), resume, say)
    spec = (None if corpus_dir is None else str(corpus_dir), max_bytes)
    runs = _run_design(corpus, cfg, plan, seeds, done, log, say, started[0], jobs, spec)
    split = {
        "fit": list(range(seeds - heldout_seeds)),
        "heldout": list(range(seeds - heldout_seeds, seeds)),
    }
    fit = _fit(runs, env_mapping, bootstrap, say, split)
    effects = _effects(runs, (lo, hi), target_effect, mapping_check, env_steps_per_inner_step, say)
    doc = _document(
        fit,
        runs,
        cfg,
        corpus,
        env_mapping=env_mapping,
        command=command,
        split=split,
        corridor=(lo, hi),
        bootstrap=bootstrap,
        started=started,
        effects=effects,
    )
    load_learner_calibration(doc)  # the document must pass its own schema
    path = Path(out)
    write_text_atomic(path, json.dumps(doc, indent=1) + "\n")
    say(f"wrote {path}")
    return doc


def _plan(
    total: int, mapping: float, mapping_check: float | None, agents: tuple[str, ...]
) -> list[dict[str, Any]]:
    """The design at ``mapping`` (with the gaps of ``agents``' bursty episode 0) and, with a
    ``mapping_check``, the corridor's ends at that mapping."""
    lo, hi, _ = _corridor(mapping)
    gaps = {a: agent_gaps(a, "bursty", 0, mapping, lo, hi) for a in agents}
    plan = design(total, lo, hi, agent_schedules=gaps)
    if mapping_check is not None:
        lo2, hi2, _ = _corridor(mapping_check)
        plan += mapping_plan(covering_steps(mapping_check), lo2, hi2)
    return plan


def _corridor(env_steps_per_inner_step: float) -> tuple[int, int, dict[str, float]]:
    """The env's corridor ``[H_min, H_max]`` in inner steps, ``(lo, hi)`` (at least one
    step apart), and the env mapping the calibration file records."""
    from diloco_gym.envs.params import EnvParams

    ep = EnvParams()
    lo = max(1, round(ep.h_min_steps / env_steps_per_inner_step))
    hi = max(lo + 1, round(ep.h_max_steps / env_steps_per_inner_step))
    env_mapping = {
        "env_steps_per_inner_step": float(env_steps_per_inner_step),
        "step_seconds": float(ep.step_seconds),
    }
    return lo, hi, env_mapping


def _trainer_of(cfg: Any, item: dict[str, Any]) -> dict[str, Any]:
    """The trainer configuration ``item`` runs with (its own budget when it has one)."""
    return {**asdict(cfg), "total_steps": item.get("total_steps", cfg.total_steps)}


def _logged_runs(
    log: Path, trainer: dict[str, Any], resume: bool, say: Callable[[str], None]
) -> dict[tuple, dict[str, Any]]:
    """The runs of ``log`` made with the trainer configuration ``trainer`` (any budget), by
    ``(name, seed, schedule)``, when ``resume``; otherwise none, and a previous log is
    removed. A line that is not JSON is a ``ValueError`` naming it."""
    done: dict[tuple, dict[str, Any]] = {}
    same = {k: v for k, v in trainer.items() if k != "total_steps"}
    if resume and log.exists():
        for n, line in enumerate(log.read_text(encoding="utf-8").splitlines(), 1):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                raise ValueError(f"{log}: line {n} is not valid JSON") from None
            t = rec.get("trainer")
            if isinstance(t, dict) and {k: v for k, v in t.items() if k != "total_steps"} == same:
                done[(rec["name"], rec["seed"], tuple(rec["schedule"]), t.get("total_steps"))] = rec
        say(f"resume: {len(done)} runs of this configuration found in {log}")
    elif log.exists():
        log.unlink()
    return done


@functools.lru_cache(maxsize=2)
def _worker_corpus(corpus_dir: str | None, max_bytes: int) -> Any:
    from diloco_gym.lm.data import load_corpus

    return load_corpus(corpus_dir, max_bytes=max_bytes)


def _train(corpus: Any, trainer: dict[str, Any], item: dict[str, Any], seed: int) -> dict:
    """One run of the design: ``item`` with ``seed``, as the record the log keeps."""
    from diloco_gym.lm import trainer as lm_trainer

    r = lm_trainer.run_diloco(
        corpus,
        lm_trainer.TrainConfig(**trainer),
        item["schedule"],
        fragments=item["fragments"],
        bits=item["bits"],
        seed=seed,
    )
    return {
        **item,
        "seed": seed,
        "initial_loss": r.initial_loss,
        "merge_losses": r.merge_losses,
        "seconds": round(r.seconds, 2),
    }


def _train_cell(cell: tuple) -> dict:
    """A worker's run (:func:`diloco_gym.backends.run_cells`): the corpus named by
    ``(corpus_dir, max_bytes)`` is read once per worker process."""
    spec, trainer, item, seed = cell
    return _train(_worker_corpus(*spec), trainer, item, seed)


def _run_design(
    corpus: Any,
    cfg: Any,
    plan: list[dict[str, Any]],
    seeds: int,
    done: dict[tuple, dict[str, Any]],
    log: Path,
    say: Callable[[str], None],
    t0: float,
    jobs: int = 1,
    spec: tuple[str | None, int] = (None, 0),
) -> list[dict[str, Any]]:
    """Every schedule of ``plan`` with every seed, in the order seed by seed: a logged run
    of ``done`` is reused, any other is trained (in this process, or with ``jobs > 1`` in
    that many worker processes that read the corpus ``spec``) and appended to ``log`` with
    its trainer configuration as it finishes. Progress (time since ``t0``) goes to ``say``."""
    from diloco_gym.backends import run_cells

    order = [(seed, item) for seed in range(seeds) for item in plan]
    runs: list[dict[str, Any] | None] = [None] * len(order)
    todo = []
    for i, (seed, item) in enumerate(order):
        trainer = _trainer_of(cfg, item)
        key = (item["name"], seed, tuple(item["schedule"]), trainer["total_steps"])
        if key in done:
            runs[i] = {k: v for k, v in done[key].items() if k != "trainer"}
        else:
            todo.append((i, (spec, trainer, item, seed)))
    finished = 0

    def store(j: int, rec: dict[str, Any]) -> None:
        nonlocal finished
        i, (_spec, trainer, item, seed) = todo[j]
        runs[i] = rec
        with log.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({**rec, "trainer": trainer}) + "\n")
        finished += 1
        elapsed = time.perf_counter() - t0
        final = rec["merge_losses"][-1]
        say(
            f"[{i + 1}/{len(order)}] {item['name']:<24} seed {seed}: final loss {final:.4f} "
            f"({rec['seconds']:.1f} s; {elapsed / 60:.1f} min so far, "
            f"~{elapsed / finished * (len(todo) - finished) / 60:.1f} min left)"
        )

    if jobs > 1 and len(todo) > 1:
        run_cells(_train_cell, [c for _i, c in todo], "processes", jobs, on_result=store)
    else:
        for j, (_i, (_spec, trainer, item, seed)) in enumerate(todo):
            store(j, _train(corpus, trainer, item, seed))
    return [r for r in runs if r is not None]


def _fit(
    runs: list[dict[str, Any]],
    env_mapping: dict[str, float],
    bootstrap: int,
    say: Callable[[str], None],
    split: dict[str, list[int]],
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The surrogate fitted to the fit schedules on the fit seeds, its bootstrap intervals
    over those seeds (``bootstrap`` draws) and its validation (with the fit's rms
    residual): ``(calibration, intervals, validation)``. The validation's top level is the
    held-out schedules on the held-out seeds; ``heldout_schedules_fit_seeds`` and
    ``fit_schedules_heldout_seeds`` are the two half-untouched comparisons."""
    from diloco_gym.lm.fit import bootstrap_intervals, fit_surrogate, validate

    def pick(role: str, part: str) -> list[dict[str, Any]]:
        return [r for r in runs if r["role"] == role and int(r["seed"]) in split[part]]

    fit_runs = pick("fit", "fit")
    cal, rms = fit_surrogate(fit_runs, env_mapping)
    say(f"fit: rms residual {rms:.4f} nats/byte; bootstrap over seeds ({bootstrap} draws)")
    intervals = bootstrap_intervals(fit_runs, cal, env_mapping, reps=bootstrap)
    val = validate(pick("heldout", "heldout"), cal)
    val["fit_rms"] = rms
    val["seeds"] = split["heldout"]
    val["heldout_schedules_fit_seeds"] = validate(pick("heldout", "fit"), cal)
    val["fit_schedules_heldout_seeds"] = validate(pick("fit", "heldout"), cal)
    say(
        f"held-out (schedules and seeds): Spearman rho {val['spearman_rho']} "
        f"(permutation p {val['spearman_p']}), MAE {val['mae']:.4f} over "
        f"{val['schedules']} schedules"
    )
    return cal, intervals, val


def _effects(
    runs: list[dict[str, Any]],
    corridor: tuple[int, int],
    target: float,
    mapping_check: float | None,
    mapping: float,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """The paired schedule effects (:func:`diloco_gym.lm.effects.schedule_effects`) and,
    with a mapping check, the corridor's ends at both mappings."""
    from diloco_gym.lm.effects import mapping_effects, schedule_effects

    out = schedule_effects(runs, corridor, target)
    c = out["contrast"]
    say(
        f"paired effect fixed-{corridor[1]} - fixed-{corridor[0]}: {c['mean']:+.4f} nats/byte "
        f"({c['relative_pct']:+.2f} %), p {c['p_value']:.3g} over {c['n']} seeds; "
        f"{out['power']['verdict']}"
    )
    if mapping_check is not None:
        lo2, hi2, _ = _corridor(mapping_check)
        out["mapping_check"] = mapping_effects(runs, {mapping: corridor, mapping_check: (lo2, hi2)})
    return out


def _document(
    fit: tuple[Any, dict[str, Any], dict[str, Any]],
    runs: list[dict[str, Any]],
    cfg: Any,
    corpus: Any,
    *,
    env_mapping: dict[str, float],
    command: str,
    split: dict[str, list[int]],
    corridor: tuple[int, int],
    bootstrap: int,
    started: tuple[float, float],
    effects: dict[str, Any],
) -> dict[str, Any]:
    """The calibration document: the fitted parameters, intervals, env mapping,
    validation, the paired effects, every run, and what produced them (trainer, corpus,
    versions, machine, wall and CPU time since ``started``, a ``(perf_counter,
    process_time)`` pair)."""
    import torch

    from diloco_gym.lm.trainer import TinyLM

    cal, intervals, val = fit
    episode = episode_inner_steps(env_mapping["env_steps_per_inner_step"])
    return {
        "format": "diloco-gym-learner-calibration/1",
        "params": cal.to_dict(),
        "intervals": intervals,
        "env_mapping": env_mapping,
        "validation": val,
        "effects": effects,
        "runs": runs,
        "meta": {
            "command": command,
            "trainer": asdict(cfg),
            "parameters": sum(p.numel() for p in TinyLM(cfg).parameters()),
            "seeds": len(split["fit"]) + len(split["heldout"]),
            "fit_seeds": split["fit"],
            "heldout_seeds": split["heldout"],
            "common_random_numbers": "a seed fixes the initial model and every learner's "
            "batches, whatever the schedule; learners run at equal speed",
            "episode_inner_steps": round(episode, 2),
            "covers_episode": bool(cfg.total_steps >= episode),
            "corridor_inner_steps": list(corridor),
            "quantiser": "per-tensor uniform min-max, nearest rounding, full-precision mean",
            "corpus": {
                "source": "Python standard library *.py files (byte level)",
                "python": platform.python_version(),
                "train_files": corpus.train_files,
                "heldout_files": corpus.heldout_files,
                "train_bytes": int(len(corpus.train)),
                "heldout_bytes": int(len(corpus.heldout)),
                "sha256": corpus.digest,
            },
            "torch": torch.__version__,
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "wall_seconds": round(time.perf_counter() - started[0], 1),
            "cpu_seconds": round(time.process_time() - started[1], 1),
            "runs_seconds": round(sum(r["seconds"] for r in runs), 1),
            "bootstrap_draws": bootstrap,
        },
    }


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
