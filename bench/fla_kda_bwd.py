#!/usr/bin/env python3
"""fla gradient harness for KDA: writes fla's chunk_kda gradients as `kdalab check --op kda-bwd` input
files, each with this script's own float64-autograd numbers beside them.

  python3 bench/fla_kda_bwd.py [--fla-path peers/fla-src] [--out-dir fla_bwd] [--cases B:T:H,...]
                               [--candidate fla|f64|both|kdalab|kernels|all] [--inputs anchor|long-memory]
                               [--fla-commit TEXT] [--seed N] [--force]
                               [--device auto|cuda|cpu] [--block N] [--time-budget S] [--self-test] [--dry-run]

fla is imported the way bench/fla_kda.py imports it (only fla.ops.kda under bare parent packages, from
--fla-path, default peers/fla-src; FLA_DISABLE_BACKEND_DISPATCH=1 unless --dispatch), with the same inputs
and the same fusions: bf16 q, k, v, raw gate logits g, raw beta logits; fp32 A_log [HV], bias [HV, d_k],
S0 [B, HV, d_k, d_v]; D = d_k = d_v = 128, HV = H, scale = D^-1/2.

What is called (fla's autograd, fla/ops/kda/chunk.py ChunkKDAFunction):
  o, S = chunk_kda(q, k, v, g_raw, beta_raw, scale=D^-1/2, initial_state=S0, output_final_state=True,
                   use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                   A_log=A_log, dt_bias=bias.reshape(-1), lower_bound=-5, safe_gate=True, chunk_size=64)
  torch.autograd.backward((o, S), (do, dS))
with requires_grad on q, k, v, g_raw, beta_raw, A_log, bias and S0: fla's gradients w.r.t. the raw inputs
(through its fused L2Norm, K3 gate g = -5 Sigmoid(exp(A_log) (g_raw + bias)) and beta sigmoid).

The float64 autograd (this script's own, independent of fla and of kdalab's C++ reference): the recurrence of
docs/equations.md section 1 on exactly the same (bf16-valued) inputs, in float64 torch:
  q, k = q_raw / ||q_raw||, k_raw / ||k_raw||  (eps 0, as `kdalab check` normalises)
  g = -5 Sigmoid(exp(A_log) (g_raw + bias)),  beta = Sigmoid(beta_raw)
  S' = Diag(exp g_t) S_{t-1};  S_t = S' + beta_t k_t (v_t - S'^T k_t)^T;  o_t = scale S_t^T q_t
  L = <o, do> + <S_T, dS>, gradients by torch.autograd. The time loop runs over all heads at once;
  blocks of --block tokens are activation-checkpointed (only the states between blocks are kept).

--candidate kdalab (kernels, all) also runs kdalab's own KDA kernels through `kdalab.torch.chunk_kda` (the same call,
fla's convention, no chunk_size) on the same inputs, so both kernels' gradients are checked on identical files.

Cases (--cases, default 1:64:16,1:300:16,1:1000:16,1:4096:16, i.e. B = 1, H = HV = 16, T in 64, 300, 1000,
4096; H >= 16 gives the per-head parameters A_log and bias enough entries for a relative RMS): inputs drawn
with torch (generator on the run's device, seed --seed + case index, recorded per file):
  q, k, v, g_raw, beta_raw N(0,1) rounded to bf16; A_log U(0,1) fp32; bias U(0,1) fp32; S0 0.1 N(0,1) fp32
  (bench/fla_kda.py's anchor-kda distribution; --inputs anchor); with --inputs long-memory the gate and beta
  logits give slow decay and small beta, so the state carries information over thousands of tokens:
  g_raw -7 + 0.5 N(0,1), beta_raw -4 + 0.5 N(0,1) (both bf16), A_log U(-0.1, 0.1), bias U(-0.5, 0.5)
  (g ~ -5 Sigmoid(-7) ~ -4.5e-3 per step, beta ~ 0.018); upstream gradients do N(0,1) rounded to bf16 (o is bf16)
  and dS N(0,1) fp32.

Files, in --out-dir (created if missing; its parent must exist), one per case and candidate:
  fla_kda_bwd_B<B>_T<T>_H<H>.h5      (--candidate fla, both, kernels or all) fla's gradients, root precision = "bf16"
  fla_kda_bwd_B<B>_T<T>_H<H>.f64.h5  (--candidate f64, both or all) the float64 autograd's, precision = "fp64"
  fla_kda_bwd_B<B>_T<T>_H<H>.kdalab.h5 (--candidate kdalab, kernels or all) kdalab's gradients, precision = "bf16"
(--candidate kernels: the two kernels' files without the float64 one, which is the largest: 1.1 GB at T = 16384,
H = 16; the float64 autograd still runs for the printed table and the harness_rel_rms attributes)
(with --inputs long-memory the names start fla_kda_bwd_long-memory_)
in the `kdalab check --op kda-bwd` format (docs/check-format.md): the forward inputs q, k, v, g, beta
(float32 holding bf16, format = "bf16"), A_log, bias, S0 (layout KV); root attributes scale, l2norm_qk = 1,
gate = "k3", g_min = -5, beta = "logits"; the upstream gradients do (bf16) and dS (layout KV); candidates
dq, dk, dv, dg, dbeta, dS0 (layout KV), dA_log, dbias. fla's dq..dbeta are bf16 (format = "bf16"), its
dS0, dA_log, dbias fp32; the float64 candidates are float64 datasets. Root attributes also record fla's
commit (--fla-commit, else PATH/COMMIT beside the copy, else "unknown"), the call and flags, torch / triton
versions, the device, the seed and the distributions, and (fla files) harness_rel_rms_<name>: fla's
relative RMS ||x - x64|| / ||x64|| against the float64 autograd for dq dk dv dg dbeta dA_log dbias dS0 o S,
to compare with what `kdalab check --op kda-bwd` reports. An existing file is never overwritten without
--force (one line naming the option and path, exit 2, nothing written).

--candidate f64 runs without fla and (with --device cpu) without a GPU. --dry-run checks the arguments,
--fla-path (when fla is needed) and the outputs, prints the plan and exits without importing torch or fla.
--self-test checks the float64 autograd itself (torch.autograd.gradcheck on a small case; the blocked loop
against an unblocked one) and exits. Options that would change nothing are refused (exit 2), never ignored: fla's
chunk_kda settings (--no-safe-gate, --chunk-size, --dispatch, --full-import) without an fla candidate or with
--self-test, and --candidate kdalab|kernels|all or --inputs long-memory with --self-test.

Then: for f in <out-dir>/*.h5; do build/cuda/experiments/kdalab check --op kda-bwd --in $f --out ${f%.h5}.report.h5; done
(bench/gpu_pass.sh does both when peers/fla-src is there.) The files are large (T = 4096, H = 16: ~0.2 GB):
run `kdalab check` where they were written.

Exit codes: 0 done (cases skipped for --time-budget are listed), 2 bad usage, fla not found at --fla-path or an
output path refused, 1 an unexpected failure (torch, CUDA or h5py missing, fla import error, a failed case).
"""
import argparse
import math
import os
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fla_kda  # noqa: E402  (stdlib-only at import: fla's loading, the input conventions)
from fla_kda import (D, G_MIN, UsageError, _is_number, case_name, check_folder, elapsed, end_dry_run,  # noqa: E402
                     fla_commit, fla_environment, fla_settings, load_fla, log, resolve_fla_root, write_h5_check)

