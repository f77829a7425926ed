"""The examples run as the README says, and the simulated cluster agrees with a real launcher.

examples/train_ddp.py runs under torchrun (4 processes, gloo on CPU) and on 4 simulated
GPUs (--sim): the two runs must end with the same parameters and the same loss curve.
They are compared with a tolerance, not bit for bit: gloo sums the ranks' gradients in
its own order, the simulator in rank order.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_ddp.py"
TIMEOUT = 600   # seconds per run: generous, for a loaded two-core machine


def _run(command, out):
    """Run ``command`` (writing its results to ``out``); return the results."""
    done = subprocess.run(command + ["--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=TIMEOUT)
    assert done.returncode == 0, (f"{' '.join(command)} failed ({done.returncode}):\n"
                                  f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


@pytest.mark.slow
def test_train_ddp_gives_the_same_model_under_torchrun_and_on_the_simulated_cluster(tmp_path):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node=4", str(SCRIPT)]
    real = _run(torchrun, tmp_path / "gloo.json")
    simulated = _run([sys.executable, str(SCRIPT), "--sim"], tmp_path / "sim.json")

    assert len(real["losses"]) == len(simulated["losses"]) == 24   # 3 epochs x 8 steps
    torch.testing.assert_close(torch.tensor(simulated["losses"]),
                               torch.tensor(real["losses"]), rtol=1e-5, atol=1e-6)
    assert real["losses"][-1] < 0.5 * real["losses"][0], "the example does not learn"

    assert simulated["parameters"].keys() == real["parameters"].keys()
    for name, value in real["parameters"].items():
        torch.testing.assert_close(torch.tensor(simulated["parameters"][name]),
                                   torch.tensor(value), rtol=1e-5, atol=1e-6, msg=name)
