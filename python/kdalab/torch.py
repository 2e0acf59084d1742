"""KDA as a differentiable torch op on kdalab's CUDA kernels: chunk_kda (the prefill forward, the backward of
kernels/kda_backward.hpp) with fla's calling convention, for training. Imported on demand
(`import kdalab.torch`); `import kdalab` never imports torch.

The kernels are torch.library custom ops (kdalab::kda_prefill, kdalab::kda_backward, and the forward-only decode
step kdalab::kda_decode, which updates its state in place) with fake (meta) implementations and the backward
registered as the prefill's autograd formula, so torch.compile traces through them
and CUDA graphs capture them (the forward runs on one stream while the current stream is capturing). Every call
allocates its outputs and workspace with torch on the inputs' device and runs on torch's current stream.

Supported (else ValueError naming the argument): q, k, v, g, beta on the GPU, read as bf16 (other float dtypes are
rounded to bf16 first; their gradients come back through the cast); D = K = V in {64, 128, 256}; HV a multiple
of H; the log-decay g given (use_gate_in_kernel = False, g in [-5, 0], the caller's guarantee), or the K3 bounded
gate fused (use_gate_in_kernel = True with safe_gate = True and lower_bound in [-5, 0): g = lower_bound
Sigmoid(exp(A_log) (g + dt_bias))); the L2Norm of q, k and the beta sigmoid fused or not; packed sequences by
cu_seqlens (B = 1). Gradients: bf16 for the per-token inputs, fp32 for A_log, dt_bias and initial_state.
"""
from typing import List, Optional, Tuple

import torch

from . import _core, require_cuda

__all__ = ["chunk_kda", "kda_decode_step"]

Tensor = torch.Tensor


def _stream() -> int:
    return int(torch.cuda.current_stream().cuda_stream)


def _workspace(nbytes: int, like: Tensor) -> Tensor:
    return torch.empty((max(int(nbytes), 1),), dtype=torch.uint8, device=like.device)


def _num_seqs(q: Tensor, cu_seqlens: Optional[Tensor]) -> int:
    return q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1


@torch.library.custom_op("kdalab::kda_prefill", mutates_args=())
def _kda_prefill(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, A_log: Optional[Tensor],
                 bias: Optional[Tensor], S0: Optional[Tensor], cu_seqlens: Optional[Tensor], scale: float,
                 g_min: float, l2norm_qk: bool, beta_sigmoid: bool, gate_fused: bool,
                 max_seqlen: int) -> Tuple[Tensor, Tensor]:
    require_cuda()  # reached through torch.ops.kdalab on a CPU build: NotAvailable, not a CUDA error
    B, T, H, D = q.shape
    HV = v.shape[2]
    N = _num_seqs(q, cu_seqlens)
    o = torch.empty((B, T, HV, D), dtype=torch.bfloat16, device=q.device)
    S_final = torch.empty((N, HV, D, D), dtype=torch.float32, device=q.device)
    single = torch.cuda.is_current_stream_capturing()
    nws = _core.cuda_kda_prefill_workspace_bytes(B, T, H, HV, D, single_stream=single,
                                                 num_seqs=N if cu_seqlens is not None else 0)
    if A_log is None:  # gate given: not read by the kernel, but the binding takes arrays
        A_log = torch.zeros((HV,), dtype=torch.float32, device=q.device)
        bias = torch.zeros((HV, D), dtype=torch.float32, device=q.device)
    _core.cuda_kda_prefill(q, k, v, g, beta, A_log, bias, o, S0, S_final, _workspace(nws, q), g_min=g_min,
                           scale=scale, l2norm_qk=l2norm_qk, beta_sigmoid=beta_sigmoid, single_stream=single,
                           stream=_stream(), cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, gate_fused=gate_fused)
    return o, S_final