DEFAULT_CASES = [(1, 64, 16), (1, 300, 16), (1, 1000, 16), (1, 4096, 16)]
CANDIDATES = ("fla", "f64", "both", "kdalab", "kernels", "all")
INPUTS = ("anchor", "long-memory")
# gradient names in the kda-bwd file, in order, and the leaf each belongs to
GRADS = ("dq", "dk", "dv", "dg", "dbeta", "dA_log", "dbias", "dS0")
LEAVES = ("q", "k", "v", "g", "beta", "A_log", "bias", "S0")
BF16_INPUTS = ("q", "k", "v", "g", "beta", "do")
FLA_BF16_GRADS = ("dq", "dk", "dv", "dg", "dbeta")
KV_LAYOUT = ("S0", "dS", "dS0")


# ---------------------------------------------------------------------------------------------------
# command line (stdlib only)


def parse_cases(text):
    """'B:T:H,...' -> [(B, T, H)] (HV = H, D = 128)."""
    out = []
    for item in text.split(","):
        f = item.strip().split(":")
        if len(f) != 3 or not all(_is_number(x) for x in f):
            raise UsageError(f"--cases: '{item}' is not B:T:H with positive integers (HV = H, D = 128)")
        B, T, H = (int(x) for x in f)
        if min(B, T, H) < 1:
            raise UsageError(f"--cases: '{item}' needs B, T, H >= 1")
        out.append((B, T, H))
    if len(set(out)) != len(out):
        raise UsageError(f"--cases '{text}': a case is given twice (each case is one file)")
    return out


def file_names(case, candidate, inputs="anchor"):
    """The files case (B, T, H) gets for --candidate fla / f64 / both / kdalab / kernels / all and --inputs."""
    base = ("fla_kda_bwd_B%d_T%d_H%d" if inputs == "anchor" else "fla_kda_bwd_" + inputs + "_B%d_T%d_H%d") % case
    return ([base + ".h5"] if candidate in ("fla", "both", "kernels", "all") else []) + \
           ([base + ".f64.h5"] if candidate in ("f64", "both", "all") else []) + \
           ([base + ".kdalab.h5"] if candidate in ("kdalab", "kernels", "all") else [])


