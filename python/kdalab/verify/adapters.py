"""Adapters: one small class per calling convention, between kdalab's canonical tensors (kdalab.verify.cases)
and a candidate's arguments.

An adapter wraps the candidate callable and states what it declares:
  op           "kda" or "mla_decode"
  precision    the candidate's declared precision ("float64", "float32", "bf16"): it picks the budget
  exact_batch  whether the candidate's reduction order is the same for every batch position and every packing,
               so batch and varlen packing invariance must hold bit for bit (else within budget, reported)
  returns_state  whether it returns the final state
  fused_gate, beta_logits, l2norm_qk
               which form of the case's tensors the candidate receives: the gate logits g_raw with A_log, bias,
               g_min (K3 gate in the kernel) instead of g; beta_raw (Sigmoid in the kernel) instead of beta;
               q_raw, k_raw (L2Norm in the kernel) instead of q, k. The budget's emulation gets the same form.
  output_formats  the storage format of each returned quantity ("o", "S"; None: all at the declared precision),
               the format of the budget's output-rounding term
`supports(x)` returns None when the candidate can run the case's inputs x, else the reason it cannot (the verdict is
then "not applicable", never a pass). Calling the adapter returns (o, S): o in the canonical output layout and S
[N, HV, d_k, d_v] ("KV") or None, both float64 numpy arrays.

Adapters are built by name: make_adapter("fla-chunk:gate=fused,state=vk", fn). Options are `key=value` pairs after
a colon, comma-separated; each adapter documents its own.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

Out = Tuple[np.ndarray, Optional[np.ndarray]]


def _f64(a: Any, name: str) -> np.ndarray:
    """A candidate's output as float64; a complex one is an error (numpy would keep its real part with a warning)."""
    arr = np.asarray(a)
    if np.iscomplexobj(arr):
        raise TypeError(f"{name} has the complex dtype {arr.dtype}; a real array is expected")
    return np.asarray(arr, dtype=np.float64)


class Adapter:
    """Base of every adapter (see the module docstring)."""
    name = "base"
    op = "kda"
    options: Dict[str, Tuple[str, ...]] = {}   # option -> accepted values (first is the default)
    exact_batch = False
    returns_state = True
    fused_gate = False
    beta_logits = False
    l2norm_qk = False
    output_formats: Optional[Dict[str, str]] = None

    def __init__(self, fn: Callable, **opts: str):
        self.fn = fn
        self.opt: Dict[str, str] = {}
        for key, accepted in self.options.items():
            self.opt[key] = opts.pop(key, accepted[0])
            if accepted[0] != "*" and self.opt[key] not in accepted:
                raise ValueError(f"adapter {self.name}: {key} = {self.opt[key]!r}; accepted: {', '.join(accepted)}")
        if opts:
            raise ValueError(f"adapter {self.name}: unknown option {sorted(opts)[0]!r}; accepted: "
                             f"{', '.join(self.options) or 'none'}")
        self.precision = self.opt.get("precision", "float64")

    def supports(self, x: Dict[str, Any]) -> Optional[str]:
        if x["op"] != self.op:
            return f"the adapter runs {self.op}, the case is {x['op']}"
        return None

    def __call__(self, x: Dict[str, Any]) -> Out:
        raise NotImplementedError

    def describe(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in sorted(self.opt.items()))
        return f"{self.name}:{opts}" if opts else self.name


# ---------------------------------------------------------------------------------------------
# KDA
# ---------------------------------------------------------------------------------------------

