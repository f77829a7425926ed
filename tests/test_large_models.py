"""Models bigger than this machine, measured on fake tensors (examples/llama_memory.py).

The full LLaMA-7B run takes ~45 s on two cores, so the test uses the same code with
fewer layers on a device scaled down to match: DDP (every rank holds the whole model,
its gradients, its buckets and Adam's state) runs out of memory; FSDP2 fits.
"""

import sys
from pathlib import Path

import pytest
import torch

import simcluster as sc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import llama_memory  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SMALL_A100 = {"name": "A100-6GB", "memory_gb": 6, "peak_tflops": {"float32": 19.5},
              "hbm_gbps": 2039}


@pytest.fixture(scope="module")
def outcomes():
    cluster = sc.Cluster.from_dict({"nodes": [{"devices": 8, "device": SMALL_A100}]})
    return llama_memory.main(layers=1, cluster=cluster)


def test_ddp_runs_out_of_memory(outcomes):
    error = outcomes["ddp"]
    assert isinstance(error, sc.OutOfMemoryError)
    assert isinstance(error, torch.OutOfMemoryError)
    assert error.capacity == 6 * 2**30
    assert error.in_use["parameters"] > 0


def test_fsdp_fits_with_sharded_optimizer_state(outcomes):
    run = outcomes["fsdp"]
    assert isinstance(run, sc.Run)
    psi = llama_memory.parameter_count(1)
    peak = run.peak_memory(0)  # during the training step (the example resets it before)
    assert peak["total"] <= 6 * 2**30
    after = run.results[0]  # memory in use on rank 0 right after optimizer.step()
    # Adam's two fp32 moments, sharded 8 ways (8·Ψ/8 bytes), plus a few bytes of step
    # counters
    assert after["optimizer state"] == pytest.approx(8 * psi / 8, rel=0.01)
    # FSDP2 has resharded: the rank keeps only its eighth of the fp32 parameters
    assert after["parameters"] == pytest.approx(4 * psi / 8, rel=0.01)