@_kda_prefill.register_fake
def _(q, k, v, g, beta, A_log, bias, S0, cu_seqlens, scale, g_min, l2norm_qk, beta_sigmoid, gate_fused, max_seqlen):
    B, T, H, D = q.shape
    HV = v.shape[2]
    N = _num_seqs(q, cu_seqlens)
    return (q.new_empty((B, T, HV, D), dtype=torch.bfloat16), q.new_empty((N, HV, D, D), dtype=torch.float32))


@torch.library.custom_op("kdalab::kda_backward", mutates_args=())
def _kda_backward(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, A_log: Optional[Tensor],
                  bias: Optional[Tensor], S0: Optional[Tensor], cu_seqlens: Optional[Tensor], dO: Tensor,
                  dS_T: Optional[Tensor], scale: float, g_min: float, l2norm_qk: bool, beta_sigmoid: bool,
                  gate_fused: bool, max_seqlen: int) -> List[Tensor]:
    require_cuda()  # reached through torch.ops.kdalab on a CPU build: NotAvailable, not a CUDA error
    B, T, H, D = q.shape
    HV = v.shape[2]
    N = _num_seqs(q, cu_seqlens)
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    dv, dg, dbeta = torch.empty_like(v), torch.empty_like(g), torch.empty_like(beta)
    dA_log = torch.zeros((HV,), dtype=torch.float32, device=q.device)
    dbias = torch.zeros((HV, D), dtype=torch.float32, device=q.device)
    dS0 = torch.empty((N, HV, D, D), dtype=torch.float32, device=q.device)
    nws = _core.cuda_kda_backward_workspace_bytes(B, T, H, HV, D, num_seqs=N if cu_seqlens is not None else 0)
    _core.cuda_kda_backward(q, k, v, g, beta, A_log if gate_fused else None, bias if gate_fused else None, dO, S0, dS_T,
                            dq, dk, dv, dg, dbeta, dA_log if gate_fused else None, dbias if gate_fused else None, dS0,
                            _workspace(nws, q), g_min=g_min, scale=scale, l2norm_qk=l2norm_qk,
                            beta_sigmoid=beta_sigmoid, gate_fused=gate_fused, cu_seqlens=cu_seqlens,
                            max_seqlen=max_seqlen, stream=_stream())
    return [dq, dk, dv, dg, dbeta, dA_log, dbias, dS0]


@_kda_backward.register_fake
def _(q, k, v, g, beta, A_log, bias, S0, cu_seqlens, dO, dS_T, scale, g_min, l2norm_qk, beta_sigmoid, gate_fused,
      max_seqlen):
    B, T, H, D = q.shape
    HV = v.shape[2]
    N = _num_seqs(q, cu_seqlens)
    f32 = torch.float32
    return [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(g),
            torch.empty_like(beta), q.new_empty((HV,), dtype=f32), q.new_empty((HV, D), dtype=f32),
            q.new_empty((N, HV, D, D), dtype=f32)]


def _setup_context(ctx, inputs, output):
    (q, k, v, g, beta, A_log, bias, S0, cu_seqlens, scale, g_min, l2norm_qk, beta_sigmoid, gate_fused,
     max_seqlen) = inputs
    ctx.save_for_backward(q, k, v, g, beta, A_log, bias, S0, cu_seqlens)
    ctx.opts = (scale, g_min, l2norm_qk, beta_sigmoid, gate_fused, max_seqlen)


def _backward(ctx, d_o, d_S):
    q, k, v, g, beta, A_log, bias, S0, cu_seqlens = ctx.saved_tensors
    scale, g_min, l2norm_qk, beta_sigmoid, gate_fused, max_seqlen = ctx.opts
    if d_o is None:
        d_o = torch.zeros(v.shape, dtype=torch.bfloat16, device=v.device)
    d_o = d_o.to(torch.bfloat16).contiguous()
    if d_S is not None:
        d_S = d_S.to(torch.float32).contiguous()
    dq, dk, dv, dg, dbeta, dA_log, dbias, dS0 = _kda_backward(q, k, v, g, beta, A_log, bias, S0, cu_seqlens, d_o, d_S,
                                                              scale, g_min, l2norm_qk, beta_sigmoid, gate_fused,
                                                              max_seqlen)
    return (dq, dk, dv, dg, dbeta, dA_log if A_log is not None else None, dbias if bias is not None else None,
            dS0 if S0 is not None else None, None, None, None, None, None, None, None)


