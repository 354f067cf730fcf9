"""The episode bank: the agent-independent arrays of a batch of episodes, one row per slot.

The vector env keeps its episodes here (fresh episodes in slot ``i`` of env ``i``; an
episode pool holds ``K`` episodes that envs point into). A row holds what a step needs
without a Python object per episode: the exogenous observation features per decision, the
episode's scalars (length, reward scale, learner throughputs, seed) and either a row of a
:class:`~diloco_gym.sim.sidecar.CostQueue` (fresh episodes: merges are costed lazily, only
when launched) or every decision's cost (pool episodes, costed once and reused).

Episodes are built by :func:`build_rows` from seeds: the draws of each episode come from
:func:`diloco_gym.envs.kernel.episode_draws` (the fixed draw order the single env uses
too), and :func:`diloco_gym.envs.episode.episode_core_batch` computes up to
:data:`BUILD_CHUNK` of them in array passes, bit-identical per episode.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from diloco_gym.envs.episode import (
    EpisodeCore,
    core_setup,
    decision_costs,
    episode_core,
    episode_core_batch,
    pressure_rows,
)
from diloco_gym.envs.kernel import (
    episode_draws,
    episode_draws_batch,
    is_synthetic,
    max_merges,
    synthetic_draws,
)
from diloco_gym.envs.observation import EXO_SLICE
from diloco_gym.envs.params import EnvParams
from diloco_gym.envs.reward import reward_per_request
from diloco_gym.sim import compiled
from diloco_gym.sim import learners as lrn
from diloco_gym.sim.sidecar import (
    CostQueue,
    SidecarParams,
    cost_horizon,
    cost_queue_into,
    isolated_merge_costs,
)

__all__ = ["BuildSpec", "EpisodeBank", "build_rows", "BUILD_CHUNK"]


class BuildSpec(NamedTuple):
    """What building an episode needs (a picklable value: building is a pure function of it)."""

    generator: Any
    params: EnvParams
    sidecar: SidecarParams
    learner_params: lrn.LearnerParams
    horizon: int  # bins a merge's cost is followed for (sidecar.cost_horizon)
    rate_rps: float  # nominal rate of the reward scale (reward.nominal_rate_rps)


#: Episodes built together at most: bounds the temporaries of a reset wave and keeps them in
#: cache (the choice is measured in benchmarks/README.md).
BUILD_CHUNK = 32


def build_rows(spec: BuildSpec, seeds: list[int], parallel: bool = False) -> list[dict[str, Any]]:
    """The bank rows of the episodes of ``seeds``, in order, as a list of batches (dicts of
    arrays with a leading episode axis).

    The draws are made one episode at a time (each from its own seeded generator, as the
    single env), then :func:`episode.episode_core_batch` and :func:`sidecar.cost_queue` run over
    up to :data:`BUILD_CHUNK` episodes in array passes (bit-identical per episode; tested).
    Traces of different durations, or with and without pressure series, go one by one.
    A pure function of its arguments (``parallel``: the compiled builds' parallel variants,
    the same result).
    """
    out = []
    for lo in range(0, len(seeds), BUILD_CHUNK):
        chunk = list(range(lo, min(len(seeds), lo + BUILD_CHUNK)))
        if is_synthetic(spec.generator):  # one duration: the draws stay concatenated
            out.append(_synthetic_rows(spec, [seeds[k] for k in chunk], parallel))
            continue
        draws = episode_draws_batch(spec.generator, [seeds[k] for k in chunk], spec.learner_params)
        if _one_batch(draws):
            out.append(_rows(spec, [seeds[k] for k in chunk], draws, parallel))
        else:
            out.extend(_rows(spec, [seeds[k]], [d]) for k, d in zip(chunk, draws, strict=True))
    return out


def _one_batch(draws: list[tuple]) -> bool:
    """Whether traces' draws (:func:`episode_draws_batch`) build as one batch: one duration,
    and all with pressure series or all without (else they are built one by one)."""
    return (
        len({d[5] for d in draws}) == 1 and len({d[3] is None or d[4] is None for d in draws}) == 1
    )


def _synthetic_rows(spec: BuildSpec, seeds: list[int], parallel: bool) -> dict[str, Any]:
    """:func:`_rows` of a synthetic regime's episodes, the requests never split per episode."""
    gen, p = spec.generator, spec.params
    arrivals, prompt, output, counts, pressure, thr = synthetic_draws(
        gen, seeds, spec.learner_params
    )
    c = episode_core_batch(
        arrivals, prompt, output, pressure[:, 0], pressure[:, 1], gen.duration_s, p,
        spec.sidecar, gen.name, counts=counts, parallel=parallel,
    )  # fmt: skip
    return _bank_row(spec, seeds, c, thr, gen.duration_s)


