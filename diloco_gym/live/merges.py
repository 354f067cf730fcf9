"""Real DiLoCo-style outer merges on the local machine.

A :class:`MergeCluster` spawns ``workers`` processes (``torch.multiprocessing`` spawn
context) that form a ``torch.distributed`` process group over ``tcp://127.0.0.1:<port>``
(backend ``gloo`` on the CPU, ``nccl`` when CUDA is available and there is a GPU per
worker). Each worker holds a model-sized float32 tensor (its *pseudo-gradient*).

One merge (:meth:`MergeCluster.merge`) is what an outer synchronisation does to the host:

1. every worker all-reduces its tensor (sum, then divide by the world size: the mean of
   the pseudo-gradients), again and again until the merge window has elapsed; the ranks
   agree on when to stop through a one-element ``MIN`` all-reduce, so none is left
   waiting in a collective;
2. rank 0 writes the averaged tensor to disk with ``torch.save`` and ``fsync`` (the
   checkpoint of the new global model), replacing the previous checkpoint.

The coordinator waits on the workers' pipes *and* their process sentinels, so a worker
that dies mid-merge is noticed at once (:class:`MergeWorkerError`) instead of leaving the
others blocked in a collective; :meth:`MergeCluster.close` always reaps every worker
(stop message, then SIGTERM, then SIGKILL). Workers ignore SIGINT: Ctrl-C is handled by
the coordinator, which then shuts them down.
"""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_ready
from typing import Any, cast

from diloco_gym.io import free_port, save_atomic
from diloco_gym.live.errors import MergeWorkerError

__all__ = [
    "MergeConfig",
    "MergeCluster",
    "MergeWorkerError",
    "MergeReport",
    "free_port",
    "loopback_interface",
]


