#!/usr/bin/env python3
"""Times torch's MLA prefill on the `kdalab bench --op mla-prefill` shapes, in the same machine session as kdalab,
and writes {"mla-prefill-fast B=.. T=.. H=.. HV=..[ N0=..]": milliseconds} (torch's fastest SDPA backend) for
`kdalab bench --peer-json`; with --accuracy, also the error of each SDPA backend and of kdalab's two precisions
against a float64 truth on identical inputs.

This is what a torch user runs for MLA prefill without kdalab (docs/kernels/mla_prefill.md), not a peer's code:
  K = C W_UK^T, V = C W_UV^T (bf16 matmuls, per head [B, H, N, 128]), o = SDPA(q^C, K, V) causal, with the T new
  tokens behind N0 cached ones (the causal mask aligned at the lower right: query t sees keys 0 .. N0 + t).
Per backend (cuDNN, flash, memory-efficient; torch.nn.attention.sdpa_kernel): the K, V products + SDPA, median of
CUDA-event timings after warm-up; a backend that refuses the inputs is reported as such (null in the JSON).
Usage: python3 bench/torch_mla_prefill.py OUT.json [B:T:H[+N0] ...] [--prefix N0] [--accuracy FILE.json]
       [--sustained SECONDS] [--force]
Shapes default to bench's (1:8192:32, 1:2048:32, 8:512:32 and 1:2048:32+32768). As in `kdalab bench`, a shape's own
+N0 is its cached prefix; --prefix applies to the shapes without one.
Arguments and outputs follow kdalab's rules (bench/torch_baseline.py): bad ones are one line, exit 2, nothing
written; the outputs are written at the end, each whole; without torch or a CUDA device, one line, exit 3.
"""
import argparse
import math
import sys

import torch_baseline as tb  # bench/torch_baseline.py, beside this script

DC, DH = 512, 128
torch = None  # imported by main() after the arguments are checked
BACKENDS = {}