def _rows(spec: BuildSpec, seeds: list[int], draws: list, parallel: bool = False) -> dict[str, Any]:
    """Bank rows of same-duration ``draws``: the episode arrays and the cost queue."""
    p, sc = spec.params, spec.sidecar
    has_p = draws[0][3] is not None and draws[0][4] is not None
    c = episode_core_batch(
        [d[0] for d in draws],
        [d[1] for d in draws],
        [d[2] for d in draws],
        np.stack([d[3] for d in draws]) if has_p else None,
        np.stack([d[4] for d in draws]) if has_p else None,
        draws[0][5],
        p,
        sc,
        draws[0][6],
        parallel=parallel,
    )
    return _bank_row(spec, seeds, c, np.stack([d[7] for d in draws]), draws[0][5])


def _bank_row(spec: BuildSpec, seeds: list[int], c: EpisodeCore, thr, duration_s):
    """The bank rows of the episodes of :class:`episode.EpisodeCore` ``c``."""
    assert c.counts is not None  # episode_core_batch fills it
    n, di = c.n, spec.params.decision_interval
    return {
        "seeds": np.asarray(seeds, dtype=np.int64),
        "n": n,
        "exo": c.exo,
        "core": c,  # the bank builds its cost queue rows from it (EpisodeBank.write_rows)
        "size": c.pressure_bin.shape[1] + 1 + spec.horizon,
        "prefmin": c.prefmin[:, : n * di : di],
        "counts": c.counts,
        "pct": 100.0 / np.maximum(1, c.counts),
        "scale": reward_per_request(spec.rate_rps, duration_s),
        "thr": thr,
    }


def pool_row(spec: BuildSpec, seed: int) -> dict[str, Any]:
    """The bank row of a pool episode: the single env's episode of ``seed`` with the cost of
    every decision computed up front, as ``Episode.merge_cost`` (a pool episode is reused
    many times)."""
    p, sc = spec.params, spec.sidecar
    arrivals, prompt, output, net, ckpt, duration, name, thr = episode_draws(
        spec.generator, seed, spec.learner_params, as_trace=False
    )
    c = episode_core(arrivals, prompt, output, net, ckpt, duration, p, sc, name)
    cost = decision_costs(c.base_s, c.req_bin, c.pressure_bin, c.violated, c.n, p, sc)
    return {
        "n": c.n,
        "exo": c.exo,
        "seed": seed,
        "thr": thr,
        "pct": 100.0 / max(1, c.req_bin.size),
        "requests": int(c.req_bin.size),
        "cost": cost,
        "scale": reward_per_request(spec.rate_rps, duration),
    }


