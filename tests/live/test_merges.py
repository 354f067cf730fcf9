"""Real merges (:mod:`diloco_gym.live.merges`): a gloo group of local workers all-reduces a
model-sized tensor for a window and writes the checkpoint; a throttled merge occupies only
its share of the window; a dead worker is noticed at once; every worker is reaped."""

from __future__ import annotations

import time
from multiprocessing import active_children

import pytest

from diloco_gym.live.errors import MergeWorkerError
from diloco_gym.live.merges import MergeCluster, MergeConfig, free_port

pytest.importorskip("torch")


def test_free_port_can_be_bound():
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_bad_settings_are_refused_before_anything_starts():
    with pytest.raises(ValueError, match="MergeConfig.workers must be an int >= 1"):
        MergeConfig(workers=0)
    with pytest.raises(ValueError, match="MergeConfig.backend must be auto, gloo or nccl"):
        MergeConfig(backend="mpi")
    with pytest.raises(MergeWorkerError, match="not started"):
        MergeCluster(MergeConfig()).merge(1.0)


@pytest.mark.slow
def test_full_and_throttled_merges_and_a_dead_worker():
    """One cluster: a full-rate merge fills its window with all-reduces; one at link share
    0.25 spends about a quarter of it in all-reduces (fewer rounds); a bad share is refused;
    a killed worker fails the next merge at once; close reaps every worker."""
    cluster = MergeCluster(MergeConfig(workers=2, merge_mb=2, backend="gloo"))
    with cluster:
        assert cluster.backend == "gloo" and len(cluster.pids) == 2
        full = cluster.merge(1.0)
        assert full.allreduce_s >= 1.0 and full.allreduces >= 2
        assert full.bytes_per_allreduce == 2 * 2**20 and full.checkpoint_bytes >= 2 * 2**20
        assert full.achieved_share is None  # a full-rate report is as before shares existed
        slow = cluster.merge(1.0, link_share=0.25)
        assert slow.allreduce_s >= 1.0
        assert slow.achieved_share is not None and 0.1 <= slow.achieved_share <= 0.45, slow
        assert slow.allreduces < full.allreduces
        with pytest.raises(ValueError, match=r"link_share must be in \(0, 1\], got 0"):
            cluster.merge(1.0, link_share=0)
        cluster.kill_worker(1)
        t0 = time.monotonic()
        with pytest.raises(MergeWorkerError, match="rank 1"):
            cluster.merge(5.0)
        assert time.monotonic() - t0 < 30.0
    deadline = time.monotonic() + 5.0
    while active_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert active_children() == []