_kda_prefill.register_autograd(_backward, setup_context=_setup_context)


def _bad(name, value, accepted):
    raise ValueError(f"chunk_kda: {name} = {value!r}; accepted: {accepted}")


def _gate_params(use_gate_in_kernel, safe_gate, lower_bound, A_log, dt_bias, HV, D, device):
    """(A_log [HV], bias [HV, D] fp32, g_min) of the fused K3 gate (fla's use_gate_in_kernel with safe_gate and
    lower_bound; A_log, dt_bias None = 0), or (None, None, -5) for a given log-decay g."""
    if not use_gate_in_kernel:
        return None, None, -5.0
    if not safe_gate or lower_bound is None:
        _bad("use_gate_in_kernel", True, "with safe_gate = True and lower_bound set (the K3 bounded gate); "
             "the softplus gate is not implemented")
    A = (A_log if A_log is not None else torch.zeros((HV,), device=device)).to(torch.float32).contiguous()
    bias = dt_bias if dt_bias is not None else torch.zeros((HV * D,), device=device)
    return A, bias.to(torch.float32).reshape(HV, D).contiguous(), float(lower_bound)


def chunk_kda(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: Optional[float] = None,
              initial_state: Optional[Tensor] = None, output_final_state: bool = False,
              use_qk_l2norm_in_kernel: bool = False, use_gate_in_kernel: bool = False,
              use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False, safe_gate: bool = False,
              lower_bound: Optional[float] = None, cu_seqlens: Optional[Tensor] = None,
              cu_seqlens_cpu: Optional[Tensor] = None, A_log: Optional[Tensor] = None,
              dt_bias: Optional[Tensor] = None, state_v_first: bool = False, **kwargs):
    """KDA (kernels/kda.hpp, kernels/kda_backward.hpp) with gradients, in fla's chunk_kda convention:
    q, k [B, T, H, K]; v [B, T, HV, V] (K = V = D); g [B, T, HV, K] (the log-decay, or the raw gate input with
    use_gate_in_kernel); beta [B, T, HV]; all bf16. scale: default K^-1/2. initial_state [N, HV, K, V] (fp32 used;
    N = B, or the number of sequences with cu_seqlens). use_gate_in_kernel needs safe_gate = True and lower_bound
    (the K3 bounded gate lower_bound Sigmoid(exp(A_log) (g + dt_bias)); A_log [HV] and dt_bias [HV K], None = 0).
    cu_seqlens: [N + 1] offsets of packed sequences (B = 1); cu_seqlens_cpu, a host copy, avoids a device sync.
    Returns (o [B, T, HV, V] bf16, final_state [N, HV, K, V] fp32 or None unless output_final_state)."""
    require_cuda()
    for name in ("disable_recompute", "return_intermediate_states"):
        kwargs.pop(name, None)
    if kwargs.pop("cp_context", None) is not None:
        _bad("cp_context", "given", "None (no context parallelism)")
    if kwargs:
        _bad("arguments", sorted(kwargs), "fla's chunk_kda arguments listed in kdalab.torch.chunk_kda")
    if allow_neg_eigval:
        _bad("allow_neg_eigval", allow_neg_eigval, "False")
    if state_v_first:
        _bad("state_v_first", state_v_first, "False (the [K, V] state layout)")
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or not t.is_cuda:
            _bad(name, getattr(t, "dtype", type(t)), "a floating-point CUDA tensor (used rounded to bfloat16)")
    q, k, v, g, beta = (t.to(torch.bfloat16) for t in (q, k, v, g, beta))
    D = q.shape[-1]
    if v.shape[-1] != D:
        _bad("v", tuple(v.shape), f"[B, T, HV, V] with V = K = {D}")
    if scale is None:
        scale = D ** -0.5
    A, bias, g_min = _gate_params(use_gate_in_kernel, safe_gate, lower_bound, A_log, dt_bias, v.shape[2], D, q.device)
    S0 = initial_state.to(torch.float32).contiguous() if initial_state is not None else None
    max_seqlen = 0
    if cu_seqlens is not None:
        if q.shape[0] != 1:
            _bad("q.shape[0]", q.shape[0], "1 with cu_seqlens (sequences packed along T)")
        lens = (cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens).diff()
        max_seqlen = int(lens.max().item())
        cu_seqlens = cu_seqlens.to(device=q.device, dtype=torch.int32).contiguous()
    q, k, v, g, beta = (t.contiguous() for t in (q, k, v, g, beta))
    o, S_final = _kda_prefill(q, k, v, g, beta, A, bias, S0, cu_seqlens, float(scale), g_min,
                              bool(use_qk_l2norm_in_kernel), bool(use_beta_sigmoid_in_kernel),
                              bool(use_gate_in_kernel), max_seqlen)
    return o, (S_final if output_final_state else None)


