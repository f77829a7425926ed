"""What the fake-tensor cache saves per op: torch's FakeTensorMode against ``fake_dispatch``.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_fake_dispatch.py           # ~10 s
    PYTHONPATH=. .venv/bin/python benchmarks/bench_fake_dispatch.py --quick   # smoke test

Ops that lessons run many times on fake tensors, each called with the same metadata again
and again (as every rank and every layer of a model does): a matmul, an elementwise op,
a view, and DDP's copy of a gradient into its bucket (``mul.out``, which torch does not
cache). For each, the CPU time per call through FakeTensorMode (``op(*args)`` inside the
mode) and through ``_torch_internals.fake_dispatch`` (the simulator's road, answered from
its cache), interleaved, median over repetitions; the ratio is what the cache saves. Both
give the same result (tests/test_fake_cache.py).
"""

import argparse
import statistics
import time

import torch

from simcluster import _torch_internals

aten = torch.ops.aten


def _calls():
    """``(name, op, args, kwargs)`` on fake tensors of a mid-sized layer."""
    a, b, w = torch.empty(64, 512), torch.empty(64, 512), torch.empty(512, 512)
    bucket = torch.empty(64 * 512)
    return [("mm", aten.mm.default, (a, w), {}),
            ("add", aten.add.Tensor, (a, b), {}),
            ("view", aten.view.default, (a, [64 * 512]), {}),
            ("mul.out (DDP's bucket copy)", aten.mul.out, (bucket, 0.25), {"out": bucket})]


def _per_call(run, calls):
    """CPU seconds per call of ``run()`` over ``calls`` calls."""
    start = time.process_time()
    for _ in range(calls):
        run()
    return (time.process_time() - start) / calls


def main(calls=2000, repeats=5, quick=False, verbose=True):
    """Time every op both ways; print a table; return ``{name: {"torch", "sim", "ratio"}}``
    (seconds per call, and torch / sim)."""
    if quick:
        calls, repeats = 20, 1
    out = print if verbose else (lambda *a, **k: None)
    result = {}
    with _torch_internals.fake_tensor_mode():
        for name, op, args, kwargs in _calls():
            _torch_internals.fake_dispatch(op, args, kwargs)   # first call fills the cache
            torch_s, sim_s = [], []
            for _ in range(repeats):   # interleaved, so that load hits both alike
                torch_s.append(_per_call(lambda: op(*args, **kwargs), calls))
                sim_s.append(_per_call(
                    lambda: _torch_internals.fake_dispatch(op, args, kwargs), calls))
            t, s = statistics.median(torch_s), statistics.median(sim_s)
            result[name] = {"torch": t, "sim": s, "ratio": t / s if s else float("inf")}
    out(f"{'op on fake tensors':<30} {'FakeTensorMode':>15} {'fake_dispatch':>14} {'ratio':>7}")
    for name, r in result.items():
        out(f"{name:<30} {r['torch'] * 1e6:>12.1f} µs {r['sim'] * 1e6:>11.1f} µs"
            f" {r['ratio']:>6.1f}×")
    out("(CPU time per call, median of the repetitions; ratio = FakeTensorMode / fake_dispatch)")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repetition")
    main(quick=parser.parse_args().quick)
