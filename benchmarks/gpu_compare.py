"""Hold the simulator's charges against what one real GPU measured (``gpu_reference.py``).

    .venv/bin/python benchmarks/gpu_compare.py [benchmarks/results/gpu_h200.json]

Runs on any machine, no GPU: each piece of work ``gpu_reference.py`` timed on the GPU is
run again on one simulated rank of the same device (fake tensors: shapes, no data) and its
simulated time read with ``sc.now()``; the serving rows use ``serving.decode_time`` and
``prefill_time`` for the same OPT-13B shape. Each row prints the measured time, the
simulator's, and measured / simulated. The executing simulator charges every op at the
device's data-sheet peaks (a roofline), so for work it models fully the ratio is at least
1: how far above 1 is what a real kernel loses to the peak. A ratio far above that says
the simulator is missing work (``sdpa`` on CPU has no FLOPs yet; FP8 has no peak yet).
"""
import json
import pathlib
import sys

import torch
import torch.nn.functional as F

import simcluster as sc
from simcluster import planner, serving

HERE = pathlib.Path(__file__).parent
DEFAULT = HERE / "results" / "gpu_h200.json"

# The H200 SXM: the H100's tensor cores and peaks, 141 GB of HBM3e at 4.8 TB/s (NVIDIA's
# H200 data sheet); not a preset, so a custom device.
H200 = {"name": "H200-141GB", "memory_gb": 131, "hbm_gbps": 4800, "compute_capability": 9.0,
        "peak_tflops": {"float32": 67, "tf32": 494.5, "bfloat16": 989, "float16": 989,
                        "int8": 1979}}
OPT_13B = planner.TransformerConfig(layers=40, hidden=5120, heads=40, seq_len=2048,
                                    vocab=50272)


def h200_cluster():
    return sc.Cluster.from_dict({"name": "one H200",
                                 "nodes": [{"devices": 1, "device": H200,
                                            "fabric": "nvlink4"}]})


def simulated_seconds(cluster, work):
    """Seconds one rank's clock advances over ``work(fake_tensor_maker)``."""
    def rank():
        with sc.fake_tensors():
            tensors = work()
            start = sc.now()
            work.op(*tensors)
            return sc.now() - start
    return cluster.run(rank, world_size=1).results[0]


def _work(make, op):
    make.op = op
    return make


def gemm_row(cluster, row):
    m, k, n = row["m"], row["k"], row["n"]
    work = _work(lambda: (torch.empty(m, k, dtype=torch.bfloat16),
                          torch.empty(k, n, dtype=torch.bfloat16)), torch.mm)
    return f"gemm bf16 {m}x{k}x{n}", row["seconds"], simulated_seconds(cluster, work)


def sdpa_row(cluster, s):
    shape = (s["b"], s["h"], s["s"], s["d"])
    work = _work(lambda: tuple(torch.empty(shape, dtype=torch.bfloat16) for _ in range(3)),
                 lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    return ("sdpa causal fwd B{b} H{h} S{s} D{d}".format(**s), s["forward_seconds"],
            simulated_seconds(cluster, work))


def rows(report):
    cluster = h200_cluster()
    out = [gemm_row(cluster, r) for r in report["gemm"]]
    out.append(sdpa_row(cluster, report["sdpa"]))
    serve = report["serving"]
    scale = OPT_13B.layers / serve["layers_measured"]
    for d in serve["decode"]:
        measured = (d["graph_seconds"] or d["eager_seconds"]) * scale
        out.append((f"decode OPT-13B batch {d['batch']}, {serve['context']} ctx", measured,
                    serving.decode_time(OPT_13B, cluster, d["batch"], serve["context"],
                                        efficiency=planner.ROOFLINE)))
    for p in serve["prefill"]:
        out.append((f"prefill OPT-13B {p['tokens']} tokens", p["seconds"] * scale,
                    serving.prefill_time(OPT_13B, cluster, p["tokens"],
                                         efficiency=planner.ROOFLINE)))
    return out


def main(path=DEFAULT):
    report = json.loads(pathlib.Path(path).read_text())
    print(f"measured on {report['device']} (torch {report['torch']}, CUDA {report['cuda']}); "
          f"simulated on a custom H200 at its data-sheet peaks")
    print(f"HBM copy: {report['copy']['bytes_per_s'] / 1e12:.2f} TB/s measured, "
          f"{H200['hbm_gbps'] / 1e3:.1f} TB/s data sheet")
    print(f"{'work':44}{'measured':>12}{'simulated':>12}{'ratio':>8}")
    for name, measured, simulated in rows(report):
        print(f"{name:44}{measured * 1e6:10.1f}us{simulated * 1e6:10.1f}us"
              f"{measured / simulated:8.2f}")
    print("fp8 (torch._scaled_mm, e4m3, per-tensor scales) against bf16, speed-up:")
    for r in report["fp8"]:
        print(f"  {r['m']}x{r['k']}x{r['n']}: GEMM alone {r['gemm_speedup']:.2f}x "
              f"({r['flops'] / r['fp8_seconds'] / 1e12:.0f} TFLOP/s), with dynamic "
              f"scaling {r['dynamic_eager_speedup']:.2f}x eager, "
              f"{r['dynamic_compiled_speedup']:.2f}x compiled")


if __name__ == "__main__":
    main(*sys.argv[1:2])
