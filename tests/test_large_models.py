"""Models bigger than this machine, measured on fake tensors (examples/llama_memory.py).

The full LLaMA-7B run takes minutes on two cores, so the test uses the same code with
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
    model = llama_memory.Llama(1).to("meta")
    psi = sum(p.numel() for p in model.parameters())
    peak = run.peak_memory(0)
    assert peak["total"] <= 6 * 2**30
    # Adam's two fp32 moments, sharded 8 ways, are all the optimizer state a rank keeps
    # (plus a few bytes of step counters).
    assert peak["optimizer state"] == pytest.approx(8 * psi / 8, rel=0.02) or \
        peak["optimizer state"] < 8 * psi / 8 * 1.02
    # every rank ends up holding only a shard of the model: a small fraction of DDP's
    final_params = run.recorder.memories[0].in_use["parameters"]
    assert final_params <= 4 * psi / 8 * 1.05