@dataclass(frozen=True)
class MergeConfig:
    """How merges are run.

    Attributes:
        workers: number of worker processes (the learner islands on this host).
        merge_mb: size of the all-reduced tensor, MiB (the model's pseudo-gradient).
        backend: ``"auto"`` (``nccl`` when CUDA has a GPU per worker, else ``gloo``),
            ``"gloo"`` or ``"nccl"``.
        checkpoint: write the merged tensor to disk after each merge.
        checkpoint_dir: where (a fresh temporary directory when ``None``; removed on close).
        torch_threads: intra-op threads per worker.
        collective_timeout_s: ``torch.distributed`` timeout of one collective.
        start_timeout_s: how long the workers may take to form the group.
    """

    workers: int = 2
    merge_mb: float = 64.0
    backend: str = "auto"
    checkpoint: bool = True
    checkpoint_dir: str | None = None
    torch_threads: int = 1
    collective_timeout_s: float = 60.0
    start_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"MergeConfig.workers must be an int >= 1, got {self.workers!r}")
        if not self.merge_mb > 0:
            raise ValueError(f"MergeConfig.merge_mb must be > 0, got {self.merge_mb!r}")
        from diloco_gym.sim.limits import check_limit

        # the workers allocate it: 1e308 MiB reached them as a NaN element count
        check_limit("MERGE_MB", self.merge_mb, "MergeConfig.merge_mb (--merge-mb)")
        if self.backend not in ("auto", "gloo", "nccl"):
            raise ValueError(
                f"MergeConfig.backend must be auto, gloo or nccl, got {self.backend!r}"
            )

    @property
    def numel(self) -> int:
        return max(1, int(self.merge_mb * 2**20 // 4))


@dataclass
class MergeReport:
    """What one merge did.

    Attributes:
        merge_id: sequence number.
        allreduces: all-reduce rounds completed (per worker).
        bytes_per_allreduce: size of the reduced tensor.
        allreduce_s: rank 0's time in the all-reduce loop.
        checkpoint_s: rank 0's time writing and syncing the checkpoint.
        checkpoint_bytes: size of the checkpoint file.
        worker_s: per-rank time from receiving the command to reporting done.
        achieved_share: of a throttled merge, the share of rank 0's all-reduce loop spent
            in all-reduces (the link share achieved; ``None`` at the full rate).
    """

    merge_id: int
    allreduces: int = 0
    bytes_per_allreduce: int = 0
    allreduce_s: float = 0.0
    checkpoint_s: float = 0.0
    checkpoint_bytes: int = 0
    worker_s: list[float] = field(default_factory=list)
    achieved_share: float | None = None


def loopback_interface() -> str | None:
    """Name of the loopback network interface (``lo`` / ``lo0``), if it can be found."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        return None
    for name in ("lo", "lo0"):
        if name in names:
            return name
    return None


def _choose_backend(requested: str, workers: int) -> str:
    import torch

    if requested != "auto":
        return requested
    if torch.cuda.is_available() and torch.cuda.device_count() >= workers:
        return "nccl"
    return "gloo"


def _fsync_save(tensor: Any, path: str) -> int:
    """``torch.save`` to ``path`` atomically (temp file, fsync, rename); return its size."""
    import torch

    save_atomic(lambda tmp: torch.save(tensor, tmp), path)
    return os.path.getsize(path)


def _worker_main(
    rank: int, world: int, port: int, cfg: MergeConfig, backend: str, ckpt_dir: str, conn: Any
) -> None:
    """Entry point of merge worker ``rank``: join the group, then serve merge commands."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the coordinator handles Ctrl-C
    iface = loopback_interface()
    if iface:  # keep every collective on the loopback interface
        os.environ.setdefault("GLOO_SOCKET_IFNAME", iface)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", iface)
    try:
        group = _join_group(rank, world, port, cfg, backend)
        conn.send(("ready", rank, os.getpid(), backend))
    except BaseException:
        _report_error(conn, rank)
        return
    try:
        _serve(conn, group, rank, cfg, ckpt_dir)
    except (EOFError, OSError):
        pass  # the coordinator closed the pipe: exit quietly
    except BaseException:
        _report_error(conn, rank)
    finally:
        try:
            group.dist.destroy_process_group()
        except Exception:  # the group may already be broken by a dead peer
            pass


def _report_error(conn: Any, rank: int) -> None:
    """Send the current exception's traceback to the coordinator, if it still listens."""
    try:
        conn.send(("error", rank, traceback.format_exc()))
    except (OSError, ValueError):  # the coordinator is gone (killed): exit quietly
        pass


@dataclass
class _Group:
    """A worker's side of the process group: the module, its tensors and the world."""

    dist: Any
    buf: Any  # the pseudo-gradient
    flag: Any  # the one-element stop vote
    world: int


def _join_group(rank: int, world: int, port: int, cfg: MergeConfig, backend: str) -> _Group:
    """Join the process group and run a first collective (it sets up the connections)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(cfg.torch_threads)
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=cfg.collective_timeout_s),
    )
    gen = torch.Generator().manual_seed(1000 + rank)
    group = _Group(dist, torch.randn(cfg.numel, generator=gen).to(device), None, world)
    group.flag = torch.ones(1, device=device)
    dist.all_reduce(group.flag)
    return group


def _serve(conn: Any, group: _Group, rank: int, cfg: MergeConfig, ckpt_dir: str) -> None:
    """Serve merge commands until ``stop``, a closed pipe, or the coordinator's death."""
    parent = os.getppid()
    while True:
        if not conn.poll(0.5):
            if os.getppid() != parent:  # orphaned: the coordinator is gone
                return
            continue
        message = conn.recv()
        if message[0] == "stop":
            return
        if message[0] != "merge":
            continue
        _, merge_id, window_s, link_share = message
        t0 = time.monotonic()
        rounds, busy_s = _allreduce_loop(group, t0 + window_s, link_share)
        t1 = time.monotonic()
        size = 0
        if rank == 0 and cfg.checkpoint:
            size = _fsync_save(group.buf.cpu(), os.path.join(ckpt_dir, "global_model.pt"))
        t2 = time.monotonic()
        stats = {
            "allreduces": rounds,
            "bytes": group.buf.numel() * group.buf.element_size(),
            "allreduce_s": t1 - t0,
            "checkpoint_s": t2 - t1,
            "checkpoint_bytes": size,
            "worker_s": t2 - t0,
            "busy_s": busy_s,
        }
        conn.send(("done", rank, merge_id, stats))


def _allreduce_loop(group: _Group, deadline: float, link_share: float) -> tuple[int, float]:
    """All-reduce the pseudo-gradient (mean over the world) until ``deadline``; returns the
    rounds and the seconds spent in them.

    At ``link_share`` < 1 each round is followed by an idle pause ``(1 / share - 1)`` times
    as long as the round, so that the transfers occupy that share of the window: the
    merge sends at that fraction of the unthrottled rate (a rate-limited sync). The ranks
    agree on when to stop through a one-element ``MIN`` all-reduce, so none is left
    waiting in a collective.
    """
    dist, buf, flag = group.dist, group.buf, group.flag
    rounds, busy_s = 0, 0.0
    while True:
        start = time.monotonic()
        dist.all_reduce(buf)
        buf.div_(group.world)
        rounds += 1
        took = time.monotonic() - start
        busy_s += took
        if link_share < 1.0:
            time.sleep(max(0.0, min(took * (1.0 / link_share - 1.0), deadline - time.monotonic())))
        flag.fill_(1.0 if time.monotonic() < deadline else 0.0)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        if flag.item() == 0.0:
            return rounds, busy_s


class MergeCluster:
    """Worker processes that run real merges on command.

    Args:
        cfg: merge configuration.

    Use :meth:`start` (or the context manager) to spawn the workers, :meth:`merge` to
    run one merge window, :meth:`close` to stop and reap them.
    """

    def __init__(self, cfg: MergeConfig | None = None) -> None:
        self.cfg = cfg or MergeConfig()
        self.backend = ""
        self.port = 0
        self.pids: list[int] = []
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._tmpdir: tempfile.TemporaryDirectory | None = None
        self.checkpoint_dir = ""
        self._next_id = 0
        self._broken = False

    def start(self) -> MergeCluster:
        """Spawn the workers and wait until they have formed the process group.

        Raises:
            MergeWorkerError: a worker failed to start (its traceback is in the message).
        """
        import torch.multiprocessing as tmp

        self.backend = _choose_backend(self.cfg.backend, self.cfg.workers)
        if self.cfg.checkpoint_dir:
            os.makedirs(self.cfg.checkpoint_dir, exist_ok=True)
            self.checkpoint_dir = self.cfg.checkpoint_dir
        else:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="diloco-gym-merge-")
            self.checkpoint_dir = self._tmpdir.name
        self.port = free_port()
        ctx = tmp.get_context("spawn")
        try:
            for rank in range(self.cfg.workers):
                parent_conn, child_conn = ctx.Pipe()
                proc = ctx.Process(
                    target=_worker_main,
                    name=f"diloco-gym-merge-{rank}",
                    args=(
                        rank,
                        self.cfg.workers,
                        self.port,
                        self.cfg,
                        self.backend,
                        self.checkpoint_dir,
                        child_conn,
                    ),
                    daemon=True,
                )
                proc.start()
                child_conn.close()
                self._procs.append(proc)
                self._conns.append(parent_conn)
            replies = self._collect("ready", self.cfg.start_timeout_s, "start-up")
            self.pids = [int(replies[r][2]) for r in range(self.cfg.workers)]
        except BaseException:
            self._broken = True
            self.close()
            raise
        return self

    def _collect(self, kind: str, timeout_s: float, what: str) -> dict[int, tuple]:
        """Wait for one ``kind`` message per worker; fail fast when a worker dies."""
        replies: dict[int, tuple] = {}
        deadline = time.monotonic() + timeout_s
        sentinels = {proc.sentinel: rank for rank, proc in enumerate(self._procs)}
        conns = {id(c): rank for rank, c in enumerate(self._conns)}
        while len(replies) < len(self._procs):
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(len(self._procs))) - set(replies))
                raise MergeWorkerError(
                    f"merge workers {missing} gave no answer within {timeout_s:.0f} s during {what}"
                )
            waiting = [c for r, c in enumerate(self._conns) if r not in replies]
            ready = wait_ready(waiting + list(sentinels), timeout=min(left, 1.0))
            for obj in ready:
                if obj in sentinels:
                    continue  # handled below, after draining pipes that are ready
                rank = conns[id(obj)]
                try:
                    message = cast(Connection, obj).recv()  # not a sentinel: a pipe
                except (EOFError, OSError):
                    continue  # the process died; its sentinel reports it
                if message[0] == "error":
                    self._raise_failure(rank, message[2], what)
                if message[0] == kind:
                    replies[rank] = message
            for rank, proc in enumerate(self._procs):
                if rank not in replies and not proc.is_alive():
                    raise MergeWorkerError(
                        f"merge worker rank {rank} (pid {proc.pid}) died during {what} "
                        f"(exit code {proc.exitcode})"
                    )
        return replies

    def _raise_failure(self, rank: int, trace: str, what: str) -> None:
        """Raise for a worker that reported an error, blaming a dead peer if there is one.

        When a worker dies mid-collective its peers fail with a connection error at once,
        often before the dead one's sentinel is seen; the dead worker is the real news.
        """
        last = trace.strip().splitlines()[-1] if trace.strip() else "unknown error"
        deadline = time.monotonic() + 1.0
        while True:
            dead = [(r, p) for r, p in enumerate(self._procs) if r != rank and not p.is_alive()]
            if dead or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if dead:
            r, p = dead[0]
            raise MergeWorkerError(
                f"merge worker rank {r} (pid {p.pid}) died during {what} "
                f"(exit code {p.exitcode}); rank {rank} then failed: {last}"
            )
        detail = f"\n{trace.rstrip()}" if what == "start-up" else ""
        raise MergeWorkerError(f"merge worker rank {rank} failed during {what}: {last}{detail}")

    def merge(
        self, window_s: float, timeout_s: float | None = None, link_share: float = 1.0
    ) -> MergeReport:
        """Run one merge: all-reduce for ``window_s`` seconds, then the checkpoint.

        Args:
            window_s: how long the all-reduce loop runs (at least one round).
            link_share: in (0, 1]: the share of the window the transfers occupy (each
                round followed by a pause, see :func:`_allreduce_loop`); 1 sends at the
                full rate. The report then gives the share achieved (``achieved_share``).
            timeout_s: give up (and raise) after this long; default: window plus the
                collective timeout.

        Raises:
            MergeWorkerError: a worker died or failed; the cluster is then unusable and
                must be closed.
        """
        if not self._procs:
            raise MergeWorkerError("the merge cluster is not started")
        if not (isinstance(link_share, int | float) and 0.0 < link_share <= 1.0):
            raise ValueError(f"link_share must be in (0, 1], got {link_share!r}")
        merge_id = self._next_id
        self._next_id += 1
        for rank, conn in enumerate(self._conns):
            try:
                conn.send(("merge", merge_id, float(window_s), float(link_share)))
            except (OSError, ValueError) as exc:
                raise MergeWorkerError(f"merge worker rank {rank} is gone ({exc})") from None
        timeout = timeout_s if timeout_s is not None else (window_s + self.cfg.collective_timeout_s)
        try:
            replies = self._collect("done", timeout, f"merge {merge_id}")
        except BaseException:
            # The survivors may be blocked in a collective with a dead peer: do not wait
            # for them to stop politely.
            self._broken = True
            raise
        stats = [replies[r][3] for r in range(len(self._procs))]
        return MergeReport(
            merge_id,
            int(stats[0]["allreduces"]),
            int(stats[0]["bytes"]),
            float(stats[0]["allreduce_s"]),
            float(stats[0]["checkpoint_s"]),
            int(stats[0]["checkpoint_bytes"]),
            [float(s["worker_s"]) for s in stats],
            # Only a throttled merge reports its share: a full-rate merge's report is as it
            # was before shares existed.
            achieved_share=(
                None
                if link_share == 1.0
                else float(stats[0]["busy_s"]) / max(float(stats[0]["allreduce_s"]), 1e-9)
            ),
        )

    def kill_worker(self, rank: int) -> None:
        """SIGKILL worker ``rank`` (fault injection for tests)."""
        proc = self._procs[rank]
        if proc.pid is not None and proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop every worker and reap it (stop message, then SIGTERM, then SIGKILL)."""
        for conn in self._conns:
            try:
                conn.send(("stop",))
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + (0.5 if self._broken else timeout_s)
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
        for proc in self._procs:
            proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(2.0)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    def describe(self) -> dict:
        return {
            "workers": self.cfg.workers,
            "backend": self.backend,
            "merge_mb": self.cfg.merge_mb,
            "bytes": self.cfg.numel * 4,
            "init_method": f"tcp://127.0.0.1:{self.port}",
            "checkpoint": self.cfg.checkpoint,
            "checkpoint_dir": self.checkpoint_dir,
            "pids": list(self.pids),
        }

    def __enter__(self) -> MergeCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