def build_parser():
    p = argparse.ArgumentParser(
        prog="bench/fla_kda_bwd.py",
        description="Write fla's chunk_kda gradients (K3 gate, q/k L2Norm and beta sigmoid in kernel, S0 given) as "
                    "`kdalab check --op kda-bwd` files, with this script's own float64-autograd numbers. Runs on a "
                    "CUDA GPU with torch + triton (--candidate f64 also on the CPU); see the file header.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--fla-path", default="peers/fla-src",
                   help="folder holding fla's python package (PATH/fla/ops/kda), or the fla package folder itself "
                        "(not used with --candidate f64)")
    p.add_argument("--fla-commit", default=None,
                   help="fla's git commit, recorded in the files (default: PATH/COMMIT beside the copy, else 'unknown')")
    p.add_argument("--out-dir", default="fla_bwd",
                   help="folder for the check files (created if missing, its parent must exist); existing "
                        "fla_kda_bwd_B*_T*_H*.h5 files in it only with --force")
    p.add_argument("--force", action="store_true", help="overwrite existing check files in --out-dir")
    p.add_argument("--cases", default=",".join("%d:%d:%d" % c for c in DEFAULT_CASES),
                   help="B:T:H,... (HV = H, D = 128)")
    p.add_argument("--candidate", default="fla", choices=CANDIDATES,
                   help="the candidate gradients written: fla's (bf16), the float64 autograd's (fp64; no fla needed), "
                        "both (two files per case), kdalab's kernels through kdalab.torch.chunk_kda (bf16; no fla "
                        "needed), kernels (fla's and kdalab's, no float64 file) or all three")
    p.add_argument("--inputs", default="anchor", choices=INPUTS,
                   help="input distribution: the anchor-kda one, or long-memory (slow decay, small beta; file header)")
    p.add_argument("--seed", type=int, default=20261201,
                   help="base seed; case i draws with seed + i; an integer in [0, 2^63 - 1]")
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                   help="where inputs are drawn and the float64 autograd runs (auto: cuda when visible); "
                        "fla needs cuda")
    p.add_argument("--block", type=int, default=64,
                   help="tokens per activation-checkpointed block of the float64 loop (>= 1)")
    p.add_argument("--no-safe-gate", action="store_true",
                   help="chunk_kda safe_gate=False (still lower_bound = -5: the same K3 gate)")
    p.add_argument("--chunk-size", type=int, default=64, choices=(32, 64), help="chunk_kda chunk_size")
    p.add_argument("--dispatch", action="store_true",
                   help="keep fla's backend dispatch; default FLA_DISABLE_BACKEND_DISPATCH=1 (fla's Triton kernels)")
    p.add_argument("--full-import", action="store_true",
                   help="import the whole fla package instead of fla.ops.kda under bare parent packages")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds, finite and > 0; cases not started by then are skipped and listed (default: no limit)")
    p.add_argument("--self-test", action="store_true",
                   help="check the float64 autograd (gradcheck on a small case, blocked vs unblocked loop) and exit; "
                        "needs torch only")
    p.add_argument("--dry-run", action="store_true",
                   help="check the arguments, the fla path and the output paths, print the plan, exit "
                        "(imports neither torch nor fla)")
    return p


def check_effective(args, need_fla):
    """Options that would change nothing in this run are refused (UsageError), never ignored: fla's chunk_kda settings
    when fla is not run (--candidate f64 or kdalab, --self-test: kdalab's chunk_kda has no chunk_size and always runs
    the safe gate), and the candidate and input choices with --self-test (it checks the float64 autograd on its own
    small case)."""
    if not need_fla:
        why = "--self-test" if args.self_test else f"--candidate {args.candidate}"
        for given, name in ((args.no_safe_gate, "--no-safe-gate"), (args.chunk_size != 64, f"--chunk-size {args.chunk_size}"),
                            (args.dispatch, "--dispatch"), (args.full_import, "--full-import")):
            if given:
                raise UsageError(f"{name} sets fla's chunk_kda, which {why} does not run; accepted: --candidate fla, "
                                 "both, kernels or all (without --self-test), or leave it out")
    if args.self_test:
        for given, name in ((args.candidate in ("kdalab", "kernels", "all"), f"--candidate {args.candidate}"),
                            (args.inputs != "anchor", f"--inputs {args.inputs}")):
            if given:
                raise UsageError(f"{name} with --self-test: the self-test checks the float64 autograd on its own small "
                                 "case, never kdalab's kernels or the --inputs distribution; leave it out")


def check_out_dir(args, cases):
    """kdalab's output rule for --out-dir, before anything runs: returns plan lines; UsageError otherwise."""
    d = args.out_dir
    if not d:
        raise UsageError("--out-dir: a folder name is required (e.g. --out-dir fla_bwd)")
    names = [n for c in cases for n in file_names(c, args.candidate, args.inputs)]
    return [check_folder("out-dir", d, names, args.force)] + ["  " + n for n in names]


