"""KDA as a differentiable torch op on kdalab's CUDA kernels: chunk_kda (the prefill forward, the backward of
kernels/kda_backward.hpp) with fla's calling convention, for training. Imported on demand
(`import kdalab.torch`); `import kdalab` never imports torch.

The kernels are torch.library custom ops (kdalab::kda_prefill, kdalab::kda_backward, and the forward-only decode
step kdalab::kda_decode, which updates its state in place) with fake (meta) implementations and the backward
registered as the prefill's autograd formula, so torch.compile traces through them
and CUDA graphs capture them (the forward runs on one stream while the current stream is capturing). Every call
allocates its outputs and workspace with torch on the inputs' device and runs on torch's current stream.

Supported (else ValueError naming the argument): q, k, v, g, beta on the GPU, read as bf16 (other float dtypes are
rounded to bf16 first; their gradients come back through the cast); any head sizes K <= 256 and V >= 1 (the
kernels take D = K = V in {64, 128, 256}; other sizes are zero-padded and split into value blocks in plain torch
around the custom ops, exactly: see _with_supported_head_dims); HV a multiple of H; the log-decay g given
(use_gate_in_kernel = False, g in [-5, 0], the caller's guarantee), or the K3 bounded gate fused
(use_gate_in_kernel = True with safe_gate = True and lower_bound in [-5, 0): g = lower_bound
Sigmoid(exp(A_log) (g + dt_bias))); the L2Norm of q, k and the beta sigmoid fused or not; packed sequences by
cu_seqlens (B = 1). Gradients: bf16 for the per-token inputs, fp32 for A_log, dt_bias and initial_state.
"""
from typing import Callable, List, Optional, Tuple

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


def _bf16(*ts: Tensor) -> Tuple[Tensor, ...]:
    """The kernels' bf16 operands: q, k, g, beta arrive as bf16, or (value blocks of one head, see
    _with_supported_head_dims) as float32 copies of bf16 values, which this rounds back exactly."""
    return tuple(t.to(torch.bfloat16).contiguous() for t in ts)


