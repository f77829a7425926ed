"""Measure on a real GPU the numbers the simulator's roofline, FP8 and serving models stand on.

Run it on a machine with one CUDA GPU (it needs nothing but PyTorch; it does not import
simcluster, so any recent torch with CUDA will do):

    python benchmarks/gpu_reference.py --out gpu_reference.json

It writes one JSON file of measured seconds and rates; ``gpu_compare.py`` (run anywhere,
no GPU) prints them beside what the simulator charges for the same work. The measurements:

* ``copy``: HBM bandwidth of a device-to-device copy (bytes read + written).
* ``gemm``: bf16 matrix products, square and skinny (M = 1 … 4096 rows against an
  8192 × 8192 weight): where the roofline's memory-bound region ends.
* ``fp8``: ``torch._scaled_mm`` on float8_e4m3fn against a bf16 product of the same shape,
  the product alone and with the dynamic per-tensor scaling a float8 linear pays first
  (two amax reductions and two casts over HBM), eager and fused by ``torch.compile``.
* ``sdpa``: causal flash attention, B 1, H 8, S 4096, D 64, bf16, forward and backward.
* ``decode`` / ``prefill``: an OPT-13B-shaped decoder (hidden 5,120, 40 heads, MLP 4×)
  with random weights, ``--layers`` of its 40 layers (the time per layer is the same for
  every layer, so the compare step scales it to 40): one decode step at batch 1 … 256 with
  512 tokens of KV cache per sequence, replayed as a CUDA graph as vLLM does; prefill of
  one 512-token prompt.

Every time is the median of ``--reps`` samples after warm-up, taken with CUDA events
around enough back-to-back calls to last a millisecond (a short kernel is otherwise timed
as its launch).
"""
import argparse
import json
import platform
import statistics

import torch
import torch.nn.functional as F


