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

__all__ = ["TINY", "design", "calibrate_learners", "agent_gaps"]

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


def design(
    total: int,
    lo: int,
    hi: int,
    *,
    seed: int = 0,
    agent_schedules: dict[str, list[int]] | None = None,
) -> list[dict[str, Any]]:
    """The designed schedules: dicts with ``name``, ``role``, ``schedule``, ``fragments``,
    ``bits`` (see the module docstring)."""
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
    add(f"fixed-{lo}", "fit", fixed(lo))
    add(f"fixed-{mid}", "fit", fixed(mid))
    add(f"fixed-{hi}", "fit", fixed(hi))
    add("random-a", "fit", rand(n_mid))
    add("random-b", "fit", rand(n_mid))
    add(f"fixed-{lo}-F2", "fit", fixed(lo), fragments=2)
    add(f"fixed-{lo}-F4", "fit", fixed(lo), fragments=4)
    add(f"fixed-{mid}-8bit", "fit", fixed(mid), bits=8)
    add(f"fixed-{mid}-4bit", "fit", fixed(mid), bits=4)
    add(f"fixed-{mid}-16bit", "fit", fixed(mid), bits=16)
    h15 = max(lo + 1, (3 * lo) // 2) if lo > 1 else 2
    h3 = min(hi, 3 * lo)
    add(f"fixed-{h15}", "heldout", fixed(h15))
    if h3 != hi:
        add(f"fixed-{h3}", "heldout", fixed(h3))
    add("random-c", "heldout", rand(max(1, round(total / (1.5 * lo)))))
    add("random-d", "heldout", rand(max(1, round(total / (0.75 * (lo + hi))))))
    for agent, gaps in (agent_schedules or {}).items():
        sched = _from_gaps(gaps, total)
        if sched:
            add(f"agent-{agent}", "heldout", sched)
    add(f"fixed-{mid}-F2", "heldout", fixed(mid), fragments=2)
    add(f"fixed-{lo}-8bit", "heldout", fixed(lo), bits=8)
    add(f"fixed-{lo}-4bit", "heldout", fixed(lo), bits=4)
    return out


def calibrate_learners(
    *,
    out: str | Path,
    seeds: int = 3,
    config: dict[str, Any] | None = None,
    env_steps_per_inner_step: float = 32.0,
    bootstrap: int = 100,
    agents: tuple[str, ...] = ("online-forecast", "wa-diloco"),
    command: str = "",
    corpus_dir: str | Path | None = None,
    max_bytes: int = 8_000_000,
    progress: Callable[[str], None] | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Run the design, fit, validate and write the calibration file ``out``.

    Every finished run is appended to ``<out>.runs.jsonl`` (with the trainer
    configuration); with ``resume`` the runs found there for the same configuration are
    reused instead of trained again (a killed calibration continues; a finished one is
    refitted). Returns the calibration document (what ``out`` holds).

    The steps: the env's corridor in inner steps (:func:`_corridor`), the design
    (:func:`design`, with the gaps of :func:`agent_gaps`), the logged runs to reuse
    (:func:`_logged_runs`), the runs (:func:`_run_design`), the fit and its held-out
    validation (:func:`_fit`), and the document (:func:`_document`), which must pass its
    own schema before it is written.
    """
    from diloco_gym.lm.data import load_corpus
    from diloco_gym.lm.trainer import TinyLM, TrainConfig

    say = progress or (lambda s: None)
    if seeds < 2:
        raise ValueError(f"seeds must be >= 2 (intervals resample seeds), got {seeds}")
    cfg = TrainConfig(**(config or {}))
    lo, hi, env_mapping = _corridor(env_steps_per_inner_step)
    corpus = load_corpus(corpus_dir, max_bytes=max_bytes)
    gaps = {a: agent_gaps(a, "bursty", 0, env_steps_per_inner_step, lo, hi) for a in agents}
    plan = design(cfg.total_steps, lo, hi, agent_schedules=gaps)
    say(
        f"calibrate-learners: {len(plan)} schedules x {seeds} seeds = {len(plan) * seeds} "
        f"runs of {cfg.total_steps} inner steps x {cfg.num_learners} learners "
        f"({sum(p.numel() for p in TinyLM(cfg).parameters())} parameters)"
    )
    started = (time.perf_counter(), time.process_time())
    log = Path(f"{out}.runs.jsonl")
    done = _logged_runs(log, asdict(cfg), resume, say)
    runs = _run_design(corpus, cfg, plan, seeds, done, log, say, started[0])
    fit = _fit(runs, env_mapping, bootstrap, say)
    doc = _document(
        fit,
        runs,
        cfg,
        corpus,
        env_mapping=env_mapping,
        command=command,
        seeds=seeds,
        corridor=(lo, hi),
        bootstrap=bootstrap,
        started=started,
    )
    load_learner_calibration(doc)  # the document must pass its own schema
    path = Path(out)
    write_text_atomic(path, json.dumps(doc, indent=1) + "\n")
    say(f"wrote {path}")
    return doc


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


def _logged_runs(
    log: Path, trainer: dict[str, Any], resume: bool, say: Callable[[str], None]
) -> dict[tuple, dict[str, Any]]:
    """The runs of ``log`` made with the trainer configuration ``trainer``, by ``(name,
    seed, schedule)``, when ``resume``; otherwise none, and a previous log is removed.
    A line that is not JSON is a ``ValueError`` naming it."""
    done: dict[tuple, dict[str, Any]] = {}
    if resume and log.exists():
        for n, line in enumerate(log.read_text(encoding="utf-8").splitlines(), 1):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                raise ValueError(f"{log}: line {n} is not valid JSON") from None
            if rec.get("trainer") == trainer:
                done[(rec["name"], rec["seed"], tuple(rec["schedule"]))] = rec
        say(f"resume: {len(done)} runs of this configuration found in {log}")
    elif log.exists():
        log.unlink()
    return done


def _run_design(
    corpus: Any,
    cfg: Any,
    plan: list[dict[str, Any]],
    seeds: int,
    done: dict[tuple, dict[str, Any]],
    log: Path,
    say: Callable[[str], None],
    t0: float,
) -> list[dict[str, Any]]:
    """Every schedule of ``plan`` with every seed: a logged run of ``done`` is reused, any
    other is trained (:func:`~diloco_gym.lm.trainer.run_diloco`) and appended to ``log``
    with the trainer configuration. Progress (time since ``t0``) goes to ``say``."""
    from diloco_gym.lm.trainer import run_diloco

    n_runs = len(plan) * seeds
    runs: list[dict[str, Any]] = []
    i = 0
    for seed in range(seeds):
        for item in plan:
            i += 1
            key = (item["name"], seed, tuple(item["schedule"]))
            if key in done:
                runs.append({k: v for k, v in done[key].items() if k != "trainer"})
                continue
            r = run_diloco(
                corpus,
                cfg,
                item["schedule"],
                fragments=item["fragments"],
                bits=item["bits"],
                seed=seed,
            )
            runs.append(
                {
                    **item,
                    "seed": seed,
                    "initial_loss": r.initial_loss,
                    "merge_losses": r.merge_losses,
                    "seconds": round(r.seconds, 2),
                }
            )
            with log.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps({**runs[-1], "trainer": asdict(cfg)}) + "\n")
            elapsed = time.perf_counter() - t0
            say(
                f"[{i}/{n_runs}] {item['name']:<24} seed {seed}: final loss "
                f"{r.final_loss:.4f} ({r.seconds:.1f} s; {elapsed / 60:.1f} min so far, "
                f"~{elapsed / i * (n_runs - i) / 60:.1f} min left)"
            )
    return runs


def _fit(
    runs: list[dict[str, Any]],
    env_mapping: dict[str, float],
    bootstrap: int,
    say: Callable[[str], None],
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The surrogate fitted to the fit runs, its bootstrap intervals over seeds
    (``bootstrap`` draws) and its validation on the held-out runs (with the fit's rms
    residual): ``(calibration, intervals, validation)``."""
    from diloco_gym.lm.fit import bootstrap_intervals, fit_surrogate, validate

    fit_runs = [r for r in runs if r["role"] == "fit"]
    held = [r for r in runs if r["role"] == "heldout"]
    cal, rms = fit_surrogate(fit_runs, env_mapping)
    say(f"fit: rms residual {rms:.4f} nats/byte; bootstrap over seeds ({bootstrap} draws)")
    intervals = bootstrap_intervals(fit_runs, cal, env_mapping, reps=bootstrap)
    val = validate(held, cal)
    val["fit_rms"] = rms
    say(
        f"held-out: Spearman rho {val['spearman_rho']}, MAE {val['mae']:.4f} over "
        f"{val['schedules']} schedules"
    )
    return cal, intervals, val


def _document(
    fit: tuple[Any, dict[str, Any], dict[str, Any]],
    runs: list[dict[str, Any]],
    cfg: Any,
    corpus: Any,
    *,
    env_mapping: dict[str, float],
    command: str,
    seeds: int,
    corridor: tuple[int, int],
    bootstrap: int,
    started: tuple[float, float],
) -> dict[str, Any]:
    """The calibration document: the fitted parameters, intervals, env mapping,
    validation, every run, and what produced them (trainer, corpus, versions, machine,
    wall and CPU time since ``started``, a ``(perf_counter, process_time)`` pair)."""
    import torch

    from diloco_gym.lm.trainer import TinyLM

    cal, intervals, val = fit
    return {
        "format": "diloco-gym-learner-calibration/1",
        "params": cal.to_dict(),
        "intervals": intervals,
        "env_mapping": env_mapping,
        "validation": val,
        "runs": runs,
        "meta": {
            "command": command,
            "trainer": asdict(cfg),
            "parameters": sum(p.numel() for p in TinyLM(cfg).parameters()),
            "seeds": seeds,
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