class EpisodeBank:
    """``slots`` rows of episode arrays (see the module docstring), grown as needed.

    Attributes (rows are slots): ``n`` decisions, ``exo`` features per decision, ``pct``
    (percentage points per violated request), ``scale`` (reward units per violated
    request), ``max_merges`` (the merges feature's scale), ``thr`` learner throughputs,
    ``seed``, ``requests`` (the episode's request count); for lazy costing ``s``, ``d``,
    ``ptr``, ``rbin``, ``base``, ``m0`` (a :class:`CostQueue`) and ``prefmin`` (per
    decision); for a pool ``cost`` per decision.
    """

    #: The per-slot arrays, kept in ``store`` under ``_bank_<name>``.
    FIELDS = (
        "n",
        "exo",
        "s",
        "d",
        "ptr",
        "prefmin",
        "m0",
        "base",
        "rbin",
        "cost",
        "pct",
        "scale",
        "max_merges",
        "thr",
        "seed",
        "requests",
    )

    def __init__(
        self,
        slots: int,
        params: EnvParams,
        sidecar: SidecarParams,
        k: int,
        store: dict[str, Any] | None = None,
    ) -> None:
        """``store``: where the arrays live (a dict; by default the bank's own). The vector
        env passes its instance namespace, so the arrays are also its ``_bank_*``
        attributes (what ``benchmarks/bench.py`` reads to size the bank)."""
        object.__setattr__(self, "_store", {} if store is None else store)
        self.params, self.sidecar = params, sidecar
        # the synthetic draws' batch arrays, reused by every build (SyntheticRegime.from_raw)
        self._scratch: dict[str, np.ndarray] = {}
        self.horizon = cost_horizon(sidecar, params.step_seconds, params.merge_steps)
        self.n = np.zeros(slots, dtype=np.int64)
        self.exo = np.zeros((slots, 0, EXO_SLICE.stop - EXO_SLICE.start), dtype=np.float32)
        self.s = np.zeros((slots, 0))
        self.d = np.zeros((slots, 0))
        self.ptr = np.zeros((slots, 0), dtype=np.int32)
        self.prefmin = np.zeros((slots, 0))
        self.m0 = np.zeros((slots, 0))
        self.base = np.zeros((slots, 0))
        self.rbin = np.zeros((slots, 0), dtype=np.int32)
        self.cost = np.zeros((slots, 0))  # episode pool: every decision's cost
        self.pct = np.zeros(slots)
        self.scale = np.zeros(slots)
        self.max_merges = np.ones(slots)
        self.thr = np.zeros((slots, k))
        self.seed = np.zeros(slots, dtype=np.int64)
        self.requests = np.zeros(slots, dtype=np.int64)  # each episode's request count

    def __getattr__(self, name: str) -> Any:
        # Called only for names not found normally: the arrays in the store.
        try:
            return self.__dict__["_store"]["_bank_" + name]
        except KeyError:
            raise AttributeError(f"EpisodeBank has no attribute {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.FIELDS:
            self._store["_bank_" + name] = value
            # a new array: whoever keeps views or argument tuples of the bank's arrays
            # (the vector env's compiled step) rebuilds them when ``version`` moves
            object.__setattr__(self, "version", self.__dict__.get("version", 0) + 1)
        else:
            object.__setattr__(self, name, value)

    def queue(self) -> CostQueue:
        """The bank's rows as a :class:`CostQueue` (views, no copy)."""
        return CostQueue(
            self.s, self.d, self.ptr, self.rbin, self.base, self.m0, self.params.decision_interval
        )

    def merge_costs(self, slot: np.ndarray, d: np.ndarray, pooled: bool) -> np.ndarray:
        """Isolated cost of a merge at decision ``d[k]`` of the episode in ``slot[k]``: a pool's
        precomputed table, else :func:`sidecar.isolated_merge_costs` on the bank's rows (the
        compiled step computes the same costs itself, :mod:`diloco_gym.sim.jit_step`)."""
        if pooled:
            return self.cost[slot, d]
        p = self.params
        return isolated_merge_costs(
            self.queue(),
            slot,
            d * p.decision_interval,
            self.prefmin[slot, d],
            p.merge_steps,
            self.sidecar,
            p.step_seconds,
        )

    def write_rows(self, slots: np.ndarray, rows: dict[str, Any], parallel: bool = False) -> None:
        """Copy the episodes of ``rows`` (:func:`build_rows`) into ``slots``, their cost
        queue rows built in place (:func:`sidecar.cost_queue_into`; ``parallel``: its
        parallel variant, the same result)."""
        c: EpisodeCore = rows["core"]
        p = self.params
        n, size = rows["n"], rows["size"]
        self._grow_for(n, size, c.m0.shape[1], rows["counts"])
        self.exo[slots, :n] = rows["exo"]
        self.prefmin[slots, :n] = rows["prefmin"]
        q = self.queue()
        cost_queue_into(
            q, slots, c.base_s, c.req_bin, c.violated, c.m0, c.s, self.sidecar,
            p.step_seconds, size, rows["counts"], parallel,
        )  # fmt: skip
        self._set_scalars(
            slots, n, rows["pct"], rows["thr"], rows["seeds"], rows["scale"], rows["counts"]
        )

    def build(
        self, spec: BuildSpec, slots: np.ndarray, seeds: list[int], parallel: bool = False
    ) -> None:
        """Build the fresh episodes of ``seeds`` into bank ``slots``: the same rows as
        :func:`build_rows` then :meth:`write_rows`. Serially (``parallel`` False) each batch
        of up to :data:`BUILD_CHUNK` same-duration episodes goes from its draws straight
        into the bank in one compiled call (:func:`diloco_gym.sim.jit_build.bank_rows`),
        without the single env's per-request arrays; ``parallel`` takes the two-pass form,
        whose compiled stages have parallel variants."""
        slots = np.asarray(slots, dtype=np.int64)
        if parallel:
            done = 0
            for rows in build_rows(spec, seeds, parallel):
                k = rows["counts"].size
                self.write_rows(slots[done : done + k], rows, parallel)
                done += k
            return
        gen, lp = spec.generator, spec.learner_params
        for lo in range(0, len(seeds), BUILD_CHUNK):
            part, at = seeds[lo : lo + BUILD_CHUNK], slots[lo : lo + BUILD_CHUNK]
            if is_synthetic(gen):  # one duration: the draws stay concatenated
                arrivals, prompt, output, counts, pressure, thr = synthetic_draws(
                    gen, part, lp, self._scratch
                )
                self._write_draws(
                    spec, at, part, (arrivals, prompt, output, counts),
                    (pressure[:, 0], pressure[:, 1]), gen.duration_s, gen.name, thr,
                )  # fmt: skip
                continue
            draws = episode_draws_batch(gen, part, lp)
            batches = (
                [(at, part, draws)]
                if _one_batch(draws)
                else [(at[k : k + 1], part[k : k + 1], [d]) for k, d in enumerate(draws)]
            )
            for sl, sd, group in batches:
                flat = [np.concatenate([d[j] for d in group]) for j in range(3)]
                counts = np.array([d[0].size for d in group], dtype=np.int64)
                press = (None, None) if group[0][3] is None or group[0][4] is None else (
                    np.stack([d[3] for d in group]), np.stack([d[4] for d in group])
                )  # fmt: skip
                self._write_draws(
                    spec, sl, sd, (*flat, counts), press, group[0][5], group[0][6],
                    np.stack([d[7] for d in group]),
                )  # fmt: skip

    def _write_draws(
        self, spec: BuildSpec, slots, seeds, requests, pressure, duration_s, name, thr
    ) -> None:
        """One compiled call from a batch's trace arrays (``requests``: arrivals, prompt and
        output tokens concatenated, and the count per episode; ``pressure``: network and
        checkpoint ``(B, samples)``, or ``None``) to its bank rows in ``slots``."""
        arrivals, prompt, output, counts = requests
        p, sc = self.params, spec.sidecar  # a fleet's sites may differ in their sidecars
        setup = core_setup(duration_s, p, sc, name)
        n = setup.n
        size = setup.n_bins + 1 + spec.horizon
        width = self._grow_for(n, size, setup.n_bins, counts)
        offsets = np.zeros(counts.size + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        b = counts.size
        compiled().bank_rows(
            np.ascontiguousarray(arrivals, dtype=np.float64),
            np.ascontiguousarray(prompt, dtype=np.float64),
            np.ascontiguousarray(output, dtype=np.float64),
            offsets, pressure_rows(pressure[0], b), pressure_rows(pressure[1], b), *setup.args,
            sc.sync_slowdown / (1.0 + sc.sync_slowdown), n, setup.n_bins,
            np.ascontiguousarray(slots, dtype=np.int64), size, width, self.exo, self.s, self.d,
            self.ptr, self.rbin, self.base, self.m0, self.prefmin,
        )  # fmt: skip
        pct = 100.0 / np.maximum(1, counts)
        scale = reward_per_request(spec.rate_rps, duration_s)
        self._set_scalars(slots, n, pct, thr, np.asarray(seeds, dtype=np.int64), scale, counts)

    def store_pool(self, slot: int, ep: dict[str, Any]) -> None:
        """Copy a pool episode (:func:`pool_row`) into ``slot``."""
        n = ep["n"]
        self._grow("exo", n)[slot, :n] = ep["exo"]
        self._grow("cost", n)[slot, :n] = ep["cost"]
        self._set_scalars(slot, n, ep["pct"], ep["thr"], ep["seed"], ep["scale"], ep["requests"])

    def _grow_for(self, n: int, size: int, n_bins: int, counts: np.ndarray) -> int:
        """Every per-slot array wide enough for episodes of ``n`` decisions and ``n_bins``
        bins, cost queues of ``size`` bins and ``counts`` requests (returns the longest)."""
        for key in ("s", "d", "ptr"):
            self._grow(key, size)
        self._grow("exo", n)
        self._grow("prefmin", n)
        self._grow("m0", -(-n_bins // self.params.decision_interval))
        width = int(counts.max()) if counts.size else 0
        self._grow("base", width, 0.25)
        self._grow("rbin", width, 0.25)
        return width

    def _grow(self, name: str, width: int, headroom: float = 0.0) -> np.ndarray:
        """Array ``name`` with at least ``width`` columns (kept contents), allocated
        ``headroom`` wider than needed: request counts vary between episodes, and a bank
        that grew by a few columns at every new longest episode would reallocate (and its
        resident memory creep up) for as long as the env runs."""
        arr = getattr(self, name)
        if width > arr.shape[1]:
            width = max(width, int(width * (1.0 + headroom)), int(arr.shape[1] * 1.25))
            new = np.zeros((arr.shape[0], width) + arr.shape[2:], dtype=arr.dtype)
            new[:, : arr.shape[1]] = arr
            setattr(self, name, new)
            arr = new
        return arr

    def _set_scalars(self, slots, n: int, pct, thr, seeds, scale, requests) -> None:
        self.n[slots] = n
        self.requests[slots] = requests
        self.pct[slots] = pct
        self.scale[slots] = scale
        self.max_merges[slots] = max_merges(float(n), self.params)
        self.thr[slots] = thr
        self.seed[slots] = seeds
