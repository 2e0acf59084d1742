#!/usr/bin/env python3
"""Times the plain torch reference of absorbed MLA decode (two bf16 batched matmuls and an fp32
softmax) on the `kdalab bench --op mla-decode` shapes, in the same machine session as kdalab, and
writes {"mla-decode B=.. T=.. H=.. HV=..": milliseconds} for `kdalab bench --peer-json`.

This is kdalab's own baseline (torch matmul + softmax; docs/kernels/mla_decode.md), not a peer's code.
Usage: python3 bench/torch_mla_decode.py OUT.json [B:N:H ...] [--force]
Per shape: C [B, N, 512] bf16 latent cache, q~ [B, H, 512] bf16;
  s = scale * q~ C^T (fp32 softmax), a = softmax(s) C. Median of CUDA-event timings after warm-up.
Arguments and OUT.json follow kdalab's rules (bench/torch_baseline.py): bad ones are one line, exit 2, nothing
written; without torch or a CUDA device, one line, exit 3.
"""
import sys

import torch_baseline as tb  # bench/torch_baseline.py, beside this script

DEFAULT_SHAPES = [(1, 65536, 32), (1, 1048576, 32), (64, 32768, 32), (1, 8192, 32), (8, 8192, 32), (256, 4096, 32)]


def mla_decode(torch, B, N, H, d_c=512):
    g = torch.Generator(device="cuda").manual_seed(1234)
    C = torch.randn(B, N, d_c, device="cuda", dtype=torch.bfloat16, generator=g)
    q = torch.randn(B, H, d_c, device="cuda", dtype=torch.bfloat16, generator=g)
    scale = (128 + 64) ** -0.5

    def f():
        s = torch.bmm(q, C.transpose(1, 2)).float() * scale
        p = torch.softmax(s, dim=-1).to(torch.bfloat16)
        return torch.bmm(p, C)

    return tb.time_ms(f)


def main():
    p = tb.Parser(prog="torch_mla_decode.py", description=__doc__.splitlines()[0])
    p.add_argument("out", metavar="OUT.json", help="peer-time JSON for kdalab bench --peer-json")
    p.add_argument("shapes", nargs="*", type=tb.shape_arg("B:N:H"), metavar="B:N:H",
                   help="shapes (default: bench's mla-decode shapes)")
    p.add_argument("--force", action="store_true", help="replace an existing OUT.json")
    a = p.parse_args()
    tb.check_outputs(p, [("OUT.json", a.out)], a.force)
    torch = tb.cuda_torch(p.prog)
    out = {}
    for B, N, H in a.shapes or DEFAULT_SHAPES:
        key = f"mla-decode B={B} T={N} H={H} HV={H}"
        out[key] = mla_decode(torch, B, N, H)
        print(f"{key}: torch {out[key]:.4f} ms", flush=True)
        torch.cuda.empty_cache()
    tb.write_json(a.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