class CanonicalKda(Adapter):
    """kdalab's canonical convention, numpy float64 in and out:
    fn(q, k, v, g, beta, *, scale, initial_state=None, cu_seqlens=None) -> (o [B, T, HV, d_v], S [N, HV, d_k, d_v]).
    Options: precision (float64 | float32 | bf16, the declared precision; default float64),
    exact (yes | no: bit-identical batch and varlen invariance declared; default yes)."""
    name = "canonical"
    options = {"precision": ("float64", "float32", "bf16"), "exact": ("yes", "no")}

    def __init__(self, fn, **opts):
        super().__init__(fn, **opts)
        self.exact_batch = self.opt["exact"] == "yes"

    def __call__(self, x):
        o, S = self.fn(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=x["scale"], initial_state=x["S0"],
                       cu_seqlens=x["cu_seqlens"])
        return _f64(o, "o"), None if S is None else _f64(S, "S")

    def backward_reason(self, x) -> Optional[str]:
        if not callable(getattr(self.fn, "backward", None)):
            return "the candidate has no backward (an attribute fn.backward)"
        return None

    def backward(self, x, dO):
        """The candidate's gradients of L = <dO, o>: fn.backward(q, k, v, g, beta, dO, *, scale, initial_state)
        -> {"dq", "dk", "dv", "dg", "dbeta", "dS0"} shaped as the inputs (dq, dk summed over a key head's value
        heads), numpy float64."""
        d = self.fn.backward(x["q"], x["k"], x["v"], x["g"], x["beta"], dO, scale=x["scale"], initial_state=x["S0"])
        return {k: _f64(a, k) for k, a in d.items()}


def _torch():
    import torch  # imported only by adapters that need it
    return torch


def _cuda_reason() -> Optional[str]:
    try:
        torch = _torch()
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device is visible to torch"
    return None


_TORCH_DTYPES = {"bf16": "bfloat16", "float32": "float32", "float64": "float64"}


class _TorchKda(Adapter):
    """Shared parts of the torch-based KDA adapters: dtype and device conversion, state layout, logits."""
    state_layout = "kv"

    def _t(self, a, dtype=None):
        torch = _torch()
        dt = getattr(torch, _TORCH_DTYPES[dtype or self.precision])
        return torch.as_tensor(np.ascontiguousarray(a)).to(device="cuda", dtype=dt)

    def _state_in(self, S0):
        if S0 is None:
            return None
        s = S0 if self.state_layout == "kv" else np.swapaxes(S0, -1, -2)
        return self._t(s, "float32")

    def _state_out(self, S):
        if S is None:
            return None
        s = S.detach().double().cpu().numpy()
        return np.ascontiguousarray(s if self.state_layout == "kv" else np.swapaxes(s, -1, -2))

    def backward_reason(self, x) -> Optional[str]:
        """Why the gradient cases cannot run (None: they can): gradients are judged in the canonical form, so an
        adapter with a backward runs them only with its gate, L2Norm and beta switches in that form."""
        if (self.opt.get("gate"), self.opt.get("l2norm"), self.opt.get("beta")) != ("precomputed", "off", "prob"):
            return ("gradients are judged in the canonical form dL/d(q, k, v, g, beta, S0): run the adapter with "
                    "gate=precomputed,l2norm=off,beta=prob")
        return self.supports(x)

    def _needs(self, x, fused_gate: bool, beta_logits: bool, l2norm: bool) -> Optional[str]:
        if fused_gate and not all(n in x for n in ("g_raw", "A_log", "bias")):
            return "the candidate fuses the gate; this case gives no exact gate logits"
        if beta_logits and "beta_raw" not in x:
            return "the candidate takes beta logits; this case gives no exact beta logit"
        if l2norm and not x.get("unit_qk", False):
            return "the candidate normalizes q and k in its kernel; this case checks un-normalized q, k"
        return _cuda_reason()


