"""A real DiLoCo run on a tiny decoder language model (torch, CPU).

DiLoCo (Douillard et al., arXiv 2311.08105): ``K`` learners start from the global model;
each runs inner AdamW steps on its own data shard; at a merge the *pseudo-gradient*
``global - local_k`` is averaged over the learners and applied to the global model by an
outer SGD step with Nesterov momentum, and every learner restarts from the new global model
(its AdamW state is kept). The paper's outer lr 0.7 and momentum 0.9 are configurable; the
default momentum here is 0.5, measured better for these short runs (docs/learners.md).

What a run executes:

* **Any merge schedule**: a strictly increasing list of inner-step counts after which a
  merge happens (fixed H is ``[H, 2H, ...]``). Work after the last merge never reaches the
  global model, so the run stops at the last merge.
* **Fragments** (Streaming DiLoCo, arXiv 2501.18512): the parameters are split into ``F``
  contiguous fragments of about equal size (in the model's parameter order, so a fragment
  is a run of layers); merge ``m`` (0-based) synchronises fragment ``m mod F`` only: only
  that fragment's pseudo-gradient is sent, only its global parameters and momentum move,
  and only its local copies are reset. ``F = 1`` is plain DiLoCo.
* **Quantised pseudo-gradients** (``bits`` 16, 8 or 4; 32 = full precision): each
  learner's pseudo-gradient is quantised per tensor with a uniform min-max quantiser
  (``2**bits`` levels between the tensor's min and max, as INTELLECT-1's int8 all-reduce,
  arXiv 2412.01152) with nearest or stochastic rounding, dequantised, and averaged in full
  precision (Streaming DiLoCo's low-precision payload with full-precision accumulation).

The validation loss (mean cross-entropy in nats per byte on fixed held-out windows) of the
global model is measured before training and after every merge. A run is deterministic for
its seed and thread count.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from diloco_gym.lm.data import Corpus

__all__ = [
    "TrainConfig",
    "TinyLM",
    "RunResult",
    "quantize",
    "fragment_groups",
    "outer_step",
    "check_schedule",
    "fixed_schedule",
    "run_diloco",
]

BITS = (32, 16, 8, 4)
ROUNDINGS = ("nearest", "stochastic")


@dataclass(frozen=True)
class TrainConfig:
    """The model, the inner and outer optimisers and the budget of one DiLoCo run.

    ``total_steps`` is the token budget: inner steps per learner, each on
    ``batch_size * seq_len`` bytes.
    """

    num_learners: int = 4
    total_steps: int = 64
    batch_size: int = 4
    seq_len: int = 64
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    inner_lr: float = 2e-3
    inner_warmup: int = 8
    weight_decay: float = 0.1
    outer_lr: float = 0.7
    outer_momentum: float = 0.5  # 0.9 in arXiv 2311.08105; see docs/learners.md
    eval_windows: int = 48
    threads: int = 1

    def __post_init__(self) -> None:
        for name in (
            "num_learners",
            "total_steps",
            "batch_size",
            "seq_len",
            "d_model",
            "n_layers",
            "n_heads",
            "eval_windows",
            "threads",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"TrainConfig.{name} must be an int >= 1, got {v!r}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"TrainConfig.d_model ({self.d_model}) must be a multiple of n_heads "
                f"({self.n_heads})"
            )
        for name in ("inner_lr", "outer_lr"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"TrainConfig.{name} must be > 0, got {v!r}")
        for name in ("weight_decay", "outer_momentum", "inner_warmup"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"TrainConfig.{name} must be >= 0, got {v!r}")
        if self.outer_momentum >= 1:
            raise ValueError(f"TrainConfig.outer_momentum must be < 1, got {self.outer_momentum}")

    @property
    def tokens_per_step(self) -> int:
        """Bytes one learner trains on per inner step."""
        return self.batch_size * self.seq_len


class _Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        shape = (b, t, self.heads, d // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyLM(nn.Module):
    """A decoder-only transformer over bytes (pre-LayerNorm, learned positions, tied
    input and output embeddings)."""

    def __init__(self, cfg: TrainConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(256, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(_Block(cfg.d_model, cfg.n_heads) for _ in range(cfg.n_layers))
        self.ln = nn.LayerNorm(cfg.d_model)
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return self.ln(x) @ self.tok.weight.T

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        """Mean next-byte cross-entropy (nats) of ``(B, T + 1)`` byte windows."""
        logits = self(batch[:, :-1])
        return F.cross_entropy(logits.reshape(-1, 256), batch[:, 1:].reshape(-1))


def quantize(
    x: torch.Tensor, bits: int, rounding: str = "nearest", generator: torch.Generator | None = None
) -> torch.Tensor:
    """Per-tensor uniform min-max quantisation to ``bits`` bits, returned dequantised.

    ``2**bits - 1`` steps of ``(max - min) / (2**bits - 1)`` from ``min``; ``nearest``
    rounds to the closest level, ``stochastic`` rounds up with probability equal to the
    fractional part (unbiased; needs ``generator`` for determinism). ``bits = 32`` returns
    ``x`` unchanged. A constant tensor is returned unchanged (exact at any precision).
    """
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    if bits == 32:
        return x
    lo, hi = x.min(), x.max()
    if not bool(hi > lo):
        return x.clone()
    levels = 2**bits - 1
    scale = (hi - lo) / levels
    u = (x - lo) / scale
    if rounding == "nearest":
        q = torch.round(u)
    else:
        q = torch.floor(u + torch.rand(u.shape, generator=generator, dtype=u.dtype))
    return lo + q.clamp_(0, levels) * scale


def fragment_groups(params: Sequence[torch.Tensor], fragments: int) -> list[list[int]]:
    """Split parameter indices into ``fragments`` contiguous groups of about equal size.

    Parameter ``i`` goes to group ``floor(fragments * c_i / total)``, where ``c_i`` is the
    number of elements before the middle of parameter ``i``; every group is non-empty (a
    ``ValueError`` names the count when there are fewer parameters than fragments).
    """
    if isinstance(fragments, bool) or not isinstance(fragments, int) or fragments < 1:
        raise ValueError(f"fragments must be an int >= 1, got {fragments!r}")
    if fragments > len(params):
        raise ValueError(f"fragments ({fragments}) exceeds the number of tensors ({len(params)})")
    sizes = np.array([p.numel() for p in params], dtype=np.float64)
    mid = np.cumsum(sizes) - sizes / 2
    idx = np.minimum((fragments * mid / sizes.sum()).astype(int), fragments - 1)
    groups: list[list[int]] = [[] for _ in range(fragments)]
    for i, g in enumerate(idx):
        groups[g].append(i)
    if any(not g for g in groups):  # too uneven sizes: fall back to equal tensor counts
        cuts = np.linspace(0, len(params), fragments + 1).round().astype(int)
        groups = [list(range(cuts[j], cuts[j + 1])) for j in range(fragments)]
    return groups


@torch.no_grad()
def outer_step(
    global_params: Sequence[torch.Tensor],
    local_params: Sequence[Sequence[torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    indices: Sequence[int],
    bits: int = 32,
    rounding: str = "nearest",
    generator: torch.Generator | None = None,
) -> None:
    """One DiLoCo outer step on the parameters ``indices``.

    The pseudo-gradient of parameter ``i`` is ``mean_k Q(global_i - local_k_i)`` (``Q`` =
    :func:`quantize`); it is set as the gradient of ``global_i`` (every other parameter
    gets no gradient, so ``optimizer``, an SGD over ``global_params``, leaves it and its
    momentum alone), the optimizer steps, and every learner's copy of parameter ``i`` is
    set to the new global value.
    """
    for p in global_params:
        p.grad = None
    for i in indices:
        g = global_params[i]
        deltas = [quantize(g - loc[i], bits, rounding, generator) for loc in local_params]
        g.grad = torch.stack(deltas).mean(dim=0)
    optimizer.step()
    for i in indices:
        for loc in local_params:
            loc[i].copy_(global_params[i])
    for p in global_params:
        p.grad = None


def check_schedule(schedule: Sequence[int], total_steps: int) -> list[int]:
    """The schedule as a list of ints; ``ValueError`` naming the first bad entry."""
    out: list[int] = []
    for j, s in enumerate(schedule):
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
            raise ValueError(f"schedule[{j}] must be an integer step, got {s!r}")
        s = int(s)
        if not 1 <= s <= total_steps:
            raise ValueError(f"schedule[{j}] = {s} is outside 1..{total_steps} (total_steps)")
        if out and s <= out[-1]:
            raise ValueError(
                f"schedule[{j}] = {s} must be greater than schedule[{j - 1}] = {out[-1]}"
            )
        out.append(s)
    if not out:
        raise ValueError("schedule is empty: a run needs at least one merge")
    return out


def fixed_schedule(h: int, total_steps: int) -> list[int]:
    """Fixed H: merges after ``H, 2H, ...`` inner steps (up to ``total_steps``)."""
    if h < 1 or h > total_steps:
        raise ValueError(f"H must be in 1..{total_steps}, got {h}")
    return list(range(h, total_steps + 1, h))


@dataclass
class RunResult:
    """What one run measured."""

    schedule: list[int]
    fragments: int
    bits: int
    rounding: str
    seed: int
    initial_loss: float
    merge_losses: list[float]  # validation loss of the global model after each merge
    seconds: float
    config: dict = field(default_factory=dict)

    @property
    def final_loss(self) -> float:
        return self.merge_losses[-1]


def _eval_windows(corpus: Corpus, cfg: TrainConfig) -> torch.Tensor:
    n = len(corpus.heldout) - cfg.seq_len - 1
    if n < cfg.eval_windows:
        raise ValueError(
            f"held-out split has {len(corpus.heldout)} bytes, too few for "
            f"{cfg.eval_windows} windows of {cfg.seq_len + 1}"
        )
    starts = np.linspace(0, n, cfg.eval_windows).astype(np.int64)
    rows = np.stack([corpus.heldout[s : s + cfg.seq_len + 1] for s in starts])
    return torch.from_numpy(rows.astype(np.int64))


@torch.no_grad()
def _val_loss(model: TinyLM, windows: torch.Tensor) -> float:
    model.eval()
    out = float(model.loss(windows))
    model.train()
    return out


def run_diloco(
    corpus: Corpus,
    cfg: TrainConfig,
    schedule: Sequence[int],
    *,
    fragments: int = 1,
    bits: int = 32,
    rounding: str = "nearest",
    seed: int = 0,
    on_merge: Callable[[int, float], None] | None = None,
) -> RunResult:
    """Train with DiLoCo on ``corpus`` and merge after the steps in ``schedule``.

    ``seed`` sets the model's initialisation, the learners' batches (learner ``k`` draws
    windows from shard ``k`` with ``numpy.random.default_rng([seed, k])``) and the
    stochastic rounding. ``on_merge(step, val_loss)`` is called after each merge.
    """
    sched = check_schedule(schedule, cfg.total_steps)
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        torch.manual_seed(seed)
        global_model = TinyLM(cfg)
        gparams = list(global_model.parameters())
        groups = fragment_groups(gparams, fragments)
        learners = [copy.deepcopy(global_model) for _ in range(cfg.num_learners)]
        lparams = [list(m.parameters()) for m in learners]
        inner = [
            torch.optim.AdamW(
                m.parameters(), lr=cfg.inner_lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay
            )
            for m in learners
        ]
        outer = torch.optim.SGD(
            gparams,
            lr=cfg.outer_lr,
            momentum=cfg.outer_momentum,
            nesterov=cfg.outer_momentum > 0,
        )
        shards = corpus.shards(cfg.num_learners)
        rngs = [np.random.default_rng([seed, k]) for k in range(cfg.num_learners)]
        qgen = torch.Generator().manual_seed(seed + 7919)
        windows = _eval_windows(corpus, cfg)
        initial = _val_loss(global_model, windows)
        losses: list[float] = []
        merge_at = set(sched)
        m = 0
        for step in range(1, sched[-1] + 1):
            lr = (
                cfg.inner_lr * min(1.0, step / cfg.inner_warmup)
                if cfg.inner_warmup
                else cfg.inner_lr
            )
            for k, model in enumerate(learners):
                shard = shards[k]
                starts = rngs[k].integers(0, len(shard) - cfg.seq_len - 1, cfg.batch_size)
                rows = np.stack([shard[s : s + cfg.seq_len + 1] for s in starts])
                batch = torch.from_numpy(rows.astype(np.int64))
                for group in inner[k].param_groups:
                    group["lr"] = lr
                inner[k].zero_grad(set_to_none=True)
                model.loss(batch).backward()
                inner[k].step()
            if step in merge_at:
                outer_step(gparams, lparams, outer, groups[m % fragments], bits, rounding, qgen)
                m += 1
                losses.append(_val_loss(global_model, windows))
                if on_merge is not None:
                    on_merge(step, losses[-1])
    finally:
        torch.set_num_threads(threads)
    return RunResult(
        sched,
        fragments,
        bits,
        rounding,
        seed,
        initial,
        losses,
        time.perf_counter() - t0,
        asdict(cfg),
    )
