"""Median time of a CUDA callable by CUDA events, shared by the torch baseline scripts of bench/ (torch_mla_decode.py,
torch_mla_prefill.py): `warmup` untimed calls, then `iters` calls each timed alone; returns milliseconds."""
import torch


def time_ms(f, warmup=20, iters=100):
    for _ in range(warmup):
        f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        f()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    ts.sort()
    return ts[len(ts) // 2]
