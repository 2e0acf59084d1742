#!/usr/bin/env python3
"""Times the plain torch reference of absorbed MLA decode (two bf16 batched matmuls and an fp32
softmax) on the `kdalab bench --op mla-decode` shapes, in the same machine session as kdalab, and
writes {"mla-decode B=.. T=.. H=.. HV=..": milliseconds} for `kdalab bench --peer-json`.

This is kdalab's own baseline (torch matmul + softmax; docs/kernels/mla_decode.md), not a peer's code.
Usage: python3 bench/torch_mla_decode.py OUT.json [B:N:H ...]
Per shape: C [B, N, 512] bf16 latent cache, q~ [B, H, 512] bf16;
  s = scale * q~ C^T (fp32 softmax), a = softmax(s) C. Median of CUDA-event timings after warm-up.
"""
import json
import sys

try:
    import torch
except ImportError as e:  # one line, exit 3 (cannot run here), as kdalab's commands
    sys.stderr.write(f"torch_mla_decode.py: cannot run here: needs torch ({e})\n")
    sys.exit(3)

from cuda_events import time_ms  # bench/cuda_events.py, beside this script


def mla_decode(B, N, H, d_c=512):
    g = torch.Generator(device="cuda").manual_seed(1234)
    C = torch.randn(B, N, d_c, device="cuda", dtype=torch.bfloat16, generator=g)
    q = torch.randn(B, H, d_c, device="cuda", dtype=torch.bfloat16, generator=g)
    scale = (128 + 64) ** -0.5

    def f():
        s = torch.bmm(q, C.transpose(1, 2)).float() * scale
        p = torch.softmax(s, dim=-1).to(torch.bfloat16)
        return torch.bmm(p, C)

    return time_ms(f)


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) >= 2 else 2)
    if not torch.cuda.is_available():
        sys.stderr.write("torch_mla_decode.py: cannot run here: torch sees no CUDA device\n")
        sys.exit(3)
    shapes = sys.argv[2:] or ["1:65536:32", "1:1048576:32", "64:32768:32", "1:8192:32", "8:8192:32", "256:4096:32"]
    out = {}
    for sh in shapes:
        B, N, H = (int(x) for x in sh.split(":"))
        key = f"mla-decode B={B} T={N} H={H} HV={H}"
        out[key] = mla_decode(B, N, H)
        print(f"{key}: torch {out[key]:.4f} ms", flush=True)
        torch.cuda.empty_cache()
    with open(sys.argv[1], "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
