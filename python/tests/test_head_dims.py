"""kdalab.torch's head-size rule (python/kdalab/torch.py, _with_supported_head_dims and its decode twin): chunk_kda and
kda_decode_step take any K <= 256 and any V >= 1 by zero-padding the key channels to D in {64, 128, 256} and running
the value columns in blocks of D. Checked on the CPU with a float64 torch recurrence standing in for the kernels: the
stand-in refuses any size the kernels refuse, and the padded results and gradients must equal the same recurrence
run directly at the caller's sizes; chunk_kda's own path through the custom ops runs with a stand-in for the CUDA
entry points (the fp32 value-block inputs and gradients). Needs torch; skipped without it."""
import pytest

torch = pytest.importorskip("torch")
kt = pytest.importorskip("kdalab.torch")

SUPPORTED = (64, 128, 256)
LOWER_BOUND = -5.0


def step(S, q, k, v, g, beta, scale, l2norm, gate, A_log, dt_bias):
    """One token of docs/equations.md section 1 in fla's convention, per value head: S [B, HV, K, V]; q, k [B, H, K];
    v [B, HV, V]; g [B, HV, K]; beta [B, HV]. Value head j reads key head j / (HV / H). Returns (o [B, HV, V], S)."""
    HV, H = v.shape[1], q.shape[1]
    q, k = (x.repeat_interleave(HV // H, dim=1) for x in (q, k))
    if l2norm:
        q, k = (x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6) for x in (q, k))
    if gate:  # the K3 bounded gate, fused as chunk_kda's use_gate_in_kernel with safe_gate
        g = LOWER_BOUND * torch.sigmoid(A_log.exp()[:, None] * (g + dt_bias.reshape(HV, -1)))
    S = S * g.exp()[..., None]
    kv = (S * k[..., None]).sum(-2)
    S = S + beta[..., None, None] * k[..., None] * (v - kv)[..., None, :]
    return scale * (S * q[..., None]).sum(-2), S


def naive_chunk(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, dt_bias=None,
                use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, A_log=None):
    """The recurrence over T in fla's chunk_kda convention (float64 on the CPU), at any sizes."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K ** -0.5 if scale is None else scale
    S = q.new_zeros(B, HV, K, V) if initial_state is None else initial_state
    out = []
    for t in range(T):
        o, S = step(S, q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], scale, use_qk_l2norm_in_kernel,
                    use_gate_in_kernel, A_log, dt_bias)
        out.append(o)
    return torch.stack(out, 1), (S if output_final_state else None)


def kernel_like(calls):
    """naive_chunk that, like the kernels, takes only K = V = D in {64, 128, 256}; records each call's sizes."""
    def fn(q, k, v, g, beta, **kw):
        K, V = q.shape[-1], v.shape[-1]
        assert K == V and K in SUPPORTED and k.shape[-1] == K and g.shape[-1] == K, (K, V)
        S0 = kw.get("initial_state")
        assert S0 is None or tuple(S0.shape[-2:]) == (K, K)
        assert kw.get("scale") is not None  # the wrapper fixes the scale from the caller's K
        calls.append((K, V))
        return naive_chunk(q, k, v, g, beta, **kw)
    return fn


def inputs(K, V, B=2, T=5, H=1, HV=2, gate=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)
    x = dict(q=r(B, T, H, K), k=r(B, T, H, K), v=r(B, T, HV, V), beta=torch.rand(B, T, HV, generator=gen,
             dtype=torch.float64), initial_state=0.3 * r(B, HV, K, V))
    x["g"] = r(B, T, HV, K) if gate else -0.5 * torch.rand(B, T, HV, K, generator=gen, dtype=torch.float64)
    if not gate:  # unit keys without the fused L2Norm keep the recurrence bounded
        x["k"] = x["k"] / x["k"].norm(dim=-1, keepdim=True)
    if gate:
        x["dt_bias"], x["A_log"] = r(HV * K), 0.1 * r(HV)
    return {n: t.requires_grad_() for n, t in x.items()}


def run_and_grads(fn, x, opts, dO, dS):
    """(o, S_T, gradients of <o, dO> + <S_T, dS> by input name) of fn on fresh copies of x."""
    x = {n: t.detach().clone().requires_grad_() for n, t in x.items()}
    o, S = fn(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"], output_final_state=True,
              dt_bias=x.get("dt_bias"), A_log=x.get("A_log"), **opts)
    ((o * dO).sum() + (S * dS).sum()).backward()
    return o, S, {n: t.grad for n, t in x.items()}


@pytest.mark.parametrize("K", [1, 32, 96, 200])
@pytest.mark.parametrize("V", [16, 96, 300, 512])
def test_padded_head_sizes_give_the_recurrence_at_the_callers_sizes_with_gradients(K, V):
    gate = K == 96  # the fused gate and L2Norm on one K: dt_bias [HV K] is padded too
    opts = dict(use_qk_l2norm_in_kernel=gate, use_gate_in_kernel=gate)
    x = inputs(K, V, H=1, HV=2, gate=gate, seed=K * 1000 + V)
    gen = torch.Generator().manual_seed(7)
    dO = torch.randn(2, 5, 2, V, generator=gen, dtype=torch.float64)
    dS = torch.randn(2, 2, K, V, generator=gen, dtype=torch.float64)
    calls = []
    o, S, grads = run_and_grads(lambda *a, **kw: kt._with_supported_head_dims(kernel_like(calls), *a, **kw),
                                x, opts, dO, dS)
    o_ref, S_ref, grads_ref = run_and_grads(naive_chunk, x, opts, dO, dS)
    D = next(d for d in SUPPORTED if d >= max(K, min(V, 256)))
    assert calls == [(D, D)] * -(-V // D)  # the cost the docstring states: one call at D >= K, V; 256-column blocks
    assert o.shape == o_ref.shape == (2, 5, 2, V) and S.shape == S_ref.shape == (2, 2, K, V)
    torch.testing.assert_close(o, o_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(S, S_ref, rtol=1e-12, atol=1e-12)
    for name, ref in grads_ref.items():
        assert grads[name] is not None and grads[name].shape == ref.shape, name
        torch.testing.assert_close(grads[name], ref, rtol=1e-10, atol=1e-12, msg=name)


def test_supported_sizes_reach_the_function_unchanged():
    x = inputs(64, 64)
    seen = []
    out = kt._with_supported_head_dims(lambda *a, **kw: seen.append((a, kw)) or ("o", "S"), x["q"], x["k"], x["v"],
                                       x["g"], x["beta"], initial_state=x["initial_state"])
    assert out == ("o", "S") and len(seen) == 1
    args, kw = seen[0]
    assert all(a is b for a, b in zip(args, (x["q"], x["k"], x["v"], x["g"], x["beta"])))
    assert kw["initial_state"] is x["initial_state"] and kw["scale"] == 64 ** -0.5


def test_decode_step_at_padded_sizes_updates_the_callers_state_in_place():
    K, V, B, H, HV = 32, 300, 2, 1, 2
    x = {n: t.detach() for n, t in inputs(K, V, B=B, T=1, H=H, HV=HV).items()}
    one = {n: x[n][:, 0] for n in ("q", "k", "v", "g", "beta")}
    o_ref, S_ref = step(x["initial_state"], *(one[n] for n in ("q", "k", "v", "g", "beta")), K ** -0.5, False, False,
                        None, None)
    calls = []

    def decode_like(q, k, v, g, beta, state, scale, dt_bias):
        assert q.shape[-1] == v.shape[-1] == state.shape[-1] == state.shape[-2] and q.shape[-1] in SUPPORTED
        calls.append(q.shape[-1])
        o, state[...] = step(state, q, k, v, g, beta, scale, False, False, None, dt_bias)
        return o

    state = x["initial_state"].clone()
    o = kt._decode_with_supported_head_dims(decode_like, *(one[n] for n in ("q", "k", "v", "g", "beta")), state)
    assert calls == [256] * 2 and o.shape == (B, HV, V)
    torch.testing.assert_close(o, o_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(state, S_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("K", [257, 512])
def test_a_key_head_over_256_is_one_line_naming_q(K):
    x = inputs(K, 64, T=1)
    with pytest.raises(ValueError) as e:
        kt._with_supported_head_dims(naive_chunk, x["q"], x["k"], x["v"], x["g"], x["beta"])
    msg = str(e.value)
    assert msg.startswith(f"chunk_kda: q.shape[-1] (the key head size K) = {K}; accepted: 1 <= K <= 256")
    assert "\n" not in msg
    one = {n: x[n][:, 0].detach() for n in ("q", "k", "v", "g", "beta")}
    with pytest.raises(ValueError, match=f"^kda_decode_step: q.shape\\[-1\\] \\(the key head size K\\) = {K};"):
        kt._decode_with_supported_head_dims(None, *one.values(), x["initial_state"][:, :, :, :64].detach())


def test_mismatched_key_sizes_are_refused_before_padding():
    x = inputs(32, 64)
    with pytest.raises(ValueError, match=r"^chunk_kda: k.shape\[-1\] = 48; accepted: K = q.shape\[-1\] = 32$"):
        kt._with_supported_head_dims(naive_chunk, x["q"], torch.zeros(2, 5, 1, 48, dtype=torch.float64), x["v"], x["g"],
                                     x["beta"])
    with pytest.raises(ValueError,
                       match=r"^chunk_kda: initial_state.shape = \(2, 2, 64, 32\); accepted: \[..., K, V\]"):
        kt._with_supported_head_dims(naive_chunk, x["q"], x["k"], x["v"], x["g"], x["beta"],
                                     initial_state=torch.zeros(2, 2, 64, 32, dtype=torch.float64))


def blockwise_grads(calls, b):
    """A stand-in for the kernels (K = V = D) whose backward returns, for the i-th call, the gradient 1 where
    element % 3 == i % 3 and b elsewhere for q, k, g, beta, dt_bias and A_log, cast by autograd to their dtype (as the
    kernels' bf16 / fp32 gradients are): with three value blocks, every element's three terms are 1, b, b in an
    order that differs between elements, so any bf16 running sum rounds 1 + b first somewhere."""
    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, g, beta, dt_bias, A_log):
            ctx.i = len(calls)
            ctx.like = (q, k, g, beta, dt_bias, A_log)
            calls.append(v.shape[-1])
            return v.new_zeros(v.shape), None

        @staticmethod
        def backward(ctx, d_o, d_S):
            def grad(t):
                one = (torch.arange(t.numel()) % 3 == ctx.i % 3).reshape(t.shape)
                return torch.where(one, 1.0, b).to(torch.float32)
            q, k, g, beta, dt_bias, A_log = ctx.like
            return grad(q), grad(k), None, grad(g), grad(beta), grad(dt_bias), grad(A_log)

    def fn(q, k, v, g, beta, scale, initial_state, output_final_state, dt_bias, A_log):
        assert q.shape[-1] == v.shape[-1] in SUPPORTED
        return Fn.apply(q, k, v, g, beta, dt_bias, A_log)
    return fn


def test_value_blocks_sum_the_shared_inputs_gradients_in_fp32_and_round_once():
    K, V, B, T, H, HV = 64, 3 * 256, 1, 2, 1, 1
    b = 3 * 2.0 ** -10  # 1 + b rounds to 1 in bf16, 1 + 2b to 1 + 2^-7: a bf16 running sum loses b where 1 comes first
    bf = torch.bfloat16
    x = dict(q=torch.zeros(B, T, H, K, dtype=bf), k=torch.zeros(B, T, H, K, dtype=bf),
             v=torch.zeros(B, T, HV, V, dtype=bf), g=torch.zeros(B, T, HV, K, dtype=bf),
             beta=torch.zeros(B, T, HV, dtype=bf), dt_bias=torch.zeros(HV * K, dtype=bf),
             A_log=torch.zeros(HV, dtype=bf))
    for t in x.values():
        t.requires_grad_()
    calls = []
    o, _ = kt._with_supported_head_dims(blockwise_grads(calls, b), **x)
    o.float().sum().backward()
    assert calls == [256] * 3
    once = torch.tensor(1 + 2 * b, dtype=torch.float32).to(bf)  # the fp32 sum rounded once: 1 + 2^-7
    assert once.item() == 1 + 2.0 ** -7
    for name in ("q", "k", "g", "beta", "dt_bias", "A_log"):
        assert x[name].grad.dtype == bf, name
        assert torch.equal(x[name].grad, torch.full_like(x[name], once.item())), name
    # the same gradients summed by autograd in bf16 (three calls on the same bf16 tensors) lose b somewhere
    fn = blockwise_grads([], b)
    q, k, g = (torch.zeros(B, T, H, 256, dtype=bf, requires_grad=True) for _ in range(3))
    sum(fn(q, k, x["v"][..., :256], g, x["beta"], None, None, False, x["dt_bias"], x["A_log"])[0].float().sum()
        for _ in range(3)).backward()
    assert not torch.equal(q.grad, torch.full_like(q, once.item()))
    assert torch.equal(q.grad.float().unique(), torch.tensor([1.0, 1 + 2.0 ** -7]))  # only order differs


def test_value_blocks_reach_the_custom_ops_in_fp32_and_their_gradients_come_back_in_fp32(monkeypatch):
    """chunk_kda's own path (_chunk_kda_d and the custom ops kdalab::kda_prefill / kda_backward) at three value
    blocks, on the CPU with a stand-in for the CUDA entry points: the kernels read bf16 operands, the backward is given
    fp32 dq, dk, dg, dbeta outputs (KdaBackwardArgs::dq_f32) for the fp32 shared inputs, and the blocks' gradients
    are summed in fp32 and rounded to bf16 once (the stand-in's gradients are those of blockwise_grads)."""
    b = 3 * 2.0 ** -10
    seen = []

    class Core:  # kdalab._core's CUDA entry points, as far as the custom ops call them
        @staticmethod
        def cuda_kda_prefill_workspace_bytes(*a, **kw):
            return 1

        cuda_kda_backward_workspace_bytes = cuda_kda_prefill_workspace_bytes

        @staticmethod
        def cuda_kda_prefill(q, k, v, g, beta, A_log, bias, o, S0, S_final, ws, **kw):
            seen.append(("prefill", q.dtype, k.dtype, g.dtype, beta.dtype))
            o.zero_()
            S_final.zero_()

        @staticmethod
        def cuda_kda_backward(q, k, v, g, beta, A_log, bias, dO, S0, dS_T, dq, dk, dv, dg, dbeta, dA_log, dbias, dS0,
                              ws, **kw):
            i = sum(s[0] == "backward" for s in seen)
            seen.append(("backward", q.dtype, dq.dtype, dk.dtype, dg.dtype, dbeta.dtype))
            for t in (dq, dk, dg, dbeta):
                one = (torch.arange(t.numel()) % 3 == i % 3).reshape(t.shape)
                t.copy_(torch.where(one, 1.0, b))
            dv.zero_()
            dS0.zero_()

    monkeypatch.setattr(kt, "_core", Core)
    monkeypatch.setattr(kt, "require_cuda", lambda: None)
    monkeypatch.setattr(kt, "_stream", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    K, V, B, T, H, HV = 64, 3 * 256, 1, 2, 1, 1
    bf = torch.bfloat16
    x = dict(q=torch.zeros(B, T, H, K, dtype=bf), k=torch.zeros(B, T, H, K, dtype=bf),
             v=torch.zeros(B, T, HV, V, dtype=bf), g=torch.zeros(B, T, HV, K, dtype=bf),
             beta=torch.zeros(B, T, HV, dtype=bf))
    for t in x.values():
        t.requires_grad_()
    o, _ = kt._with_supported_head_dims(kt._chunk_kda_d, **x, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                                        use_beta_sigmoid_in_kernel=False, safe_gate=False, lower_bound=None,
                                        cu_seqlens=None, cu_seqlens_cpu=None, A_log=None)
    o.float().sum().backward()
    assert seen[:3] == [("prefill", bf, bf, bf, bf)] * 3  # the kernels' operands: bf16
    assert seen[3:] == [("backward", bf) + (torch.float32,) * 4] * 3  # fp32 gradient outputs for fp32 inputs
    once = torch.tensor(1 + 2 * b).to(bf).item()  # the fp32 sum 1 + 2b rounded once
    for name in ("q", "k", "g", "beta"):
        assert x[name].grad.dtype == bf, name
        assert torch.equal(x[name].grad, torch.full_like(x[name], once)), name