def inputs(B, T, H, N0, seed=1234, sigma=1.0):
    """kdalab's test distribution (tests/gpu/test_mla_prefill.cpp HeadsProblem): latents N(0, 1), W_UK and W_UV
    N(0, 1/d_c), q^C sigma N(0, 1), all rounded to bf16; scale 1/sqrt(d_nope)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    N = N0 + T
    C = torch.randn(B, N, DC, device="cuda", generator=g).bfloat16()
    W_UK = (torch.randn(H * DH, DC, device="cuda", generator=g) / math.sqrt(DC)).bfloat16()
    W_UV = (torch.randn(H * DH, DC, device="cuda", generator=g) / math.sqrt(DC)).bfloat16()
    q = (sigma * torch.randn(B, T, H, DH, device="cuda", generator=g)).bfloat16()
    return C, W_UK, W_UV, q, DH ** -0.5


def causal_mask(T, N0, device):
    """[T, N] boolean: query t (absolute position N0 + t) sees keys 0 .. N0 + t."""
    return torch.arange(N0 + T, device=device)[None, :] <= (N0 + torch.arange(T, device=device))[:, None]


def torch_mla(C, W_UK, W_UV, q, scale, N0):
    """o [B, T, H, 128] by bf16 K, V products and SDPA (whichever backend the context allows)."""
    B, N, _ = C.shape
    T, H = q.shape[1], q.shape[2]
    K = (C @ W_UK.t()).view(B, N, H, DH).transpose(1, 2)
    V = (C @ W_UV.t()).view(B, N, H, DH).transpose(1, 2)
    qh = q.transpose(1, 2)
    if N0 == 0:
        o = torch.nn.functional.scaled_dot_product_attention(qh, K, V, is_causal=True, scale=scale)
    else:
        o = torch.nn.functional.scaled_dot_product_attention(qh, K, V, attn_mask=causal_mask(T, N0, C.device),
                                                             scale=scale)
    return o.transpose(1, 2)


def truth(C, W_UK, W_UV, q, scale, N0):
    """float64 o [B, T, H, 128] on the same bf16 inputs."""
    B, N, _ = C.shape
    T, H = q.shape[1], q.shape[2]
    Cd = C.double()
    K = (Cd @ W_UK.double().t()).view(B, N, H, DH).transpose(1, 2)
    V = (Cd @ W_UV.double().t()).view(B, N, H, DH).transpose(1, 2)
    s = (q.double().transpose(1, 2) @ K.transpose(-1, -2)) * scale
    s = s.masked_fill(~causal_mask(T, N0, C.device), float("-inf"))
    return (torch.softmax(s, dim=-1) @ V).transpose(1, 2)


def rel_rms(x, ref):
    return float(torch.linalg.vector_norm(x.double() - ref) / torch.linalg.vector_norm(ref))


def key_of(B, T, H, N0):
    return f"mla-prefill-fast B={B} T={T} H={H} HV={H}" + (f" N0={N0}" if N0 else "")


def accuracy(cases):
    """Relative RMS of o against float64 for every SDPA backend and for kdalab's precisions (when kdalab.cuda
    imports), on identical inputs per case."""
    try:
        import kdalab.cuda as kc
    except Exception as e:  # kdalab's CUDA module is optional here
        kc = None
        print(f"kdalab.cuda not available ({e}); torch backends only", flush=True)
    rows = []
    for (B, T, H, N0, sigma) in cases:
        C, W_UK, W_UV, q, scale = inputs(B, T, H, N0, seed=99, sigma=sigma)
        ref = truth(C, W_UK, W_UV, q, scale, N0)
        row = {"B": B, "T": T, "H": H, "N0": N0, "sigma": sigma}
        for name, be in BACKENDS.items():
            try:
                with sdpa_kernel([be]):
                    row[f"torch_{name}"] = rel_rms(torch_mla(C, W_UK, W_UV, q, scale, N0).float(), ref)
            except RuntimeError as e:
                row[f"torch_{name}"] = None
                print(f"  {name}: refused ({str(e).splitlines()[0][:100]})", flush=True)
        if kc is not None:
            for prec in ("accurate", "fast"):
                cache = torch.zeros((B, N0 + T, DC), dtype=torch.bfloat16, device="cuda")
                cache[:, :N0] = C[:, :N0]
                o = kc.mla_prefill(cache, q.contiguous(), W_UK, W_UV, prefix=N0, scale=scale,
                                   c_new=C[:, N0:].contiguous(), precision=prec)
                row[f"kdalab_{prec}"] = rel_rms(o, ref)
        rows.append(row)
        print("accuracy " + ", ".join(f"{k} {v:.3e}" if isinstance(v, float) and k not in ("sigma",) else f"{k} {v}"
                                      for k, v in row.items()), flush=True)
    return rows


def sustained(shapes, best, seconds):
    """kdalab's precision fast (kdalab.cuda.mla_prefill, o in fp32 as bench's row and in bf16 as torch's) and torch's
    fastest backend `best[shape]` timed in turn, blocks of 10 back-to-back calls each (one event pair a block), for
    `seconds` seconds a shape: so that both run at the same clocks. A long run of either reaches the board's power cap within about a second on an H100
    (docs/kernels/mla_prefill.md, "Why the in-line entries run high"), which times taken first in a fresh process do
    not see. Returns {key: {"kdalab_fp32_o": ms, "kdalab_bf16_o": ms, "torch_<backend>": ms, "calls": n}} (medians of
    the per-call times), or None without kdalab.cuda."""
    import time
    try:
        import kdalab.cuda as kc
    except Exception as e:  # kdalab's CUDA module is optional here
        print(f"kdalab.cuda not available ({e}); no sustained timing", flush=True)
        return None
    res = {}
    for B, T, H, N0 in shapes:
        name = best.get((B, T, H, N0))
        if name is None:
            continue
        C, W_UK, W_UV, q, scale = inputs(B, T, H, N0)
        W = torch.cat([W_UK, W_UV])  # [W_UK; W_UV] in one allocation, as bench holds them
        wuk, wuv = W[:H * DH], W[H * DH:]
        cache = torch.zeros((B, N0 + T, DC), dtype=torch.bfloat16, device="cuda")
        cache[:, :N0] = C[:, :N0]
        c_new, qc = C[:, N0:].contiguous(), q.contiguous()
        ws = kc.mla_prefill_workspace(cache, qc, prefix=N0, precision="fast")
        o32 = torch.empty((B, T, H, DH), dtype=torch.float32, device="cuda")
        o16 = torch.empty((B, T, H, DH), dtype=torch.bfloat16, device="cuda")
        calls = {
            "kdalab_fp32_o": lambda: kc.mla_prefill(cache, qc, wuk, wuv, prefix=N0, scale=scale, c_new=c_new,
                                                    precision="fast", out=o32, workspace=ws),
            "kdalab_bf16_o": lambda: kc.mla_prefill(cache, qc, wuk, wuv, prefix=N0, scale=scale, c_new=c_new,
                                                    precision="fast", out=o16, workspace=ws),
            f"torch_{name}": lambda: torch_mla(C, W_UK, W_UV, q, scale, N0),
        }
        ts = {k: [] for k in calls}
        t_end = time.monotonic() + seconds
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with sdpa_kernel([BACKENDS[name]]):
            while time.monotonic() < t_end or not ts["kdalab_fp32_o"]:
                for k, f in calls.items():
                    f()  # one untimed call, then 10 back to back between two events: the GPU's time per call, not
                    e0.record()  # the host's (kdalab's Python entry takes longer to launch than a short shape runs)
                    for _ in range(10):
                        f()
                    e1.record()
                    e1.synchronize()
                    ts[k].append(e0.elapsed_time(e1) / 10)
        key = key_of(B, T, H, N0)
        res[key] = {k: sorted(v)[len(v) // 2] for k, v in ts.items()}
        res[key]["calls"] = 11 * len(ts["kdalab_fp32_o"])
        print(f"{key} sustained {seconds:g} s, in turn: " + ", ".join(
            f"{k} {v:.4f} ms" if k != "calls" else f"{v} calls each" for k, v in res[key].items()), flush=True)
        del C, W_UK, W_UV, W, q, cache
        torch.cuda.empty_cache()
    return res


def prefill_shape_arg(text):
    """An argparse type for B:T:H[+N0] (kdalab bench's mla-prefill shapes): (B, T, H, N0) with N0 None when the
    shape names no prefix (--prefix applies). A '+' after a digit starts N0 (decimal digits, N0 + T <= 2^31 - 1)."""
    cut = text.rfind("+")
    own = cut >= 1 and text[cut - 1].isdigit()
    n0 = text[cut + 1:] if own else None
    try:
        B, T, H = tb.shape_arg("B:T:H")(text[:cut] if own else text)
        if own and not (n0.isascii() and n0.isdigit() and int(n0) <= tb.INT32_MAX - T):
            raise argparse.ArgumentTypeError()
    except (argparse.ArgumentTypeError, ValueError):  # ValueError: an N0 past int()'s digit limit
        raise argparse.ArgumentTypeError(f"shape '{text}'; accepted: B:T:H[+N0], B, T, H integers >= 1, H <= 256, "
                                         f"each <= {tb.INT32_MAX}; N0 >= 0 cached tokens (decimal digits), N0 + T <= "
                                         f"{tb.INT32_MAX}") from None
    return B, T, H, int(n0) if own else None


DEFAULT_SHAPES = [(1, 8192, 32, None), (1, 2048, 32, None), (8, 512, 32, None), (1, 2048, 32, 32768)]


def main():
    global torch, BACKENDS, SDPBackend, sdpa_kernel
    p = tb.Parser(prog="torch_mla_prefill.py", description=__doc__.splitlines()[0])
    p.add_argument("out", metavar="OUT.json", help="peer-time JSON for kdalab bench --peer-json")
    p.add_argument("shapes", nargs="*", type=prefill_shape_arg, metavar="B:T:H[+N0]",
                   help="shapes, +N0 the shape's own cached prefix (default: bench's mla-prefill shapes)")
    p.add_argument("--prefix", type=int, default=0,
                   help="cached tokens N0 before the T new ones of the shapes without their own +N0, >= 0 (default 0)")
    p.add_argument("--accuracy", metavar="FILE.json", help="also measure the error against float64 into FILE.json")
    p.add_argument("--sustained", metavar="SECONDS", type=float, default=0.0,
                   help="also time kdalab's precision fast (kdalab.cuda) and torch's fastest backend in turn for "
                        "SECONDS seconds a shape, both at the clocks a long run gets (0: off; at most 600)")
    p.add_argument("--force", action="store_true", help="replace existing output files")
    a = p.parse_args()
    if not (0.0 <= a.sustained <= 600.0):  # also NaN
        p.error(f"--sustained {a.sustained}; accepted: 0 <= SECONDS <= 600")
    given = a.shapes or DEFAULT_SHAPES
    longest = max([T for _, T, _, n0 in given if n0 is None] or [0])
    if a.prefix < 0 or a.prefix > tb.INT32_MAX - longest:
        p.error(f"--prefix {a.prefix}; accepted: 0 <= N0 <= 2^31 - 1 - T = {tb.INT32_MAX - longest}")
    shapes = []  # (B, T, H, N0), each once: a repeated given shape is refused, a repeated default row dropped
    for B, T, H, n0 in given:
        shape = (B, T, H, a.prefix if n0 is None else n0)
        if shape in shapes and a.shapes:
            p.error(f"shape {B}:{T}:{H}+{shape[3]} is given more than once (as +N0 or through --prefix); give each "
                    "shape once")
        if shape not in shapes:
            shapes.append(shape)
    tb.check_outputs(p, [("OUT.json", a.out)] + ([("--accuracy", a.accuracy)] if a.accuracy is not None else []),
                     a.force)
    torch = tb.cuda_torch(p.prog)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    out = {"_what": "torch: bf16 K, V products + SDPA on its fastest backend (ms), per kdalab mla-prefill-fast key"}
    best = {}  # (B, T, H, N0): the fastest backend's name
    for B, T, H, N0 in shapes:
        C, W_UK, W_UV, q, scale = inputs(B, T, H, N0)
        times = {}
        for name, be in BACKENDS.items():
            try:
                with sdpa_kernel([be]):
                    times[name] = tb.time_ms(lambda: torch_mla(C, W_UK, W_UV, q, scale, N0), 10, 50)
            except RuntimeError as e:
                times[name] = None
                print(f"  {name}: refused ({str(e).splitlines()[0][:100]})", flush=True)
        proj = tb.time_ms(lambda: ((C @ W_UK.t()), (C @ W_UV.t())), 10, 50)
        key = key_of(B, T, H, N0)
        ok = [t for t in times.values() if t is not None]
        out[key] = min(ok) if ok else None
        if ok:
            best[(B, T, H, N0)] = min((t, n) for n, t in times.items() if t is not None)[1]
        print(f"{key}: torch " + ", ".join(f"{n} {t:.4f} ms" if t is not None else f"{n} refused"
                                           for n, t in times.items()) + f"; the two K, V products alone {proj:.4f} ms",
              flush=True)
        del C, W_UK, W_UV, q
        torch.cuda.empty_cache()
    if a.sustained > 0:
        sus = sustained(shapes, best, a.sustained)
        if sus is not None:
            out["_sustained"] = sus
    rows = None
    if a.accuracy:
        rows = accuracy([(2, 300, 32, 37, 1.0), (2, 300, 32, 37, 4.0), (1, 1000, 32, 0, 1.0), (1, 2048, 32, 0, 1.0),
                         (1, 512, 32, 1536, 1.0)])
    tb.write_json(a.out, out)  # at the end: a run that fails part-way leaves no output
    if rows is not None:
        tb.write_json(a.accuracy, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