class FlaKda(_TorchKda):
    """fla's `chunk_kda` (name fla-chunk) or `fused_recurrent_kda` (fla-recurrent), fla.ops.kda, from their public
    signatures: q, k [B, T, H, K], v [B, T, HV, V], g [B, T, HV, K], beta [B, T, HV], initial_state [N, HV, K, V]
    (or [N, HV, V, K] with state_v_first), cu_seqlens (B = 1). Options:
      gate       precomputed (g is the log-decay) | fused (g_raw with A_log, dt_bias = bias [HV*K] and
                 lower_bound = g_min: the K3 bounded gate in the kernel; chunk_kda with safe_gate)
      state      kv | vk (state_v_first)
      l2norm     off | kernel (use_qk_l2norm_in_kernel on q_raw, k_raw; needs a unit-q/k case)
      beta       prob | logits (use_beta_sigmoid_in_kernel on beta_raw)
      precision  bf16 | float32 (the dtype of q, k, v, g, beta; the state is fp32)"""
    options = {"gate": ("precomputed", "fused"), "state": ("kv", "vk"), "l2norm": ("off", "kernel"),
               "beta": ("prob", "logits"), "precision": ("bf16", "float32")}

    def __init__(self, fn, *, name: str = "fla-chunk", **opts):
        self.name = name
        super().__init__(fn, **opts)
        self.state_layout = self.opt["state"]
        self.fused_gate = self.opt["gate"] == "fused"
        self.beta_logits = self.opt["beta"] == "logits"
        self.l2norm_qk = self.opt["l2norm"] == "kernel"
        self.output_formats = {"o": self.precision, "S": "float32", "dS0": "float32"}  # q, k, v's dtype; fp32 state

    def supports(self, x):
        return super().supports(x) or self._needs(x, self.opt["gate"] == "fused", self.opt["beta"] == "logits",
                                                  self.opt["l2norm"] == "kernel")

    def __call__(self, x):
        fused, l2 = self.opt["gate"] == "fused", self.opt["l2norm"] == "kernel"
        kw: Dict[str, Any] = dict(scale=x["scale"], initial_state=self._state_in(x["S0"]), output_final_state=True,
                                  use_qk_l2norm_in_kernel=l2, state_v_first=self.state_layout == "vk")
        if fused:
            HV, K = x["bias"].shape
            kw.update(use_gate_in_kernel=True, A_log=self._t(x["A_log"], "float32"),
                      dt_bias=self._t(x["bias"].reshape(HV * K), "float32"), lower_bound=x["g_min"])
            if self.name == "fla-chunk":
                kw["safe_gate"] = True
        if self.opt["beta"] == "logits":
            kw["use_beta_sigmoid_in_kernel"] = True
        if x["cu_seqlens"] is not None:
            kw["cu_seqlens"] = _torch().as_tensor(x["cu_seqlens"], dtype=_torch().long, device="cuda")
        q = x["q_raw"] if l2 else x["q"]
        k = x["k_raw"] if l2 else x["k"]
        g = x["g_raw"] if fused else x["g"]
        beta = x["beta_raw"] if self.opt["beta"] == "logits" else x["beta"]
        o, S = self.fn(self._t(q), self._t(k), self._t(x["v"]), self._t(g), self._t(beta), **kw)
        return o.detach().double().cpu().numpy(), self._state_out(S)


    def backward(self, x, dO):
        """Gradients of L = <dO, o> by torch autograd through the candidate (canonical inputs: the log-decay g, unit
        q and k, beta in [0, 1]); dO is handed over in o's dtype, S0's gradient comes back in the adapter's layout."""
        leaves = {n: self._t(x[n]).requires_grad_(True) for n in ("q", "k", "v", "g", "beta")}
        S0 = self._state_in(x["S0"])
        if S0 is not None:
            S0.requires_grad_(True)
        kw: Dict[str, Any] = dict(scale=x["scale"], initial_state=S0, output_final_state=False,
                                  use_qk_l2norm_in_kernel=False)
        if self.state_layout == "vk":
            kw["state_v_first"] = True
        out = self.fn(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"], **kw)
        o = out[0] if isinstance(out, (tuple, list)) else out
        o.backward(self._t(dO).to(o.dtype))
        d = {f"d{n}": t.grad for n, t in leaves.items()}
        if S0 is not None:
            d["dS0"] = S0.grad
        missing = sorted(k for k, t in d.items() if t is None)
        if missing:
            raise ValueError(f"the candidate's autograd gave no gradient for {', '.join(missing)}")
        r = {k: t.detach().double().cpu().numpy() for k, t in d.items() if k != "dS0"}
        if "dS0" in d:
            r["dS0"] = self._state_out(d["dS0"])
        return r


class FlashKdaFwd(_TorchKda):
    """FlashKDA's `flash_kda.fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None,
    final_state=None, cu_seqlens=None)` (github MoonshotAI/FlashKDA, its README's kernel API): bf16 q, k, v
    [B, T, H, K]; g the gate logits [B, T, H, K] (K3 bounded gate in the kernel, A_log [H] fp32, dt_bias [H, K] fp32,
    lower_bound in [-5, 0]); beta logits [B, T, H]; q and k L2-normalized in the kernel; out [B, T, H, V] bf16
    written in place; states [N, H, V, K] fp32; K = V = 128; HV = H. No options."""
    name = "flashkda"
    state_layout = "vk"
    options = {}
    fused_gate = beta_logits = l2norm_qk = True
    output_formats = {"o": "bf16", "S": "float32"}

    def __init__(self, fn, **opts):
        super().__init__(fn, **opts)
        self.precision = "bf16"

    def supports(self, x):
        r = super().supports(x)
        if r:
            return r
        H, HV, K, V = x["q"].shape[2], x["v"].shape[2], x["q"].shape[3], x["v"].shape[3]
        if (K, V) != (128, 128):
            return f"FlashKDA needs K = V = 128; the case has K = {K}, V = {V} (run with --param d_k=128 --param d_v=128)"
        if HV != H:
            return f"FlashKDA needs HV = H; the case has H = {H}, HV = {HV}"
        if not (-5.0 <= x.get("g_min", -5.0) <= 0.0):
            return f"FlashKDA needs lower_bound in [-5, 0]; the case has g_min = {x.get('g_min')}"
        return self._needs(x, True, True, True)

    def __call__(self, x):
        torch = _torch()
        q = self._t(x["q_raw"])
        out = torch.zeros(x["v"].shape, dtype=torch.bfloat16, device="cuda")
        N = x["v"].shape[0] if x["cu_seqlens"] is None else len(x["cu_seqlens"]) - 1
        H, K, V = x["v"].shape[2], x["q"].shape[3], x["v"].shape[3]
        s0 = self._state_in(x["S0"])
        sf = torch.zeros((N, H, V, K), dtype=torch.float32, device="cuda")
        cu = None if x["cu_seqlens"] is None else torch.as_tensor(x["cu_seqlens"], dtype=torch.int64, device="cuda")
        self.fn(q, self._t(x["k_raw"]), self._t(x["v"]), self._t(x["g_raw"]), self._t(x["beta_raw"]), x["scale"], out,
                self._t(x["A_log"], "float32"), self._t(x["bias"], "float32"), x["g_min"],
                initial_state=s0, final_state=sf, cu_seqlens=cu)
        torch.cuda.synchronize()
        return out.double().cpu().numpy(), self._state_out(sf)


class KdalabCudaKda(_TorchKda):
    """kdalab's own prefill kernel (kernels/kda.hpp kda_prefill) through the module's CUDA entry point
    `kdalab._core.cuda_kda_prefill(q, k, v, g, beta, A_log, bias, o, S0, S_final, workspace, *, g_min, scale,
    l2norm_qk, beta_sigmoid, gate_fused)` (KDALAB_CUDA builds only): bf16 q, k, v, g, beta; A_log [HV], bias [HV, D]
    fp32; S0, S_final fp32 [N, HV, D, D] ("KV"); D = d_k = d_v in {64, 128, 256}; varlen cases pass cu_seqlens
    (int32 [N + 1], B = 1) and max_seqlen. Options (the kernel's own switches; defaults: everything in the kernel):
      gate    fused (g_raw with A_log, bias and g_min: the K3 bounded gate in the kernel) | precomputed (g itself)
      l2norm  kernel (q_raw, k_raw normalised in the kernel; needs a unit-q/k case) | off (q, k as given)
      beta    logits (beta_raw, Sigmoid in the kernel) | prob (beta itself)
      precision  fast (bf16 state-product operands) | accurate (hi + lo state products; D = 128 only)
    The candidate is that entry point (None: looked up in the module); without it every case is "not applicable"."""
    name = "kdalab-cuda"
    entry_point = "kdalab._core:cuda_kda_prefill"  # the candidate when none is given
    options = {"gate": ("fused", "precomputed"), "l2norm": ("kernel", "off"), "beta": ("logits", "prob"),
               "precision": ("fast", "accurate")}
    output_formats = {"o": "bf16", "S": "float32", "dS0": "float32"}

    def __init__(self, fn, **opts):
        import kdalab
        super().__init__(fn if fn is not None else getattr(kdalab._core, "cuda_kda_prefill", None), **opts)
        self.precision = "bf16"
        self.exact_batch = False
        self.fused_gate = self.opt["gate"] == "fused"
        self.beta_logits = self.opt["beta"] == "logits"
        self.l2norm_qk = self.opt["l2norm"] == "kernel"

    def supports(self, x):
        r = Adapter.supports(self, x)
        if r:
            return r
        import kdalab
        if self.fn is None or not kdalab.built_with_cuda:
            return "this kdalab was built without its CUDA entry points (KDALAB_CUDA=OFF)"
        K, V = x["q"].shape[3], x["v"].shape[3]
        if K != V or K not in (64, 128, 256):
            return f"kdalab's kernel needs d_k = d_v in {{64, 128, 256}}; the case has {K}, {V}"
        if self.opt["precision"] == "accurate" and K != 128:
            return f"kdalab's accurate precision needs d_k = d_v = 128; the case has {K}"
        if self.fused_gate and not (-5.0 <= x.get("g_min", -5.0) < 0.0):
            return f"kdalab's kernel needs -5 <= g_min < 0; the case has g_min = {x.get('g_min')}"
        if not self.fused_gate and float(np.min(x["g"])) < -5.0:
            return f"kdalab's kernel needs a precomputed g in [-5, 0]; the case has min g = {float(np.min(x['g']))}"
        return self._needs(x, self.fused_gate, self.beta_logits, self.l2norm_qk)

    def __call__(self, x):
        import kdalab
        torch = _torch()
        B, T, H, D = x["q"].shape
        HV = x["v"].shape[2]
        cu = x["cu_seqlens"]
        N = B if cu is None else len(cu) - 1
        varlen = {} if cu is None else dict(
            cu_seqlens=torch.as_tensor(np.asarray(cu), dtype=torch.int32, device="cuda"),
            max_seqlen=int(np.max(np.diff(np.asarray(cu)))))
        o = torch.zeros((B, T, HV, D), dtype=torch.bfloat16, device="cuda")
        sf = torch.zeros((N, HV, D, D), dtype=torch.float32, device="cuda")
        ws = torch.empty(kdalab._core.cuda_kda_prefill_workspace_bytes(B, T, H, HV, D, num_seqs=0 if cu is None else N,
                                                                       precision=self.opt["precision"]),
                         dtype=torch.uint8, device="cuda")
        q, k = (x["q_raw"], x["k_raw"]) if self.l2norm_qk else (x["q"], x["k"])
        g = x["g_raw"] if self.fused_gate else x["g"]
        beta = x["beta_raw"] if self.beta_logits else x["beta"]
        A_log = self._t(x["A_log"], "float32") if self.fused_gate else torch.zeros(HV, device="cuda")
        bias = self._t(x["bias"], "float32") if self.fused_gate else torch.zeros((HV, D), device="cuda")
        self.fn(self._t(q), self._t(k), self._t(x["v"]), self._t(g), self._t(beta), A_log, bias, o,
                self._state_in(x["S0"]), sf, ws, g_min=x.get("g_min", -5.0) if self.fused_gate else -5.0,
                scale=x["scale"], l2norm_qk=self.l2norm_qk, beta_sigmoid=self.beta_logits,
                gate_fused=self.fused_gate, precision=self.opt["precision"],
                stream=torch.cuda.current_stream().cuda_stream, **varlen)
        torch.cuda.synchronize()
        return o.double().cpu().numpy(), self._state_out(sf)

    def backward(self, x, dO):
        """kdalab's backward kernel (kernels/kda_backward.hpp, `kdalab._core.cuda_kda_backward`) on the canonical
        inputs (the log-decay g, unit q and k, beta in [0, 1]) for upstream dO in bf16 and no dS_T: dq, dk, dv, dg,
        dbeta as bf16, dS0 fp32 (when the case has S0)."""
        import kdalab
        torch = _torch()
        B, T, H, D = x["q"].shape
        HV = x["v"].shape[2]
        bf = dict(dtype=torch.bfloat16, device="cuda")
        dq, dk = torch.zeros((B, T, H, D), **bf), torch.zeros((B, T, H, D), **bf)
        dv, dg = torch.zeros((B, T, HV, D), **bf), torch.zeros((B, T, HV, D), **bf)
        dbeta = torch.zeros((B, T, HV), **bf)
        dS0 = None if x["S0"] is None else torch.zeros((B, HV, D, D), dtype=torch.float32, device="cuda")
        ws = torch.empty(kdalab._core.cuda_kda_backward_workspace_bytes(B, T, H, HV, D), dtype=torch.uint8,
                         device="cuda")
        kdalab._core.cuda_kda_backward(
            self._t(x["q"]), self._t(x["k"]), self._t(x["v"]), self._t(x["g"]), self._t(x["beta"]), None, None,
            self._t(dO), self._state_in(x["S0"]), None, dq, dk, dv, dg, dbeta, None, None, dS0, ws, g_min=-5.0,
            scale=x["scale"], l2norm_qk=False, beta_sigmoid=False, gate_fused=False,
            stream=torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        r = {n: t.double().cpu().numpy() for n, t in (("dq", dq), ("dk", dk), ("dv", dv), ("dg", dg),
                                                     ("dbeta", dbeta))}
        if dS0 is not None:
            r["dS0"] = self._state_out(dS0)
        return r


# ---------------------------------------------------------------------------------------------
# MLA decode
# ---------------------------------------------------------------------------------------------

class CanonicalMlaDecode(Adapter):
    """kdalab's canonical MLA decode convention, numpy float64: fn(q [B, n_h, d_c], cache [B, N, d_c],
    cache_seqlens [B], *, scale) -> o [B, n_h, d_c]; multi-token decode cases pass q [B, s_q, n_h, d_c] (the last s_q
    cached tokens, causal among themselves) and expect o [B, s_q, n_h, d_c]. Options: precision, exact (as the
    canonical KDA adapter)."""
    name = "mla-canonical"
    op = "mla_decode"
    returns_state = False
    options = {"precision": ("float64", "float32", "bf16"), "exact": ("yes", "no")}

    def __init__(self, fn, **opts):
        super().__init__(fn, **opts)
        self.exact_batch = self.opt["exact"] == "yes"

    def __call__(self, x):
        o = self.fn(x["q"], x["cache"], x["cache_seqlens"], scale=x["scale"])
        return _f64(o, "o"), None


class FlashMlaDecode(Adapter):
    """FlashMLA-style decode: fn(q [B, s_q, h_q, d], k_cache [num_blocks, page_block_size, 1, d],
    block_table [B, max_blocks] int32, cache_seqlens [B] int32, head_dim_v, tile_scheduler_metadata, num_splits,
    softmax_scale, causal) -> (out [B, s_q, h_q, head_dim_v], lse), with get_mla_metadata(cache_seqlens, s_q * h_q,
    1) giving the scheduler arguments (s_q = 1, or the multi-token cases' s_q with causal = True) (flash_mla.flash_mla_with_kvcache's public signature). The latent cache is
    paged in blocks of `page` tokens (option page, default 64); d = head_dim_v = d_c (NoPE). Options: page."""
    name = "flashmla"
    op = "mla_decode"
    returns_state = False
    options = {"page": ("64", "*")}
    output_formats = {"o": "bf16"}

    def __init__(self, fn, **opts):
        super().__init__(fn, **opts)
        self.precision = "bf16"

    def supports(self, x):
        return super().supports(x) or _cuda_reason()

    def __call__(self, x):
        torch = _torch()
        import flash_mla  # noqa: F401  (get_mla_metadata of the same package)
        page = int(self.opt["page"])
        q4 = x["q"] if x["q"].ndim == 4 else x["q"][:, None]
        B, s_q, n_h, d_c = q4.shape
        N = x["cache"].shape[1]
        nb = (N + page - 1) // page
        cache = np.zeros((B * nb * page, d_c))
        for b in range(B):
            cache[b * nb * page:b * nb * page + N] = x["cache"][b]
        k_cache = torch.as_tensor(cache.reshape(B * nb, page, 1, d_c)).to("cuda", torch.bfloat16)
        table = torch.arange(B * nb, dtype=torch.int32, device="cuda").reshape(B, nb)
        lens = torch.as_tensor(x["cache_seqlens"], dtype=torch.int32, device="cuda")
        meta, splits = flash_mla.get_mla_metadata(lens, s_q * n_h, 1)
        q = torch.as_tensor(q4).to("cuda", torch.bfloat16)
        out, _ = self.fn(q, k_cache, table, lens, d_c, meta, splits, softmax_scale=x["scale"], causal=True)
        out = out.double().cpu().numpy()
        return (out if x["q"].ndim == 4 else out[:, 0]), None


class KdalabCudaMlaDecode(Adapter):
    """kdalab's MLA decode kernel (kernels/mla.hpp mla_decode) through the module's CUDA entry point
    `kdalab._core.cuda_mla_decode(q_hi, q_lo, c, out, workspace, lens, *, max_len, scale, precision)` (KDALAB_CUDA
    builds only): q [B, n_h, d_c] or, for the multi-token cases, [B, s_q, n_h, d_c] with s_q <= 4 (the last s_q cached
    tokens, causal among themselves); the absorbed query as q_hi = bf16(q) and, with the accurate precision,
    q_lo = bf16(q - q_hi); the latent cache bf16 [B, N, d_c]; lens int32 [B]; fp32 output of q's shape. H in {16, 32},
    d_c = 512. Option precision: auto (the kernel's rule: accurate for s_q = 1, fast for s_q > 1), accurate (q and P
    as bf16 hi + lo; s_q = 1 only) or fast (bf16 q and P). The budget is that of a bf16 candidate in every precision.
    The candidate is that entry point (None: looked up in the module); without it every case is "not applicable"."""
    name = "kdalab-mla-cuda"
    entry_point = "kdalab._core:cuda_mla_decode"  # the candidate when none is given
    op = "mla_decode"
    returns_state = False
    options = {"precision": ("auto", "accurate", "fast")}
    output_formats = {"o": "float32"}

    def __init__(self, fn, **opts):
        import kdalab
        super().__init__(fn if fn is not None else getattr(kdalab._core, "cuda_mla_decode", None), **opts)
        self.precision = "bf16"

    def _precision(self, s_q):
        """The precision the kernel runs for s_q query tokens: the option, or the rule's."""
        p = self.opt["precision"]
        return ("accurate" if s_q == 1 else "fast") if p == "auto" else p

    def supports(self, x):
        r = super().supports(x)
        if r:
            return r
        s_q = x["q"].shape[1] if x["q"].ndim == 4 else 1
        if s_q > 4:
            return (f"kdalab's MLA decode kernel takes 1 to 4 query tokens per sequence; the case has s_q = {s_q} "
                    f"(multi-token decode)")
        if s_q > 1 and self._precision(s_q) == "accurate":
            return (f"kdalab's MLA decode kernel runs the accurate precision for one query token only; the case has "
                    f"s_q = {s_q} (give precision=fast or auto)")
        import kdalab
        if self.fn is None or not kdalab.built_with_cuda:
            return "this kdalab was built without its CUDA entry points (KDALAB_CUDA=OFF)"
        n_h, d_c = x["q"].shape[-2:]
        if n_h not in (16, 32) or d_c != 512:
            return f"kdalab's MLA decode needs H in {{16, 32}} and d_c = 512; the case has H = {n_h}, d_c = {d_c}"
        return _cuda_reason()

    def __call__(self, x):
        import kdalab
        torch = _torch()
        B, n_h, d_c = x["q"].shape[0], x["q"].shape[-2], x["q"].shape[-1]
        s_q = x["q"].shape[1] if x["q"].ndim == 4 else 1
        N = x["cache"].shape[1]
        precision = self._precision(s_q)
        q = torch.as_tensor(x["q"]).to("cuda", torch.float32).contiguous()
        q_hi = q.to(torch.bfloat16)
        q_lo = (q - q_hi.float()).to(torch.bfloat16) if precision == "accurate" else None
        c = torch.as_tensor(x["cache"]).to("cuda", torch.bfloat16).contiguous()
        out = torch.zeros(tuple(q.shape), dtype=torch.float32, device="cuda")
        max_len = int(max(x["cache_seqlens"]))
        ws = torch.empty(kdalab._core.cuda_mla_decode_workspace_bytes(B, n_h, N, max_len, s_q=s_q, precision=precision),
                         dtype=torch.uint8, device="cuda")
        lens = torch.as_tensor(x["cache_seqlens"], dtype=torch.int32, device="cuda")
        self.fn(q_hi, q_lo, c, out, ws, lens, max_len=max_len, scale=x["scale"], precision=precision,
                stream=torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        return out.double().cpu().numpy(), None


def _fla(name):
    return lambda fn, **o: FlaKda(fn, name=name, **o)


ADAPTERS: Dict[str, Callable[..., Adapter]] = {
    "canonical": CanonicalKda,
    "fla-chunk": _fla("fla-chunk"),
    "fla-recurrent": _fla("fla-recurrent"),
    "flashkda": FlashKdaFwd,
    "kdalab-cuda": KdalabCudaKda,
    "mla-canonical": CanonicalMlaDecode,
    "flashmla": FlashMlaDecode,
    "kdalab-mla-cuda": KdalabCudaMlaDecode,
}


def parse_spec(spec: str) -> Tuple[str, Dict[str, str]]:
    """"NAME[:key=value,...]" -> (NAME, options); ValueError naming what is wrong."""
    name, _, rest = spec.partition(":")
    if name not in ADAPTERS:
        raise ValueError(f"--adapter {name!r} is unknown; accepted: {', '.join(ADAPTERS)}")
    opts: Dict[str, str] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"--adapter option {item!r} is not key=value")
        if key in opts:  # the later value would replace the earlier one unseen
            raise ValueError(f"--adapter {spec!r}: option {key!r} is given twice; give each option once")
        opts[key] = value
    return name, opts


def make_adapter(spec: str, fn: Callable) -> Adapter:
    """The adapter named by spec ("NAME[:key=value,...]") around candidate fn."""
    name, opts = parse_spec(spec)
    return ADAPTERS[name](fn, **opts)
