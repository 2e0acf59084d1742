"""kdalab's CUDA kernels on torch CUDA tensors (CUDA builds of kdalab only; kdalab.built_with_cuda).

Thin wrappers over kdalab._core.cuda_* (shapes, layouts, dtypes and math: kdalab/_core.pyi): they
allocate the outputs and workspaces that are not given (torch.empty on the inputs' device) and run
on torch's current stream unless `stream` (a cudaStream_t as an int) is given, so the calls can be
captured in a CUDA graph (torch.cuda.graph): pass every output, state and workspace preallocated
then. No libtorch is linked: arrays cross through DLPack, and torch is only used when it is already
imported. Without a CUDA build every call raises kdalab.NotAvailable naming what is missing.
"""
import sys

from . import _core, require_cuda

__all__ = ["attn_res", "kda_decode", "kda_prefill", "kda_prefill_workspace", "mla_absorb_query", "mla_decode",
           "mla_decode_workspace", "mla_prefill", "mla_prefill_workspace"]


def _torch():
    torch = sys.modules.get("torch")
    if torch is None:
        from . import NotAvailable
        raise NotAvailable("kdalab.cuda allocates its outputs with torch: import torch, or pass every output "
                           "and workspace to the kdalab._core.cuda_* functions")
    return torch


def _stream(stream):
    """The stream argument: as given, else torch's current stream (torch imported), else 0."""
    if stream is not None:
        return int(stream)
    torch = sys.modules.get("torch")
    return int(torch.cuda.current_stream().cuda_stream) if torch is not None else 0


def _empty(like, shape, dtype):
    torch = _torch()
    return torch.empty(shape, dtype=getattr(torch, dtype), device=like.device)


def kda_prefill_workspace(q, v, *, single_stream=False):
    """A workspace (uint8 tensor) for kda_prefill on q [B, T, H, D] and v [B, T, HV, D]."""
    require_cuda()
    B, T, H, D = q.shape
    n = _core.cuda_kda_prefill_workspace_bytes(B, T, H, v.shape[2], D, single_stream=single_stream)
    return _empty(q, (max(n, 1),), "uint8")


def kda_prefill(q, k, v, g, beta, *, A_log, bias, scale, g_min=-5.0, S0=None, final_state=True, o=None,
                S_final=None, workspace=None, l2norm_qk=True, beta_sigmoid=True, single_stream=False, stream=None):
    """KDA chunked prefill (kdalab._core.cuda_kda_prefill): returns (o [B, T, HV, D] bf16, S_final
    [B, HV, D, D] fp32 or None when final_state is False)."""
    require_cuda()
    B, T, H, D = q.shape
    HV = v.shape[2]
    o = _empty(q, (B, T, HV, D), "bfloat16") if o is None else o
    if S_final is None and final_state:
        S_final = _empty(q, (B, HV, D, D), "float32")
    ws = kda_prefill_workspace(q, v, single_stream=single_stream) if workspace is None else workspace
    _core.cuda_kda_prefill(q, k, v, g, beta, A_log, bias, o, S0, S_final, ws, g_min=g_min, scale=scale,
                           l2norm_qk=l2norm_qk, beta_sigmoid=beta_sigmoid, single_stream=single_stream,
                           stream=_stream(stream))
    return o, S_final


def kda_decode(q, k, v, g, beta, state, *, A_log, bias, scale, g_min=-5.0, o=None, l2norm_qk=True,
               beta_sigmoid=True, stream=None):
    """One KDA decode step (kdalab._core.cuda_kda_decode); `state` [B, HV, D, D] fp32 is updated in place.
    Returns o [B, HV, D] bf16."""
    require_cuda()
    o = _empty(q, tuple(v.shape), "bfloat16") if o is None else o
    _core.cuda_kda_decode(q, k, v, g, beta, A_log, bias, state, o, g_min=g_min, scale=scale, l2norm_qk=l2norm_qk,
                          beta_sigmoid=beta_sigmoid, stream=_stream(stream))
    return o