def timed(fn, reps, warmup=3, floor=1e-3):
    """Median seconds of one ``fn()``: each of ``reps`` samples times enough back-to-back
    calls between two CUDA events to last ``floor`` seconds, so that a short kernel's time
    is not its launch's (Python launching one kernel takes longer than a small product)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    calls = 1
    while True:
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        if start.elapsed_time(end) / 1e3 >= floor or calls >= 4096:
            break
        calls *= 2
    times = []
    for _ in range(reps):
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    return statistics.median(times)


def measure_copy(reps):
    n = 2 * 1024**3  # 2 GiB: many times the L2
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    seconds = timed(lambda: dst.copy_(src), reps)
    return {"bytes_moved": 2 * n, "seconds": seconds, "bytes_per_s": 2 * n / seconds}


def measure_gemm(reps):
    rows = []
    shapes = [(n, n, n) for n in (1024, 2048, 4096, 8192, 16384)]
    shapes += [(m, 8192, 8192) for m in (1, 16, 64, 256, 1024, 4096)]
    for m, k, n in shapes:
        a = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        b = torch.randn(k, n, dtype=torch.bfloat16, device="cuda")
        seconds = timed(lambda: a @ b, reps)
        flops, nbytes = 2 * m * k * n, 2 * (m * k + k * n + m * n)
        rows.append({"m": m, "k": k, "n": n, "seconds": seconds, "flops": flops,
                     "bytes": nbytes, "flops_per_s": flops / seconds})
    return rows


def _fp8(t):
    """Dynamic per-tensor scaling: the scale maps the tensor's amax onto e4m3's maximum."""
    finfo = torch.finfo(torch.float8_e4m3fn)
    scale = t.abs().amax().float().clamp(min=1e-12) / finfo.max
    return (t / scale).clamp(finfo.min, finfo.max).to(torch.float8_e4m3fn), scale


def measure_fp8(reps):
    rows = []
    for m, k, n in [(1024, 2048, 1024), (4096, 4096, 4096), (4096, 8192, 16384),
                    (8192, 8192, 8192)]:
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda")   # a linear's weight
        x8, sx = _fp8(x)
        w8, sw = _fp8(w)

        def scaled(x8=x8, w8=w8, sx=sx, sw=sw):
            # _scaled_mm wants the second operand column-major: w8.t() is.
            return torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw,
                                    out_dtype=torch.bfloat16)

        def dynamic(x=x, w=w):
            xq, sxq = _fp8(x)
            wq, swq = _fp8(w)
            return torch._scaled_mm(xq, wq.t(), scale_a=sxq, scale_b=swq,
                                    out_dtype=torch.bfloat16)

        bf16 = timed(lambda: x @ w.t(), reps)
        fp8 = timed(scaled, reps)
        fp8_dynamic = timed(dynamic, reps)
        # Fused as torchao's float8 training fuses them: amax, scale and cast in few kernels.
        fp8_compiled = timed(torch.compile(dynamic), reps)
        rows.append({"m": m, "k": k, "n": n, "bf16_seconds": bf16, "fp8_seconds": fp8,
                     "fp8_dynamic_eager_seconds": fp8_dynamic,
                     "fp8_dynamic_compiled_seconds": fp8_compiled, "flops": 2 * m * k * n,
                     "gemm_speedup": bf16 / fp8, "dynamic_eager_speedup": bf16 / fp8_dynamic,
                     "dynamic_compiled_speedup": bf16 / fp8_compiled})
    return rows


def measure_sdpa(reps):
    b, h, s, d = 1, 8, 4096, 64
    q, k, v = (torch.randn(b, h, s, d, dtype=torch.bfloat16, device="cuda",
                           requires_grad=True) for _ in range(3))
    forward = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), reps)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    grad = torch.randn_like(out)

    def backward():
        torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)

    backward_seconds = timed(backward, reps)
    # torch.utils.flop_counter's sdpa formulas, halved for the causal mask as flash
    # attention skips the masked blocks.
    forward_flops = 4 * b * h * s * s * d // 2
    return {"b": b, "h": h, "s": s, "d": d, "causal": True, "forward_seconds": forward,
            "backward_seconds": backward_seconds, "forward_flops": forward_flops,
            "backward_flops": 5 * forward_flops // 2}


class Layer(torch.nn.Module):
    """One OPT-shaped decoder layer (pre-LayerNorm, MHA, 4× GELU MLP), fp16."""

    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(hidden), torch.nn.LayerNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.out = torch.nn.Linear(hidden, hidden)
        self.up = torch.nn.Linear(hidden, 4 * hidden)
        self.down = torch.nn.Linear(4 * hidden, hidden)

    def forward(self, x, cache_k=None, cache_v=None):
        b, s, hidden = x.shape
        d = hidden // self.heads
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d).permute(2, 0, 3, 1, 4)
        if cache_k is not None:
            # Decode: the new token attends to the whole cache (its own K/V written at the
            # cache's last slot, as a paged cache would hold it).
            cache_k[:, :, -1:] = k
            cache_v[:, :, -1:] = v
            k, v = cache_k, cache_v
        a = F.scaled_dot_product_attention(q, k, v, is_causal=cache_k is None)
        x = x + self.out(a.transpose(1, 2).reshape(b, s, hidden))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


def measure_serving(layers, reps, context=512, batches=(1, 8, 64, 128, 256)):
    hidden, heads = 5120, 40
    torch.manual_seed(0)
    with torch.device("cuda"):  # built on the GPU: initialising 2.5 G parameters on a CPU is slow
        model = torch.nn.ModuleList(Layer(hidden, heads) for _ in range(layers)).half()
    d = hidden // heads
    result = {"hidden": hidden, "heads": heads, "layers_measured": layers,
              "context": context, "decode": [], "prefill": []}
    with torch.inference_mode():
        for batch in batches:
            x = torch.randn(batch, 1, hidden, dtype=torch.half, device="cuda")
            caches = [tuple(torch.randn(batch, heads, context + 1, d, dtype=torch.half,
                                        device="cuda") for _ in range(2))
                      for _ in range(layers)]

            def step(x=x, caches=caches):
                y = x
                for layer, (ck, cv) in zip(model, caches):
                    y = layer(y, ck, cv)
                return y

            eager = timed(step, reps)
            graph_seconds = None
            try:
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    step()
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    step()
                graph_seconds = timed(graph.replay, reps)
            except RuntimeError as error:  # the eager time still stands
                result.setdefault("graph_errors", []).append(f"batch {batch}: {error}")
            result["decode"].append({"batch": batch, "eager_seconds": eager,
                                     "graph_seconds": graph_seconds})
            del caches
            torch.cuda.empty_cache()
        for tokens in (128, 512, 2048):
            x = torch.randn(1, tokens, hidden, dtype=torch.half, device="cuda")

            def prefill(x=x):
                y = x
                for layer in model:
                    y = layer(y)
                return y

            result["prefill"].append({"tokens": tokens, "seconds": timed(prefill, reps)})
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_reference.json")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_reference.py measures a CUDA GPU; none is visible here")
    props = torch.cuda.get_device_properties(0)
    report = {"device": props.name, "memory_bytes": props.total_memory,
              "multiprocessors": props.multi_processor_count, "torch": torch.__version__,
              "cuda": torch.version.cuda, "python": platform.python_version()}
    for name, run in [("copy", lambda: measure_copy(args.reps)),
                      ("gemm", lambda: measure_gemm(args.reps)),
                      ("fp8", lambda: measure_fp8(args.reps)),
                      ("sdpa", lambda: measure_sdpa(args.reps)),
                      ("serving", lambda: measure_serving(args.layers, args.reps))]:
        try:
            report[name] = run()
        except Exception as error:  # one failed part must not lose the others
            report[name] = {"error": f"{type(error).__name__}: {error}"}
        print(name, json.dumps(report[name])[:400], flush=True)
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
