"""Merge schedules under the corridor: feasibility, counting, uniform sampling, exact optimum.

A schedule is the sorted decision indices ``d_1 < ... < d_M`` of an episode of ``N``
decisions (decision 0 is the episode start, treated as a merge). It is *feasible* when

* ``h_min <= d_k - d_{k-1} <= h_max`` for every merge (with ``d_0 = 0``), and
* no merge is left due at the end: ``(N - 1) - d_M < h_max``, i.e. ``d_M >= N - h_max``.

These are exactly the schedules an agent can produce in the environment, whose corridor
forbids a merge below ``h_min`` and forces one at ``h_max``.

All counts use ``F[m, d]``: the number of feasible completions with ``m`` more merges
after a merge at ``d``. These numbers span far more than the float range on long episodes
(and far more than 1e16 within one row at 517 decisions), so they are kept as natural
logarithms (:class:`CompletionTable`), each window sum taken as a sum of positive terms in
log space (never a difference of large partial sums), and each row stored only over its
support, which has a closed form. ``F > 0`` (feasibility) is exact.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "is_feasible",
    "budget_range",
    "CompletionTable",
    "completion_table",
    "completion_counts",
    "transition_kernel",
    "sample_uniform",
    "optimal_schedule",
    "brute_force_schedules",
]


def is_feasible(merges, n: int, h_min: int, h_max: int) -> bool:
    """Whether ``merges`` (decision indices) is a feasible schedule."""
    d = np.concatenate([[0], np.asarray(merges, dtype=np.int64)])
    if np.any(d[1:] >= n):
        return False
    gaps = np.diff(d)
    return bool(np.all((gaps >= h_min) & (gaps <= h_max)) and (n - 1) - d[-1] < h_max)


def _support(n: int, h_min: int, h_max: int, m: int) -> tuple[int, int]:
    """``(lo, hi)``: the decisions ``d`` with ``F[m, d] > 0`` are exactly ``lo..hi`` (empty
    when ``hi < lo``).

    After a merge at ``d``, ``m`` more merges with gaps in ``[h_min, h_max]`` can end at any
    decision in ``[d + m h_min, d + m h_max]`` (every gap total in between is reachable),
    and the last one must leave a tail ``< h_max``: so the ``n - 1 - d`` decisions left must
    lie in ``[m h_min, (m + 1) h_max - 1]``.
    """
    return max(0, n - (m + 1) * h_max), n - 1 - m * h_min


def _log_window_sum(x: np.ndarray, width: int, count: int) -> np.ndarray:
    """``out[i] = log(sum(exp(x[i : i + width])))`` for ``i < count`` (``x`` padded with
    ``-inf`` as needed), computed from sums of positive terms only.

    ``x`` is cut into blocks of ``width``; a window is a suffix of one block plus a prefix
    of the next, and prefix and suffix sums within a block are running ``logaddexp``
    sums. Nothing is ever subtracted, so the result is accurate to a few ulps relative
    whatever the spread of the values (a cumulative sum and a difference would cancel).
    """
    nb = -(-(count + width - 1) // width) + 1
    xx = np.full(nb * width, -np.inf)
    k = min(x.size, xx.size)
    xx[:k] = x[:k]
    blocks = xx.reshape(nb, width)
    pre = np.logaddexp.accumulate(blocks, axis=1)
    suf = np.logaddexp.accumulate(blocks[:, ::-1], axis=1)[:, ::-1]
    i = np.arange(count)
    blk, off = np.divmod(i, width)
    head = np.where(off > 0, pre[np.minimum(blk + 1, nb - 1), np.maximum(off - 1, 0)], -np.inf)
    return np.logaddexp(suf[blk, off], head)


#: Largest :meth:`CompletionTable.cumulative_weights` table kept (entries; 32 MiB): an
#: episode of a few hundred decisions (a 600 s window) fits many times over, a day-long
#: trace's does not and is sampled range by range.
CUMULATIVE_MAX = 1 << 22


class CompletionTable:
    """``log F[m, d]`` for ``m = 0..m_max`` over an episode of ``n`` decisions.

    Row ``m`` is stored only over its support (closed form, see :func:`_support`) and
    shifted so that its largest entry is 0: the sampler only uses ratios within a row.
    With ``reach_only`` (the default) a row is further cut to the decisions a schedule with
    at most ``m_max`` merges can reach with ``m`` merges still to place (the next merge of
    a budget ``M`` with ``m`` left is merge ``M - m`` and lies at or before
    ``(M - m) * h_max``), which is every entry the sampler reads; a day-long trace
    (77,000 decisions) with budgets up to 1,300 then needs ~57 MiB instead of ~310 MiB
    (the dense table: ~800 MiB). ``shape`` is ``(m_max + 1, n)``, as for the dense table.

    Attributes:
        n, h_min, h_max, m_max: the episode length, corridor (decisions) and rows.
        lo, hi: int arrays ``(m_max + 1,)``, the stored decisions of each row.
        reach_only: whether rows are cut to the decisions budgets <= ``m_max`` reach.
        rows: one float array per row, ``log F[m, lo[m]..hi[m]]`` minus the row's maximum.
    """

    def __init__(self, n: int, h_min: int, h_max: int, m_max: int, reach_only: bool = True) -> None:
        _check(n, h_min, h_max)
        if m_max < 0:
            raise ValueError(f"m_max must be >= 0, got {m_max}")
        self.n, self.h_min, self.h_max, self.m_max = n, h_min, h_max, int(m_max)
        self.reach_only = reach_only
        self.lo = np.empty(m_max + 1, dtype=np.int64)
        self.hi = np.empty(m_max + 1, dtype=np.int64)
        self.rows: list[np.ndarray] = []
        width = h_max - h_min + 1
        for m in range(m_max + 1):
            lo, hi = _support(n, h_min, h_max, m)
            if reach_only:
                hi = min(hi, (m_max - m) * h_max)
            self.lo[m], self.hi[m] = lo, hi
            if hi < lo:
                self.rows.append(np.zeros(0))
            elif m == 0:
                self.rows.append(np.zeros(hi - lo + 1))  # F = 1 on the tail
            else:
                # x[j] = log F[m-1, lo + h_min + j]; -inf outside that row's support.
                x = self.row_values(m - 1, lo + h_min, hi + h_max + 1)
                with np.errstate(invalid="ignore"):
                    row = _log_window_sum(x, width, hi - lo + 1)
                self.rows.append(row - row.max())

    @property
    def shape(self) -> tuple[int, int]:
        return (self.m_max + 1, self.n)

    def feasible(self, m: int) -> bool:
        """Whether a schedule with exactly ``m`` merges exists (``F[m, 0] > 0``)."""
        return 0 <= m <= self.m_max and self.lo[m] == 0 and self.hi[m] >= 0

    def row_values(self, m: int, a: int, b: int) -> np.ndarray:
        """``log F[m, a:b]`` (shifted as stored), ``-inf`` outside the support."""
        out = np.full(b - a, -np.inf)
        lo, hi = int(self.lo[m]), int(self.hi[m])
        s, e = max(a, lo), min(b, hi + 1)
        if e > s:
            out[s - a : e - a] = self.rows[m][s - lo : e - lo]
        return out

    def window_weights(self, m_left: int, c_lo: int, c_hi: int) -> np.ndarray:
        """Unnormalised probabilities of the next merge after a merge at each ``c`` in
        ``c_lo..c_hi``, with ``m_left`` merges (this one included) still to place:
        ``(c_hi - c_lo + 1, h_max - h_min + 1)``, row ``c - c_lo`` over decisions
        ``c + h_min .. c + h_max``, proportional to ``F[m_left - 1, .]`` and scaled so its
        largest weight is 1 (a ``c`` with no feasible continuation gives a row of NaN)."""
        width = self.h_max - self.h_min + 1
        seg = self.row_values(m_left - 1, c_lo + self.h_min, c_hi + self.h_max + 1)
        vals = np.lib.stride_tricks.sliding_window_view(seg, width)
        top = vals.max(axis=1, keepdims=True)
        with np.errstate(invalid="ignore"):
            return np.exp(vals - top)

    def cumulative_weights(self) -> np.ndarray | None:
        """Every row of :meth:`window_weights` summed cumulatively along the window, for
        every number of merges left and every previous merge: ``(m_max + 1, n, width)``,
        entry ``[m_left, c]`` the cumulative sum of ``window_weights(m_left, c, c)[0]``
        (row 0 unused), or ``None`` when that would exceed :data:`CUMULATIVE_MAX` entries.

        Built once per table (then kept): every draw of every budget reads it. Each row is
        computed as :meth:`window_weights` computes it for any range that holds it (the
        same values, elementwise), so a draw reading it picks what one reading the weights
        of its own range picks."""
        width = self.h_max - self.h_min + 1
        if (self.m_max + 1) * self.n * width > CUMULATIVE_MAX:
            return None
        cw = self.__dict__.get("_cumulative")
        if cw is None:
            cw = np.full((self.m_max + 1, self.n, width), np.nan)
            for m_left in range(1, self.m_max + 1):
                cw[m_left] = np.cumsum(self.window_weights(m_left, 0, self.n - 1), axis=1)
            self.__dict__["_cumulative"] = cw
        return cw

    def next_weights(self, m_left: int, cur: np.ndarray) -> np.ndarray:
        """:meth:`window_weights` for each previous merge in ``cur``, ``(len(cur), width)``
        (the weights :func:`sample_uniform` draws from)."""
        cur = np.asarray(cur, dtype=np.int64)
        if cur.size == 0:
            return np.zeros((0, self.h_max - self.h_min + 1))
        c_lo = int(cur.min())
        return self.window_weights(m_left, c_lo, int(cur.max()))[cur - c_lo]


def completion_table(n: int, h_min: int, h_max: int, m_max: int) -> CompletionTable:
    """The log completion counts shared by every draw of an episode length (cache it)."""
    return CompletionTable(n, h_min, h_max, m_max)


def completion_counts(n: int, h_min: int, h_max: int, m_max: int) -> np.ndarray:
    """Dense ``F[m, d]`` for ``m = 0..m_max``, each row scaled so its maximum is 1 (or all 0).

    ``F[m, d] > 0`` exactly where a completion exists (entries below the float range are
    kept at the smallest positive float, so feasibility stays exact); ratios are exact to
    float precision where representable. The sampler uses :class:`CompletionTable`, which
    has no such range limit. ``F[m, 0] > 0`` iff an episode of ``n`` decisions has a
    feasible schedule with exactly ``m`` merges.
    """
    t = CompletionTable(n, h_min, h_max, m_max, reach_only=False)
    f = np.zeros((m_max + 1, n))
    for m in range(m_max + 1):
        if t.rows[m].size:
            f[m, t.lo[m] : t.hi[m] + 1] = np.maximum(np.exp(t.rows[m]), np.finfo(float).tiny)
    return f


def budget_range(n: int, h_min: int, h_max: int) -> tuple[int, int]:
    """The smallest and largest feasible number of merges in ``n`` decisions (closed form:
    ``m`` is feasible iff ``m h_min <= n - 1 <= (m + 1) h_max - 1``)."""
    _check(n, h_min, h_max)
    return max(0, -(-n // h_max) - 1), (n - 1) // h_min


def _check(n: int, h_min: int, h_max: int) -> None:
    if not (1 <= h_min <= h_max):
        raise ValueError(f"need 1 <= h_min <= h_max, got h_min={h_min}, h_max={h_max}")
    if n < 1:
        raise ValueError(f"need at least one decision, got n={n}")


def _table_for(
    n: int, h_min: int, h_max: int, m: int, counts: CompletionTable | None
) -> CompletionTable:
    if counts is None:
        return CompletionTable(n, h_min, h_max, max(m, 0))
    if not isinstance(counts, CompletionTable):
        raise TypeError(
            f"counts must be a CompletionTable (from completion_table), got {type(counts).__name__}"
        )
    if (counts.n, counts.h_min, counts.h_max) != (n, h_min, h_max):
        raise ValueError(
            f"counts were built for n={counts.n}, h_min={counts.h_min}, "
            f"h_max={counts.h_max}, not n={n}, h_min={h_min}, h_max={h_max}"
        )
    return counts


def _check_budget(f: CompletionTable, n: int, h_min: int, h_max: int, m: int) -> None:
    if m < 0 or not (m <= f.m_max and f.feasible(m)):
        lo, hi = budget_range(n, h_min, h_max)
        if lo <= m <= hi:
            raise ValueError(f"counts hold budgets up to {f.m_max}, not {m}")
        raise ValueError(
            f"no feasible schedule has {m} merges in {n} decisions "
            f"(h_min={h_min}, h_max={h_max}); feasible budgets: {lo}..{hi}"
        )


def transition_kernel(
    n: int, h_min: int, h_max: int, m: int, j: int, cur, counts: CompletionTable | None = None
) -> np.ndarray:
    """The probabilities :func:`sample_uniform` uses for merge ``j`` (0-based) of ``m``,
    after the previous merge at each of ``cur``: ``(len(cur), h_max - h_min + 1)``, row
    ``i`` over decisions ``cur[i] + h_min .. cur[i] + h_max`` (rows sum to 1; a ``cur``
    with no feasible continuation gives a row of NaN)."""
    f = _table_for(n, h_min, h_max, m, counts)
    _check_budget(f, n, h_min, h_max, m)
    if not 0 <= j < m:
        raise ValueError(f"merge index j must be in 0..{m - 1}, got {j}")
    w = f.next_weights(m - j, np.asarray(cur, dtype=np.int64))
    with np.errstate(invalid="ignore", divide="ignore"):
        return w / w.sum(axis=1, keepdims=True)


def sample_uniform(
    n: int,
    h_min: int,
    h_max: int,
    m: int,
    k: int,
    rng: np.random.Generator,
    counts: CompletionTable | None = None,
) -> np.ndarray:
    """Draw ``k`` schedules uniformly among all feasible schedules with exactly ``m`` merges.

    Exact: the next merge is drawn with probability proportional to the number of
    feasible completions from it (``F``, from the log-space :class:`CompletionTable`, so
    the ratios are exact to float precision at any episode length), so every schedule has
    probability ``1 / F[m, 0]``.

    The picks are compiled (:mod:`diloco_gym.sim.jit_eval`); with ``counts`` given the
    draws read its :meth:`CompletionTable.cumulative_weights` (built once per table, when
    small enough), else the weights of each merge's range, with the same result.

    Args:
        counts: a :func:`completion_table` for this ``n`` and corridor with at least ``m``
            rows beyond the first (built when ``None``).

    Returns:
        int array ``(k, m)`` of decision indices, each row sorted.

    Raises:
        ValueError: when no feasible schedule has ``m`` merges (the message gives the range).
    """
    f = _table_for(n, h_min, h_max, m, counts)
    _check_budget(f, n, h_min, h_max, m)
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    out = np.empty((k, m), dtype=np.int64)
    if k == 0:
        return out
    from diloco_gym.sim import compiled_eval

    jit = compiled_eval()
    # A table passed in is shared by many draws: its cumulative weights pay for themselves.
    table = f.cumulative_weights() if m and counts is not None else None
    if table is not None:
        # All the uniforms at once: row j holds what the j-th of m draws of k would give.
        jit.sample_rows(table, rng.random((m, k)), m, h_min, out)
        return out
    cur = np.zeros(k, dtype=np.int64)
    col = np.empty(k, dtype=np.int64)
    for j in range(m):
        # The kernel depends on the previous merge only: weights once per distinct position.
        c_lo = int(cur.min())
        cw = np.cumsum(f.window_weights(m - j, c_lo, int(cur.max())), axis=1)
        # Each draw's pick: the first index of its row of cw above u * the row's total
        # (at most the last one), compiled (the same comparisons as in NumPy).
        jit.pick_rows(cw, cur, c_lo, rng.random(k), h_min, col)
        out[:, j] = col
    return out


def optimal_schedule(
    cost: np.ndarray, h_min: int, h_max: int, m: int | None = None
) -> tuple[np.ndarray, float]:
    """The feasible schedule of least total ``cost`` (exact dynamic programme).

    ``g[d]`` is the least cost of finishing the episode after a merge at ``d``:
    ``g[d] = min(0 if d >= n - h_max else inf, min_{d' in [d+h_min, d+h_max]} cost[d'] + g[d'])``
    (with an exact budget, ``g`` gains a merges-left index). The free-budget recursion runs
    backwards, each decision depending only on later ones, so the work is ``O(n * (h_max -
    h_min))`` (compiled, :func:`diloco_gym.sim.jit_eval.free_budget_values` and
    :func:`~diloco_gym.sim.jit_eval.budget_values`).

    Args:
        cost: cost of a merge at each decision, shape ``(n,)``.
        h_min, h_max: corridor in decisions.
        m: exact number of merges, or ``None`` for the free-budget optimum.

    Returns:
        ``(merges, total_cost)``. With an exact budget ties go to the earliest decision;
        with a free budget to stopping, then to the latest decision (fewer merges).
    """
    cost = np.asarray(cost, dtype=np.float64)
    n = cost.size
    _check(n, h_min, h_max)
    if np.any(~np.isfinite(cost)):
        raise ValueError("cost must be finite")
    from diloco_gym.sim import compiled_eval

    tail_ok = np.arange(n) >= n - h_max

    if m is None:
        g = np.full(n, np.inf)
        val = np.full(n + h_max + 1, np.inf)  # val[d] = cost[d] + g[d], inf-padded
        # backwards: each decision's best continuation reads later decisions only (compiled)
        compiled_eval().free_budget_values(cost, h_min, h_max, n - h_max, g, val)
        if not np.isfinite(g[0]):
            raise ValueError(f"no feasible schedule in {n} decisions")
        merges = []
        cur = 0
        while True:
            seg = val[cur + h_min : cur + h_max + 1]
            best = seg.min() if seg.size else np.inf
            if tail_ok[cur] and best >= 0.0:
                break
            # Among equally cheap continuations take the latest: fewer merges on ties.
            cur = cur + h_min + (seg.size - 1 - int(np.argmin(seg[::-1])))
            merges.append(cur)
        return np.asarray(merges, dtype=np.int64), float(g[0])

    if m < 0:
        raise ValueError(f"m must be >= 0, got {m}")
    if n * (m + 1) > 60_000_000:
        raise ValueError(
            f"an exact budget of m={m} over {n} decisions needs too much memory; "
            f"use m=None (free budget) or a shorter trace"
        )
    g = np.empty((m + 1, n))
    compiled_eval().budget_values(cost, h_min, h_max, n - h_max, g, np.empty(n + h_max + 1))
    if not np.isfinite(g[m, 0]):
        lo, hi = budget_range(n, h_min, h_max)
        raise ValueError(
            f"no feasible schedule has {m} merges in {n} decisions; feasible budgets: {lo}..{hi}"
        )
    merges = np.empty(m, dtype=np.int64)
    cur = 0
    for j in range(m, 0, -1):
        seg = cost[cur + h_min : cur + h_max + 1] + g[j - 1][cur + h_min : cur + h_max + 1]
        cur = cur + h_min + int(np.argmin(seg))
        merges[m - j] = cur
    return merges, float(g[m, 0])


def brute_force_schedules(n: int, h_min: int, h_max: int, m: int | None = None):
    """Every feasible schedule (for tests on tiny instances), as a list of tuples."""
    out = []

    def rec(last: int, acc: list[int]) -> None:
        if (n - 1) - last < h_max and (m is None or len(acc) == m):
            out.append(tuple(acc))
        if m is not None and len(acc) >= m:
            return
        for d in range(last + h_min, min(last + h_max, n - 1) + 1):
            rec(d, acc + [d])

    rec(0, [])
    return out