def mla_absorb_query(q_C, W_UK, *, q_hi=None, q_lo=None, stream=None):
    """The absorbed query as bf16 hi + lo (kdalab._core.cuda_mla_absorb_query): returns (q_hi, q_lo) [n, H, d_c]."""
    require_cuda()
    shape = (q_C.shape[0], q_C.shape[1], W_UK.shape[1])
    q_hi = _empty(q_C, shape, "bfloat16") if q_hi is None else q_hi
    q_lo = _empty(q_C, shape, "bfloat16") if q_lo is None else q_lo
    _core.cuda_mla_absorb_query(q_C, W_UK, q_hi, q_lo, stream=_stream(stream))
    return q_hi, q_lo


def mla_decode_workspace(q_hi, c, *, max_len=None, precision="auto"):
    """A workspace (uint8 tensor) for mla_decode on q_hi [B, H, d_c] or [B, s_q, H, d_c] and the cache
    c [B, N_max, row]."""
    require_cuda()
    s_q = q_hi.shape[1] if q_hi.dim() == 4 else 1
    n = _core.cuda_mla_decode_workspace_bytes(q_hi.shape[0], q_hi.shape[-2], c.shape[1],
                                              c.shape[1] if max_len is None else max_len, s_q=s_q,
                                              precision=precision)
    return _empty(q_hi, (max(n, 1),), "uint8")


def mla_decode(q_hi, q_lo, c, *, scale, max_len=None, lens=None, precision="auto", out=None, workspace=None,
               stream=None):
    """One absorbed MLA decode step (kdalab._core.cuda_mla_decode): returns a fp32 of q_hi's shape, [B, H, d_c]
    or [B, s_q, H, d_c] (multi-token decode: the last s_q cached tokens, causal among themselves). q_lo is None with
    the fast precision (precision "auto" picks it for s_q > 1). max_len defaults to N_max (every cached row is a
    token)."""
    require_cuda()
    max_len = c.shape[1] if max_len is None else max_len
    out = _empty(q_hi, tuple(q_hi.shape), "float32") if out is None else out
    ws = mla_decode_workspace(q_hi, c, max_len=max_len, precision=precision) if workspace is None else workspace
    _core.cuda_mla_decode(q_hi, q_lo, c, out, ws, lens, max_len=max_len, scale=scale, precision=precision,
                          stream=_stream(stream))
    return out


def mla_prefill_workspace(c, q_C, *, prefix, path="auto", precision="auto"):
    """A workspace (uint8 tensor) for mla_prefill on the cache c [B, N_max, row] and q_C [B, T, H, d_nope]."""
    require_cuda()
    B, T, H, _ = q_C.shape
    n = _core.cuda_mla_prefill_workspace_bytes(B, T, H, c.shape[1], prefix, path=path, precision=precision)
    return _empty(q_C, (max(n, 1),), "uint8")


def mla_prefill(c, q_C, W_UK, W_UV, *, prefix, scale, c_new=None, path="auto", precision="auto", out=None,
                out_dtype="float32", workspace=None, stream=None):
    """Causal MLA prefill with per-head output (kdalab._core.cuda_mla_prefill); writes the new latents into
    c. precision: "auto" (accurate), "accurate" or "fast". Returns o [B, T, H, d_v] in out_dtype ("float32", or
    "bfloat16" with precision "fast": the fp32 o rounded to bf16, half the bytes written); a given out decides by its
    own dtype."""
    require_cuda()
    if out is None and out_dtype not in ("float32", "bfloat16"):
        raise ValueError(f"out_dtype = {out_dtype!r}; accepted: 'float32', 'bfloat16'")
    B, T, H, _ = q_C.shape
    out = _empty(q_C, (B, T, H, W_UV.shape[0] // H), out_dtype) if out is None else out
    ws = (mla_prefill_workspace(c, q_C, prefix=prefix, path=path, precision=precision) if workspace is None
          else workspace)
    _core.cuda_mla_prefill(c, q_C, W_UK, W_UV, out, ws, c_new, prefix=prefix, scale=scale, path=path,
                           precision=precision, stream=_stream(stream))
    return out


def attn_res(src, w, *, eps=1e-6, out=None, out_dtype="float32", stream=None):
    """Attention Residuals over src [S, T, d] bf16 with pseudo-query w [d] fp32 (kdalab._core.cuda_attn_res):
    returns out [T, d] in out_dtype ("float32" or "bfloat16")."""
    require_cuda()
    out = _empty(src, tuple(src.shape[1:]), out_dtype) if out is None else out
    _core.cuda_attn_res(src, w, out, eps=eps, stream=_stream(stream))
    return out