@torch.library.custom_op("kdalab::kda_prefill", mutates_args=())
def _kda_prefill(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, A_log: Optional[Tensor],
                 bias: Optional[Tensor], S0: Optional[Tensor], cu_seqlens: Optional[Tensor], scale: float,
                 g_min: float, l2norm_qk: bool, beta_sigmoid: bool, gate_fused: bool,
                 max_seqlen: int) -> Tuple[Tensor, Tensor]:
    require_cuda()  # reached through torch.ops.kdalab on a CPU build: NotAvailable, not a CUDA error
    B, T, H, D = q.shape
    HV = v.shape[2]
    N = _num_seqs(q, cu_seqlens)
    q, k, g, beta = _bf16(q, k, g, beta)
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
    # dq, dk, dg, dbeta in q's dtype: float32 inputs (value blocks) get the kernel's fp32 gradients, unrounded
    gt = torch.float32 if q.dtype == torch.float32 else torch.bfloat16
    q, k, g, beta = _bf16(q, k, g, beta)
    dq, dk = torch.empty_like(q, dtype=gt), torch.empty_like(k, dtype=gt)
    dv, dg, dbeta = torch.empty_like(v), torch.empty_like(g, dtype=gt), torch.empty_like(beta, dtype=gt)
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
    gt = f32 if q.dtype == f32 else torch.bfloat16
    return [torch.empty_like(q, dtype=gt), torch.empty_like(k, dtype=gt), torch.empty_like(v, dtype=torch.bfloat16),
            torch.empty_like(g, dtype=gt), torch.empty_like(beta, dtype=gt), q.new_empty((HV,), dtype=f32),
            q.new_empty((HV, D), dtype=f32),
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
    dq, dk, dg, dbeta = (d.to(x.dtype) for d, x in ((dq, q), (dk, k), (dg, g), (dbeta, beta)))
    return (dq, dk, dv, dg, dbeta, dA_log if A_log is not None else None, dbias if bias is not None else None,
            dS0 if S0 is not None else None, None, None, None, None, None, None, None)


_kda_prefill.register_autograd(_backward, setup_context=_setup_context)


def _bad(name, value, accepted, who="chunk_kda"):
    raise ValueError(f"{who}: {name} = {value!r}; accepted: {accepted}")


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


SUPPORTED_D = (64, 128, 256)  # D = d_k = d_v of kernels/kda.hpp and kernels/kda_backward.hpp


def _head_dims(who: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, state: Optional[Tensor], state_name: str,
               dt_bias: Optional[Tensor]) -> Tuple[int, int, int]:
    """(K, V, D): the caller's key and value head sizes and the kernel size D, the smallest of SUPPORTED_D >= K and
    >= V (256 when V > 256: the value columns then run in blocks).
    Checks what the padding relies on (k and g of K channels, the state [..., K, V], dt_bias of HV K values, with HV
    = v.shape[-2]). Raises ValueError naming the tensor."""
    K, V = int(q.shape[-1]), int(v.shape[-1])
    if not 1 <= K <= SUPPORTED_D[-1]:
        _bad("q.shape[-1] (the key head size K)", K, "1 <= K <= 256 (the kernels take D = K = V in {64, 128, 256}; "
             "a smaller K is zero-padded exactly, a larger K cannot be: split the head into heads of <= 256)", who)
    if V < 1:
        _bad("v.shape[-1] (the value head size V)", V, "V >= 1", who)
    for name, t in (("k", k), ("g", g)):
        if t.shape[-1] != K:
            _bad(f"{name}.shape[-1]", int(t.shape[-1]), f"K = q.shape[-1] = {K}", who)
    if state is not None and tuple(state.shape[-2:]) != (K, V):
        _bad(f"{state_name}.shape", tuple(state.shape), f"[..., K, V] = [..., {K}, {V}] (fla's [K, V] state layout)",
             who)
    HV = int(v.shape[-2])
    if dt_bias is not None and dt_bias.numel() != HV * K:
        _bad("dt_bias.numel()", dt_bias.numel(), f"HV K = {HV} x {K} = {HV * K}", who)
    return K, V, next(d for d in SUPPORTED_D if d >= max(K, min(V, SUPPORTED_D[-1])))


def _pad_keys(K: int, D: int, q: Tensor, k: Tensor, g: Tensor, dt_bias: Optional[Tensor]):
    """q, k, g zero-padded from K to D channels (the last axis); dt_bias [HV K] to [HV D]."""
    pad = torch.nn.functional.pad
    q, k, g = (pad(t, (0, D - K)) for t in (q, k, g))
    if dt_bias is not None:
        dt_bias = pad(dt_bias.reshape(-1, K), (0, D - K)).reshape(-1)
    return q, k, g, dt_bias


def _with_supported_head_dims(fn: Callable, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                              scale: Optional[float] = None, initial_state: Optional[Tensor] = None,
                              output_final_state: bool = False, dt_bias: Optional[Tensor] = None, **kw):
    """fn, a chunked KDA function of fla's convention that takes only K = V = D in SUPPORTED_D, at any K <= 256 and
    any V >= 1: q, k [B, T, H, K]; v [B, T, HV, V]; g [B, T, HV, K]; beta [B, T, HV]; initial_state [N, HV, K, V];
    dt_bias [HV K]; the other keywords go to fn unchanged. Returns (o [B, T, HV, V], final_state [N, HV, K, V] or
    None), as fn does, at the caller's sizes.

    D is the smallest supported size >= K and >= V (256 when V > 256). q, k, g (and dt_bias) are zero-padded from K to D
    key channels; v (and initial_state's columns) are zero-padded to a multiple of D, so one call of fn when V <= 256,
    else ceil(V / 256) value blocks of 256 columns, each a call of fn with the same q, k, g, beta; the outputs and final
    states are joined along V and sliced back to [..., V] and [..., K, V]. Exact, not an approximation
    (docs/equations.md section 1, S_t = Diag(e^g_t) S_{t-1} + beta_t k_t (v_t - (Diag(e^g_t) S_{t-1})^T k_t)^T, o_t =
    scale S_t^T q_t): k zero in the padded channels keeps the state's padded rows out of S^T k and leaves them
    unwritten, so they keep their start, zero, for any g there; zero rows (and q zero there) leave o and the real rows
    unchanged. The L2Norm of q, k is unchanged by zeros. The value columns of S and o evolve independently, so a block
    of columns is the recurrence restricted to them. The default scale is K^-1/2 of the caller's K, not of D. The
    padding and slicing are plain torch ops, so autograd differentiates through them: the padded channels' gradients are
    dropped by the slices. With several value blocks, q, k, g, beta, dt_bias and A_log (the floating-point tensors
    among the keywords) reach each block as one fp32 copy (of bf16 values: exact), the backward kernel returns each
    block's gradients of q, k, g, beta in fp32 (KdaBackwardArgs::dq_f32), and autograd sums them in fp32 and rounds
    once to their dtype: one bf16 rounding, as with one call (a bf16 gradient per block, summed then rounded again,
    is ~1.5x the bf16 floor at V = 300). Cost: the kernels' work at
    D instead of K and V, ceil(V / D) times. K > 256 raises ValueError (the padding cannot shrink a head)."""
    K, V, D = _head_dims("chunk_kda", q, k, v, g, initial_state, "initial_state", dt_bias)
    scale = K ** -0.5 if scale is None else scale
    if K == D and V == D:
        return fn(q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                  dt_bias=dt_bias, **kw)
    pad = torch.nn.functional.pad
    blocks = -(-V // D)
    q, k, g, dt_bias = _pad_keys(K, D, q, k, g, dt_bias)
    v = pad(v, (0, blocks * D - V))
    S0 = None if initial_state is None else pad(initial_state, (0, blocks * D - V, 0, D - K))
    # the inputs every block reads: q, k, g, beta, dt_bias and the floating-point tensors among the other keywords
    # (A_log); their blocks' gradients summed in fp32 at least (docstring)
    names = [n for n, t in kw.items() if isinstance(t, Tensor) and t.is_floating_point()]
    low = (q, k, g, beta, dt_bias) + tuple(kw[n] for n in names)
    shared = tuple(t.float() if t is not None and t.element_size() < 4 else t for t in low) if blocks > 1 else low
    outs, states = [], []
    for j in range(blocks):
        cols = slice(j * D, (j + 1) * D)
        o, S = fn(shared[0], shared[1], v[..., cols], shared[2], shared[3], scale=scale,
                  initial_state=None if S0 is None else S0[..., cols], output_final_state=output_final_state,
                  dt_bias=shared[4], **{**kw, **dict(zip(names, shared[5:]))})
        outs.append(o)
        states.append(S)
    o = torch.cat(outs, -1)[..., :V]
    return o, (torch.cat(states, -1)[..., :K, :V] if output_final_state else None)


def _decode_with_supported_head_dims(fn: Callable, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                                     state: Tensor, scale: Optional[float] = None, dt_bias: Optional[Tensor] = None,
                                     **kw) -> Tensor:
    """The decode step's _with_supported_head_dims: fn(q, k, v, g, beta, state, scale=, dt_bias=, **kw) takes only
    K = V = D in SUPPORTED_D and updates its state in place; this runs it at any K <= 256, V >= 1 with q, k [B, H, K],
    v [B, HV, V], g [B, HV, K], beta [B, HV], state [B, HV, K, V] (updated in place). Each value block copies its
    columns of the state into a zero [B, HV, D, D] state, steps it and copies the real part back. Returns o
    [B, HV, V]. Exact for the reasons given in _with_supported_head_dims."""
    K, V, D = _head_dims("kda_decode_step", q, k, v, g, state, "state", dt_bias)
    scale = K ** -0.5 if scale is None else scale
    if K == D and V == D:
        return fn(q, k, v, g, beta, state, scale=scale, dt_bias=dt_bias, **kw)
    blocks = -(-V // D)
    q, k, g, dt_bias = _pad_keys(K, D, q, k, g, dt_bias)
    v = torch.nn.functional.pad(v, (0, blocks * D - V))
    outs = []
    for j in range(blocks):
        c0, c1 = j * D, min((j + 1) * D, V)
        S = state.new_zeros(tuple(state.shape[:-2]) + (D, D))
        S[..., :K, :c1 - c0] = state[..., c0:c1]
        outs.append(fn(q, k, v[..., j * D:(j + 1) * D], g, beta, S, scale=scale, dt_bias=dt_bias, **kw))
        state[..., c0:c1] = S[..., :K, :c1 - c0]
    return torch.cat(outs, -1)[..., :V]


def chunk_kda(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: Optional[float] = None,
              initial_state: Optional[Tensor] = None, output_final_state: bool = False,
              use_qk_l2norm_in_kernel: bool = False, use_gate_in_kernel: bool = False,
              use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False, safe_gate: bool = False,
              lower_bound: Optional[float] = None, cu_seqlens: Optional[Tensor] = None,
              cu_seqlens_cpu: Optional[Tensor] = None, A_log: Optional[Tensor] = None,
              dt_bias: Optional[Tensor] = None, state_v_first: bool = False, **kwargs):
    """KDA (kernels/kda.hpp, kernels/kda_backward.hpp) with gradients, in fla's chunk_kda convention:
    q, k [B, T, H, K]; v [B, T, HV, V]; g [B, T, HV, K] (the log-decay, or the raw gate input with
    use_gate_in_kernel); beta [B, T, HV]; all bf16. scale: default K^-1/2. initial_state [N, HV, K, V] (fp32 used;
    N = B, or the number of sequences with cu_seqlens). use_gate_in_kernel needs safe_gate = True and lower_bound
    (the K3 bounded gate lower_bound Sigmoid(exp(A_log) (g + dt_bias)); A_log [HV] and dt_bias [HV K], None = 0).
    cu_seqlens: [N + 1] offsets of packed sequences (B = 1); cu_seqlens_cpu, a host copy, avoids a device sync.
    Returns (o [B, T, HV, V] bf16, final_state [N, HV, K, V] fp32 or None unless output_final_state).

    Head sizes: any 1 <= K <= 256 and any V >= 1. The kernels take D = K = V in {64, 128, 256}; other sizes run at
    D, the smallest of those >= K: q, k, g, dt_bias zero-padded to D key channels, v and initial_state's columns
    split into ceil(V / D) value blocks of D columns (the last one zero-padded), one kernel call each, the outputs
    joined and sliced back to the caller's sizes (_with_supported_head_dims). This is exact, not an approximation:
    zero key channels (with zero state rows) leave o and the real state rows unchanged whatever g is there, L2Norm
    ignores zeros, and value columns evolve independently (docs/equations.md section 1). The pads and slices are
    torch ops around the custom ops, so autograd and torch.compile see them. Cost: the work of size D instead of
    K, ceil(V / D) times (K = 32, V = 512: 8 calls at D = 64). K > 256 raises ValueError: no padding can shrink a
    head; split it into heads of <= 256."""
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
    return _with_supported_head_dims(_chunk_kda_d, q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                     output_final_state=output_final_state, dt_bias=dt_bias,
                                     use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                                     use_gate_in_kernel=use_gate_in_kernel,
                                     use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, safe_gate=safe_gate,
                                     lower_bound=lower_bound, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu,
                                     A_log=A_log)


def _chunk_kda_d(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: float,
                 initial_state: Optional[Tensor], output_final_state: bool, use_qk_l2norm_in_kernel: bool,
                 use_gate_in_kernel: bool, use_beta_sigmoid_in_kernel: bool, safe_gate: bool,
                 lower_bound: Optional[float], cu_seqlens: Optional[Tensor], cu_seqlens_cpu: Optional[Tensor],
                 A_log: Optional[Tensor], dt_bias: Optional[Tensor]):
    """chunk_kda at K = V = D in {64, 128, 256} (the kernels' sizes; the binding checks D), scale given. q, k, g, beta
    in bf16, or all four float32 holding bf16 values (the value blocks of _with_supported_head_dims: their gradients
    come back in fp32)."""
    keep = q.dtype == torch.float32 and all(t.dtype == torch.float32 for t in (k, g, beta))
    q, k, g, beta = (t if keep else t.to(torch.bfloat16) for t in (q, k, g, beta))
    v = v.to(torch.bfloat16)
    D = q.shape[-1]
    if v.shape[-1] != D:
        _bad("v", tuple(v.shape), f"[B, T, HV, V] with V = K = {D}")
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
    q, k [B, H, K]; v [B, HV, V]; g [B, HV, K]; beta [B, HV] (read as bf16); state [B, HV, K, V] fp32 contiguous,
    updated in place (chunk_kda's final_state). Returns o [B, HV, V] bf16. Capturable in a CUDA graph. Head sizes as
    chunk_kda (any K <= 256, V >= 1): other than K = V in {64, 128, 256}, each value block's columns of the state
    are copied into a zero [B, HV, D, D] state, stepped, and copied back (_decode_with_supported_head_dims)."""
    require_cuda()
    if state.dtype != torch.float32 or not state.is_contiguous() or not state.is_cuda:
        _bad("state", (state.dtype, tuple(state.shape)), "a contiguous float32 CUDA tensor [B, HV, K, V]",
             "kda_decode_step")
    q, k, v, g, beta = (t.to(torch.bfloat16) for t in (q, k, v, g, beta))
    return _decode_with_supported_head_dims(_kda_decode_d, q, k, v, g, beta, state, scale=scale, dt_bias=dt_bias,
                                            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                                            use_gate_in_kernel=use_gate_in_kernel,
                                            use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                                            safe_gate=safe_gate, lower_bound=lower_bound, A_log=A_log)


def _kda_decode_d(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, scale: float,
                  use_qk_l2norm_in_kernel: bool, use_gate_in_kernel: bool, use_beta_sigmoid_in_kernel: bool,
                  safe_gate: bool, lower_bound: Optional[float], A_log: Optional[Tensor],
                  dt_bias: Optional[Tensor]) -> Tensor:
    """kda_decode_step at K = V = D in {64, 128, 256}, scale given; state [B, HV, D, D] fp32 contiguous."""
    q, k, v, g, beta = (t.to(torch.bfloat16).contiguous() for t in (q, k, v, g, beta))
    D = q.shape[-1]
    A, bias, g_min = _gate_params(use_gate_in_kernel, safe_gate, lower_bound, A_log, dt_bias, v.shape[1], D, q.device)
    return _kda_decode(q, k, v, g, beta, A, bias, state, float(scale), g_min, bool(use_qk_l2norm_in_kernel),
                       bool(use_beta_sigmoid_in_kernel), bool(use_gate_in_kernel))