# ---------------------------------------------------------------------------------------------------
# the float64 autograd (torch imported by the caller)


def f64_forward(torch, x, scale, g_min, block):
    """The KDA recurrence in float64 on the raw inputs x (float64 tensors: q, k [B,T,H,D]; v, g [B,T,HV,D] (gate
    logits); beta [B,T,HV] (logits); A_log [HV]; bias [HV,D]; S0 [B,HV,D,D] (KV)). Returns (o [B,T,HV,D],
    S_T [B,HV,D,D]), differentiable in every input. Value head hv reads key head hv // (HV / H). The time
    loop runs over all (batch, head) pairs at once; each block of `block` tokens is checkpointed."""
    from torch.utils.checkpoint import checkpoint
    q = x["q"] / x["q"].norm(dim=-1, keepdim=True)  # eps 0: `kdalab check`'s L2Norm
    k = x["k"] / x["k"].norm(dim=-1, keepdim=True)
    HV, H = x["v"].shape[2], q.shape[2]
    if HV != H:
        q, k = q.repeat_interleave(HV // H, dim=2), k.repeat_interleave(HV // H, dim=2)
    g = g_min * torch.sigmoid(x["A_log"].exp()[:, None] * (x["g"] + x["bias"]))
    alpha = g.exp()
    beta = torch.sigmoid(x["beta"])
    v = x["v"]

    def run_block(S, qb, kb, vb, ab, bb):
        os_ = []
        for t in range(qb.shape[1]):
            S = S * ab[:, t, :, :, None]                                   # S' = Diag(alpha_t) S_{t-1}
            kt = kb[:, t]
            err = vb[:, t] - torch.einsum("bhk,bhkv->bhv", kt, S)             # v_t - S'^T k_t
            S = S + kt[..., :, None] * (bb[:, t, :, None] * err)[..., None, :]  # + beta_t k_t err^T
            os_.append(scale * torch.einsum("bhk,bhkv->bhv", qb[:, t], S))   # o_t = scale S_t^T q_t
        return S, torch.stack(os_, dim=1)

    S = x["S0"]
    outs = []
    T = q.shape[1]
    for t0 in range(0, T, block):
        sl = slice(t0, min(T, t0 + block))
        args = (S, q[:, sl], k[:, sl], v[:, sl], alpha[:, sl], beta[:, sl])
        if block < T and torch.is_grad_enabled():
            S, ob = checkpoint(run_block, *args, use_reentrant=False)
        else:
            S, ob = run_block(*args)
        outs.append(ob)
    return torch.cat(outs, dim=1), S


def f64_grads(torch, x, do, dS, scale, g_min, block):
    """Float64 autograd of L = <o, do> + <S_T, dS> w.r.t. every input of x (any dtype; taken to float64).
    Returns (o, S, {dq: .., dk: .., dv, dg, dbeta, dA_log, dbias, dS0}) in float64."""
    f = torch.float64
    leaves = {n: x[n].detach().to(f).requires_grad_(True) for n in LEAVES}
    o, S = f64_forward(torch, leaves, scale, g_min, block)
    loss = (o * do.to(f)).sum() + (S * dS.to(f)).sum()
    grads = torch.autograd.grad(loss, [leaves[n] for n in LEAVES])
    return o.detach(), S.detach(), {"d" + n: gr for n, gr in zip(LEAVES, grads)}


def self_test(torch, device):
    """On a small case: gradcheck of the float64 forward (autograd against finite differences), the forward against
    bench/fla_kda.py's float64 loop, and the blocked loop's gradients against the unblocked one's. Returns a list
    of failure lines (empty: passed)."""
    fails = []
    gen = torch.Generator(device=device)
    gen.manual_seed(7)
    B, T, H, Dk = 1, 6, 2, 4

    def rn(*s):
        return torch.randn(*s, generator=gen, device=device, dtype=torch.float64)

    x = dict(q=rn(B, T, H, Dk), k=rn(B, T, H, Dk), v=rn(B, T, H, Dk), g=rn(B, T, H, Dk), beta=rn(B, T, H),
             A_log=torch.rand(H, generator=gen, device=device, dtype=torch.float64),
             bias=torch.rand(H, Dk, generator=gen, device=device, dtype=torch.float64), S0=0.1 * rn(B, H, Dk, Dk))
    leaves = [x[n].clone().requires_grad_(True) for n in LEAVES]

    def fn(*ts):
        return f64_forward(torch, dict(zip(LEAVES, ts)), Dk ** -0.5, G_MIN, 3)
    try:
        ok = torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-7, rtol=1e-5, raise_exception=True)
        if not ok:
            fails.append("gradcheck of the float64 forward failed")
    except Exception as e:
        fails.append(f"gradcheck of the float64 forward failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
    # the forward against bench/fla_kda.py's float64 loop (written separately, no autograd)
    with torch.no_grad():
        o, S = f64_forward(torch, x, Dk ** -0.5, G_MIN, 4)
        o_ref, S_ref = fla_kda.Harness.truth_f64(types.SimpleNamespace(torch=torch), x, Dk ** -0.5)
    for n, a, b in (("o", o, o_ref), ("S", S, S_ref)):
        r = float((a - b).norm() / b.norm())
        if not r <= 1e-13:
            fails.append(f"float64 forward {n} vs bench/fla_kda.py's float64 loop: rel RMS {r:.3e} > 1e-13")
    do, dS = rn(B, T, H, Dk), rn(B, H, Dk, Dk)
    try:
        _, _, g1 = f64_grads(torch, x, do, dS, Dk ** -0.5, G_MIN, 2)
        _, _, g2 = f64_grads(torch, x, do, dS, Dk ** -0.5, G_MIN, T)
    except Exception as e:
        return fails + [f"float64 gradients failed: {type(e).__name__}: {str(e)[:400]}"]
    for n in GRADS:
        r = float((g1[n] - g2[n]).norm() / g2[n].norm())
        if not r <= 1e-13:
            fails.append(f"blocked (2) vs unblocked float64 gradient {n}: rel RMS {r:.3e} > 1e-13")
    return fails


# ---------------------------------------------------------------------------------------------------
# the case runner


def draw_inputs(torch, B, T, H, seed, device, inputs="anchor"):
    """bench/fla_kda.py's anchor-kda distribution plus the upstream gradients (HV = H): q, k, v, g_raw,
    beta_raw N(0,1) bf16; A_log, bias U(0,1) fp32; S0 0.1 N(0,1) fp32; do N(0,1) bf16; dS N(0,1) fp32."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    HV = H

    def normal_bf16(*shape):  # drawn in fp32, rounded once to bf16 (round to nearest even)
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(torch.bfloat16)

    x = dict(q=normal_bf16(B, T, H, D), k=normal_bf16(B, T, H, D), v=normal_bf16(B, T, HV, D))
    if inputs == "long-memory":
        def shifted_bf16(mean, sd, *shape):
            return (mean + sd * torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)).to(torch.bfloat16)

        x["g"] = shifted_bf16(-7.0, 0.5, B, T, HV, D)
        x["beta"] = shifted_bf16(-4.0, 0.5, B, T, HV)
        x["A_log"] = 0.2 * torch.rand(HV, generator=gen, device=device, dtype=torch.float32) - 0.1
        x["bias"] = torch.rand(HV, D, generator=gen, device=device, dtype=torch.float32) - 0.5
    else:
        x["g"], x["beta"] = normal_bf16(B, T, HV, D), normal_bf16(B, T, HV)
        x["A_log"] = torch.rand(HV, generator=gen, device=device, dtype=torch.float32)
        x["bias"] = torch.rand(HV, D, generator=gen, device=device, dtype=torch.float32)
    x["S0"] = 0.1 * torch.randn(B, HV, D, D, generator=gen, device=device, dtype=torch.float32)
    x["do"] = normal_bf16(B, T, HV, D)
    x["dS"] = torch.randn(B, HV, D, D, generator=gen, device=device, dtype=torch.float32)
    return x


DISTRIBUTIONS = {
    "anchor": "q, k, v, g (gate logits), beta (logits): N(0,1) drawn in fp32, rounded to bf16; A_log: U(0,1) fp32; "
              "bias: U(0,1) fp32; S0: 0.1 N(0,1) fp32",
    "long-memory": "q, k, v: N(0,1) rounded to bf16; g (gate logits): -7 + 0.5 N(0,1) bf16; beta (logits): "
                   "-4 + 0.5 N(0,1) bf16; A_log: U(-0.1, 0.1) fp32; bias: U(-0.5, 0.5) fp32; S0: 0.1 N(0,1) fp32"}
UPSTREAM = "do: N(0,1) drawn in fp32, rounded to bf16 (o is bf16); dS: N(0,1) fp32 (layout KV)"


class _Runner:
    """A chunk_kda of fla's convention run forward + backward with the K3 gate, L2Norm and beta sigmoid in kernel:
    subclasses set self.torch, self.who, self.chunk_kda, self.extra (their own keyword arguments) and self.call."""

    def grads(self, x):
        """Returns (o, S, {dq, dk, dv, dg, dbeta, dA_log, dbias, dS0}) as the kernel computes them."""
        torch = self.torch
        leaves = {n: x[n].detach().clone().requires_grad_(True) for n in LEAVES}
        o, S = self.chunk_kda(
            leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
            scale=D ** -0.5, initial_state=leaves["S0"], output_final_state=True,
            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
            A_log=leaves["A_log"], dt_bias=leaves["bias"].reshape(-1), lower_bound=G_MIN, **self.extra)
        torch.autograd.backward((o, S), (x["do"].to(o.dtype), x["dS"].to(S.dtype)))
        g = {}
        for n in LEAVES:
            gr = leaves[n].grad
            if gr is None:
                raise RuntimeError(f"{self.who} returned no gradient for {n}")
            g["d" + n] = gr.detach().reshape(x[n].shape)
        return o.detach(), S.detach(), g


class FlaRunner(_Runner):
    """fla's chunk_kda (its Triton kernels), safe_gate and chunk_size from the command line."""

    def __init__(self, torch, args, root):
        self.torch = torch
        self.who = "fla"
        before = fla_kda.top_level_modules()
        self.chunk_kda, _, self.import_how = load_fla(root, args.full_import)
        self.fla_needs = sorted(fla_kda.top_level_modules() - before)
        self.safe_gate = not args.no_safe_gate
        # A_log, dt_bias and chunk_size go through **kwargs in fla's chunk_kda (chunk.py)
        self.extra = dict(safe_gate=self.safe_gate, chunk_size=args.chunk_size)
        self.call = ("chunk_kda(q, k, v, g_raw, beta_raw, scale=D^-1/2, initial_state=S0, output_final_state=True, "
                     "use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, "
                     f"A_log=A_log, dt_bias=bias.reshape(-1), lower_bound={G_MIN}, safe_gate={self.safe_gate}, "
                     f"chunk_size={args.chunk_size}); torch.autograd.backward((o, S), (do, dS)); requires_grad on "
                     "q, k, v, g_raw, beta_raw, A_log, bias, S0")


class KdalabRunner(_Runner):
    """kdalab's KDA forward and backward kernels through kdalab.torch.chunk_kda, called as fla's chunk_kda is."""

    def __init__(self, torch):
        import kdalab.torch as kt
        self.torch = torch
        self.who = "kdalab"
        self.chunk_kda = kt.chunk_kda
        self.extra = dict(safe_gate=True)
        self.call = ("kdalab.torch.chunk_kda(q, k, v, g_raw, beta_raw, scale=D^-1/2, initial_state=S0, "
                     "output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, "
                     f"use_beta_sigmoid_in_kernel=True, A_log=A_log, dt_bias=bias.reshape(-1), lower_bound={G_MIN}, "
                     "safe_gate=True); torch.autograd.backward((o, S), (do, dS))")


def rel_rms(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def write_check_file(path, arrays, candidates, attrs):
    """One `kdalab check --op kda-bwd` file (docs/check-format.md): arrays are numpy inputs (float32) and
    upstream gradients; candidates numpy gradients (float32 holding bf16 for names in FLA_BF16_GRADS when
    attrs['precision'] is bf16, else float32 / float64 as given). Written by fla_kda.write_h5_check (atomic,
    gzip level 1)."""
    bf16_cands = attrs.get("precision") == "bf16"

    def dataset(name, a, bf16):
        dattrs = {"format": "bf16"} if bf16 else {}
        if name in KV_LAYOUT:
            dattrs["layout"] = "KV"
        return name, a, dattrs

    datasets = [dataset(n, a, n in BF16_INPUTS) for n, a in arrays.items()] + \
               [dataset(n, a, bf16_cands and n in FLA_BF16_GRADS) for n, a in candidates.items()]
    write_h5_check(path, datasets, D ** -0.5, G_MIN, attrs, gzip_level=1)


def run_case(torch, args, case, index, dev, runners, meta):
    """runners: {"fla": FlaRunner, "kdalab": KdalabRunner} for the candidates asked for (either may be absent)."""
    B, T, H = case
    seed = args.seed + index
    x = draw_inputs(torch, B, T, H, seed, dev, args.inputs)
    r = dict(case=case_name(case), seed=seed, rel={}, first_s={}, deterministic={}, nonfinite={}, grads={})
    sync = (lambda: torch.cuda.synchronize()) if dev.type == "cuda" else (lambda: None)
    t = time.monotonic()
    o64, S64, g64 = f64_grads(torch, x, x["do"], x["dS"], D ** -0.5, G_MIN, args.block)
    sync()
    r["f64_s"] = time.monotonic() - t
    for who, runner in runners.items():
        t = time.monotonic()
        o, S, g = runner.grads(x)  # first call of a shape: Triton compile + autotune (fla)
        sync()
        r["first_s"][who] = time.monotonic() - t
        o2, S2, g2 = runner.grads(x)
        sync()
        r["deterministic"][who] = (all(torch.equal(g[n], g2[n]) for n in GRADS) and torch.equal(o, o2)
                                   and torch.equal(S, S2))
        rel = {n: rel_rms(g[n], g64[n]) for n in GRADS}
        rel["o"], rel["S"] = rel_rms(o, o64), rel_rms(S, S64)
        r["rel"][who] = rel
        r["nonfinite"][who] = int(sum(int((~torch.isfinite(g[n])).sum()) for n in GRADS))
        r["grads"][who] = g

    def np32(t):
        return t.detach().float().cpu().numpy()

    arrays = {n: np32(x[n]) for n in LEAVES + ("do", "dS")}
    base = dict(meta)
    base.update(case=f"B={B} T={T} H={H} HV={H} D={D}", seed=seed, inputs=args.inputs,
                generator=f"torch.Generator({dev.type}), manual_seed(seed); draws in the order q, k, v, g, beta, "
                          "A_log, bias, S0, do, dS",
                inputs_distribution=DISTRIBUTIONS[args.inputs], upstream_distribution=UPSTREAM,
                harness_f64="float64 torch autograd of the recurrence (docs/equations.md section 1) on the file's "
                            "inputs: L2Norm eps 0, K3 gate, beta sigmoid, decay before the rank-1 update; "
                            f"L = <o, do> + <S_T, dS>; blocks of {args.block} tokens checkpointed",
                harness_f64_seconds=round(r["f64_s"], 3))
    r["files"] = []
    for name in file_names(case, args.candidate, args.inputs):
        path = os.path.join(args.out_dir, name)
        attrs = dict(base)
        if name.endswith(".f64.h5"):
            attrs.update(precision="fp64", candidate="the harness's float64 autograd gradients (float64 datasets)")
            cands = {n: g64[n].cpu().numpy() for n in GRADS}
        else:
            who = "kdalab" if name.endswith(".kdalab.h5") else "fla"
            attrs.update(precision="bf16", candidate=f"{who}'s gradients: dq dk dv dg dbeta bf16, dS0 dA_log dbias fp32",
                         candidate_call=runners[who].call, candidate_first_call_seconds=round(r["first_s"][who], 2),
                         candidate_deterministic=int(r["deterministic"][who]))
            for n, v in r["rel"][who].items():
                attrs["harness_rel_rms_" + n] = v
            cands = {n: np32(r["grads"][who][n]) for n in GRADS}
        write_check_file(path, arrays, cands, attrs)
        r["files"].append((path, os.path.getsize(path)))
    r.pop("grads")
    return r


# ---------------------------------------------------------------------------------------------------


def main(argv=None):
    args = build_parser().parse_args(argv)
    need_fla = args.candidate in ("fla", "both", "kernels", "all") and not args.self_test
    need_kdalab = args.candidate in ("kdalab", "kernels", "all") and not args.self_test
    try:  # the arguments, then --fla-path, then the outputs
        cases = parse_cases(args.cases)
        if not 0 <= args.seed <= 2**63 - 1 - len(cases):
            raise UsageError(f"--seed {args.seed}: accepted: an integer in [0, 2^63 - 1 - number of cases]")
        if args.block < 1:
            raise UsageError(f"--block {args.block}: accepted: tokens per checkpointed block, >= 1")
        if args.time_budget is not None and not (math.isfinite(args.time_budget) and args.time_budget > 0):
            raise UsageError(f"--time-budget {args.time_budget}: accepted: seconds, finite and > 0 (leave it out "
                             "for no limit)")
        if (need_fla or need_kdalab) and args.device == "cpu":
            who = " and ".join(n for n, need in (("fla's", need_fla), ("kdalab's", need_kdalab)) if need)
            raise UsageError(f"--device cpu with --candidate {args.candidate}: {who} kernels need cuda; "
                             "accepted: --device auto or cuda, or --candidate f64")
        if args.fla_commit is not None and (not args.fla_commit.strip() or "\n" in args.fla_commit):
            raise UsageError(f"--fla-commit '{args.fla_commit}': accepted: one non-empty line (e.g. a git hash)")
        check_effective(args, need_fla)
        root = resolve_fla_root(args.fla_path) if need_fla else None
        plan = [] if args.self_test else check_out_dir(args, cases)
    except UsageError as e:
        print(f"fla_kda_bwd.py: {e}", file=sys.stderr)
        return 2

    fla_environment(args.dispatch)
    commit = args.fla_commit.strip() if args.fla_commit else (fla_commit(root) if root else "unknown")
    if args.dry_run:
        if need_fla:
            log(fla_settings(root, commit, args))
        log(f"candidates: {args.candidate}; inputs: {args.inputs}; cases: " + ", ".join(map(case_name, cases))
            + f"; seeds {args.seed}..{args.seed + len(cases) - 1}; device {args.device}")
        return end_dry_run(plan)

    try:
        import torch
    except ImportError as e:
        print(f"fla_kda_bwd.py: torch is not importable ({e}); run this on the GPU machine", file=sys.stderr)
        return 1
    cuda = torch.cuda.is_available()
    if args.device == "cuda" or ((need_fla or need_kdalab) and args.device == "auto"):
        if not cuda:
            print("fla_kda_bwd.py: no CUDA device visible to torch; nothing was run or written", file=sys.stderr)
            return 1
    dev = torch.device("cuda" if (args.device != "cpu" and cuda) else "cpu")

    if args.self_test:
        t = time.monotonic()
        fails = self_test(torch, dev)
        for line in fails:
            log("FAILED: " + line)
        log(f"self-test on {dev.type}: {'passed' if not fails else f'{len(fails)} failure(s)'} "
            f"({time.monotonic() - t:.1f} s)")
        return 1 if fails else 0

    import importlib.util
    if importlib.util.find_spec("h5py") is None:
        print("fla_kda_bwd.py: h5py is not importable; it writes the check files", file=sys.stderr)
        return 1
    os.makedirs(args.out_dir, exist_ok=True)

    runners = {}
    meta = dict(torch=torch.__version__, python=sys.version.split()[0],
                device=torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
                fla_commit=commit)
    if need_fla:
        try:
            fla = runners["fla"] = FlaRunner(torch, args, root)
        except Exception as e:
            import traceback
            traceback.print_exc()
            print(f"fla_kda_bwd.py: importing fla.ops.kda from '{root}' failed: {type(e).__name__}: {e}",
                  file=sys.stderr)
            return 1
        import triton
        meta.update(peer="fla (fla-org/flash-linear-attention) chunk_kda, Triton kernels", fla_path=root,
                    fla_import=fla.import_how, fla_call=fla.call, triton=triton.__version__,
                    fla_flags=f"use_gate_in_kernel=True use_qk_l2norm_in_kernel=True use_beta_sigmoid_in_kernel=True "
                              f"lower_bound={G_MIN} safe_gate={fla.safe_gate} chunk_size={args.chunk_size} "
                              f"FLA_DISABLE_BACKEND_DISPATCH={os.environ.get('FLA_DISABLE_BACKEND_DISPATCH', 'unset')} "
                              "FLA_CACHE_RESULTS=0")
        log(f"fla.ops.kda loaded from {root} ({fla.import_how}); commit {commit}; torch {torch.__version__}, "
            f"triton {triton.__version__}, {meta['device']}")
    if need_kdalab:
        try:
            runners["kdalab"] = KdalabRunner(torch)
        except Exception as e:
            print(f"fla_kda_bwd.py: kdalab.torch is not usable ({type(e).__name__}: {e}); build the Python package "
                  "with the CUDA kernels and put it on PYTHONPATH", file=sys.stderr)
            return 1
        meta.update(kdalab_call=runners["kdalab"].call)
        log(f"kdalab.torch.chunk_kda loaded; {meta['device']}")
    if not runners:
        log(f"float64 autograd only (--candidate f64) on {meta['device']}; torch {torch.__version__}")

    names = ("dq", "dk", "dv", "dg", "dbeta", "dA_log", "dbias", "dS0", "o", "S")
    if runners:
        log(f"relative RMS against the float64 autograd (numbers of record: `kdalab check --op kda-bwd`); "
            f"inputs {args.inputs}")
        log(f"{'case':<20}{'kernel':<8}" + "".join(f"{n:>9}" for n in names) + f"{'f64 s':>8}{'1st s':>8}  det")
    skipped, failed = [], 0
    for i, c in enumerate(cases):
        name = case_name(c)
        if args.time_budget is not None and elapsed() > args.time_budget:
            skipped.append(name)
            log(f"{name:<20} skipped (time budget)")
            continue
        try:
            r = run_case(torch, args, c, i, dev, runners, meta)
        except Exception as e:
            import traceback
            traceback.print_exc()
            failed += 1
            log(f"{name:<20} FAILED: {type(e).__name__}: {e}")
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            continue
        for who in runners:
            log(f"{name:<20}{who:<8}" + "".join(f"{r['rel'][who][n]:9.2e}" for n in names) + f"{r['f64_s']:8.1f}"
                f"{r['first_s'][who]:8.1f}  {'yes' if r['deterministic'][who] else 'NO'}"
                + (f"  NON-FINITE gradients: {r['nonfinite'][who]}" if r["nonfinite"][who] else ""))
        if not runners:
            log(f"{name:<20} float64 autograd {r['f64_s']:.1f} s")
        for p, size in r["files"]:
            log(f"  wrote {p} ({size / 2**20:.1f} MiB)")
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if skipped:
        log(f"skipped for the time budget ({args.time_budget:.0f} s): {', '.join(skipped)}")
    log(f"then: for f in {args.out_dir}/fla_kda_bwd_*.h5; do build/cuda/experiments/kdalab check --op kda-bwd "
        "--in $f --out ${f%.h5}.report.h5; done")
    log(f"{elapsed():.0f} s in all")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