@torch.library.custom_op("kdalab::kda_decode", mutates_args=("state",))
def _kda_decode(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, A_log: Optional[Tensor],
                bias: Optional[Tensor], state: Tensor, scale: float, g_min: float, l2norm_qk: bool,
                beta_sigmoid: bool, gate_fused: bool) -> Tensor:
    require_cuda()  # reached through torch.ops.kdalab on a CPU build: NotAvailable, not a CUDA error
    HV, D = v.shape[1], v.shape[2]
    o = torch.empty(v.shape, dtype=torch.bfloat16, device=v.device)
    if A_log is None:  # gate given: not read by the kernel, but the binding takes arrays
        A_log = torch.zeros((HV,), dtype=torch.float32, device=v.device)
        bias = torch.zeros((HV, D), dtype=torch.float32, device=v.device)
    _core.cuda_kda_decode(q, k, v, g, beta, A_log, bias, state, o, g_min=g_min, scale=scale, l2norm_qk=l2norm_qk,
                          beta_sigmoid=beta_sigmoid, stream=_stream(), gate_fused=gate_fused)
    return o


@_kda_decode.register_fake
def _(q, k, v, g, beta, A_log, bias, state, scale, g_min, l2norm_qk, beta_sigmoid, gate_fused):
    return torch.empty_like(v)


def kda_decode_step(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                    scale: Optional[float] = None, use_qk_l2norm_in_kernel: bool = False,
                    use_gate_in_kernel: bool = False, use_beta_sigmoid_in_kernel: bool = False,
                    safe_gate: bool = False, lower_bound: Optional[float] = None, A_log: Optional[Tensor] = None,
                    dt_bias: Optional[Tensor] = None) -> Tensor:
    """One KDA decode token per sequence (kernels/kda.hpp kda_decode), forward only, the options as chunk_kda:
    q, k [B, H, K]; v, g [B, HV, V]; beta [B, HV] (read as bf16); state [B, HV, K, V] fp32 contiguous, updated in
    place (chunk_kda's final_state). Returns o [B, HV, V] bf16. Capturable in a CUDA graph."""
    require_cuda()
    if state.dtype != torch.float32 or not state.is_contiguous() or not state.is_cuda:
        _bad("state", (state.dtype, tuple(state.shape)), "a contiguous float32 CUDA tensor [B, HV, K, V]")
    q, k, v, g, beta = (t.to(torch.bfloat16).contiguous() for t in (q, k, v, g, beta))
    D = q.shape[-1]
    if scale is None:
        scale = D ** -0.5
    A, bias, g_min = _gate_params(use_gate_in_kernel, safe_gate, lower_bound, A_log, dt_bias, v.shape[1], D, q.device)
    return _kda_decode(q, k, v, g, beta, A, bias, state, float(scale), g_min, bool(use_qk_l2norm_in_kernel),
                       bool(use_beta_sigmoid_in_kernel), bool(use_gate_in_kernel))
