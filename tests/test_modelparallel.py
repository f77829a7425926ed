"""workbook.lesson04_model_parallel.demos,
the lesson 04 demonstration: the naive split on fake tensors
fits where one GPU does not, keeps one GPU busy at a time, and its transfers and layer
times are read correctly from the ranks' clocks."""

import functools

import pytest

import simcluster as sc
from workbook.lesson04_model_parallel import demos as mp
from workbook import pipeline

SMALL = functools.partial(mp.big_mlp, width=4096, depth=8)   # 134 M parameters


def test_the_big_model_runs_out_of_memory_on_one_gpu_and_fits_on_two():
    cluster = sc.Cluster.preset("dgx-a100")
    with pytest.raises(sc.OutOfMemoryError, match="optimizer state"):
        mp.run_naive_split(cluster, p=1)
    run = mp.run_naive_split(cluster, p=2, adam=False)
    assert run.peak_memory(0)["parameters"] == pytest.approx(12 * 2**30, rel=1e-3)  # 12 layers


def test_the_naive_split_keeps_one_gpu_busy_at_a_time():
    run = mp.run_naive_split(sc.Cluster.preset("dgx-a100"), p=4, make_model=SMALL,
                             adam=False)
    assert 1 - pipeline.bubble(run) == pytest.approx(1 / 4, abs=0.02)


def test_transfers_are_read_from_the_clocks_and_match_alpha_beta():
    cluster = sc.Cluster.preset("dgx-a100", nodes=2)
    run = mp.run_naive_split(cluster, placement=[0, 8], make_model=SMALL, batch=256)
    found = mp.sends(run)
    assert set(found) == {(0, 8), (8, 0)}
    nbytes = 256 * 4096 * 4
    alpha, beta, seconds = mp.p2p_formula(cluster, 0, 8, nbytes)
    assert alpha == 14e-6 and 1 / beta == pytest.approx(25e9 * 0.95)
    assert found[(0, 8)] == [pytest.approx(seconds)]
    assert mp.p2p_formula(cluster, 0, 1, nbytes)[2] < seconds / 5   # NVSwitch


def test_layer_times_and_the_stream_follow_the_slowest_stage():
    cluster = sc.Cluster.preset("dgx-a100")
    model = functools.partial(mp.language_model, width=512, blocks=4, head_ratio=32)
    times = mp.layer_times(cluster.run(mp.stream_forward, world_size=1, args=(model, 1, 1024)))
    assert list(times) == [0, 1, 2, 3, 4]
    assert times[4] == pytest.approx(4 * times[0], rel=0.05)      # the head: four blocks
    slow = cluster.run(mp.stream_forward, world_size=2, args=(model, 8, 1024, [3])).elapsed
    even = cluster.run(mp.stream_forward, world_size=2, args=(model, 8, 1024, [4])).elapsed
    t = list(times.values())
    assert slow == pytest.approx(sum(t) + 7 * (t[3] + t[4]), rel=0.02)
    assert even == pytest.approx(sum(t) + 7 * 4 * t[0], rel=0.02)


def test_torchs_schedule_with_one_micro_batch_is_the_naive_split():
    cluster = sc.Cluster.preset("dgx-a100")
    mine = mp.run_naive_split(cluster, p=2, make_model=SMALL, adam=False)
    torchs = cluster.run(mp.torch_pipeline_step, world_size=2, kwargs={"make_model": SMALL})
    assert torchs.elapsed == pytest.approx(mine.elapsed, rel=1e-3)
    piped = cluster.run(mp.torch_pipeline_step, world_size=2,
                        kwargs={"make_model": SMALL, "micro_batches": 4})
    assert piped.elapsed < 0.7 * mine.elapsed       # 4 micro-batches overlap the stages
