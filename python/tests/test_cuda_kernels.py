"""kdalab's CUDA kernels called from torch (kdalab.cuda) give the same bits as the C++ path on the same
inputs: the _host_* functions run each kernel the way the C++ GPU tests do (host arrays uploaded with
cudaMemcpy into fresh buffers, arguments at their contiguous defaults; for KDA the tests' own
tests/gpu/kda_gpu_util.hpp prefill_then_decode), so a wrong pointer, shape, stride, dtype or stream in
the DLPack entry points shows as a bit difference. A CUDA graph of the decode step captures and replays
the eager bits. Needs a CUDA build of kdalab, torch and a GPU (python/gpu_check.sh); without a CUDA
build, the entry points raise kdalab.NotAvailable naming what is missing."""
import numpy as np
import pytest

import kdalab
import kdalab.cuda as kc
from kdalab import _core


def bits_equal(x, ref):
    """x (torch tensor, any float dtype) equals ref (float64 numpy) value for value, NaN nowhere."""
    x = x.detach().double().cpu().numpy()
    return x.shape == ref.shape and np.array_equal(x, ref)


def test_without_a_cuda_build_every_entry_point_names_what_is_missing():
    if kdalab.built_with_cuda:
        pytest.skip("this build has the CUDA kernels")
    with pytest.raises(kdalab.NotAvailable, match=r"built without its CUDA kernels.*KDALAB_CUDA=ON"):
        kc.kda_prefill(None, None, None, None, None, A_log=None, bias=None, scale=1.0)
    with pytest.raises(kdalab.NotAvailable, match=r"KDALAB_CUDA=ON"):
        kc.mla_decode(None, None, None, scale=1.0)


def test_without_a_cuda_build_the_torch_ops_raise_not_available():
    """kdalab.torch imports on any build; chunk_kda, kda_decode_step and the ops under torch.ops.kdalab raise
    NotAvailable (the ops reached torch.cuda first: a CUDA driver error on a machine without one)."""
    if kdalab.built_with_cuda:
        pytest.skip("this build has the CUDA kernels")
    torch = pytest.importorskip("torch")
    import kdalab.torch as kt
    q, g, beta = torch.randn(1, 8, 2, 64), -torch.rand(1, 8, 2, 64), torch.rand(1, 8, 2)
    calls = [lambda: kt.chunk_kda(q, q, q, g, beta),
             lambda: kt.kda_decode_step(q[:, 0], q[:, 0], q[:, 0], g[:, 0], beta[:, 0], torch.zeros(1, 2, 64, 64)),
             lambda: torch.ops.kdalab.kda_prefill(q, q, q, g, beta, None, None, None, None, 0.125, -5.0, False, False,
                                                  False, 8),
             lambda: torch.ops.kdalab.kda_backward(q, q, q, g, beta, None, None, None, None, q, None, 0.125, -5.0,
                                                   False, False, False, 8),
             lambda: torch.ops.kdalab.kda_decode(q[:, 0], q[:, 0], q[:, 0], g[:, 0], beta[:, 0], None, None,
                                                 torch.zeros(1, 2, 64, 64), 0.125, -5.0, False, False, False)]
    for call in calls:
        with pytest.raises(kdalab.NotAvailable, match=r"built without its CUDA kernels"):
            call()


def kda_inputs(B, T, H, group, D, seed):
    """anchor-kda with HV = group H (q_raw, k_raw cut to H heads) and the gate parameters in fp32: the GPU
    tests' make_inputs."""
    d = kdalab.anchor_kda(B, T, H * group, D, seed)
    for n in ("q_raw", "k_raw"):
        d[n] = np.ascontiguousarray(d[n][:, :, :H])
    for n in ("A_log", "bias"):
        d[n] = d[n].astype(np.float32).astype(np.float64)
    return d


def to_dev(torch, d, names, dtype):
    return {n: torch.from_numpy(d[n]).to("cuda", dtype) for n in names}


RAW = ("q_raw", "k_raw", "v", "g_raw", "beta_raw")


@pytest.mark.parametrize("B,T,H,group,D,T0", [(1, 100, 2, 1, 128, 64), (2, 40, 1, 2, 64, 33), (1, 37, 2, 1, 256, 37)])
def test_kda_prefill_then_decode_from_torch_equals_the_cpp_gpu_test_path(torch, B, T, H, group, D, T0):
    d = kda_inputs(B, T, H, group, D, seed=5)
    o_ref, S_ref = _core._host_kda_prefill_then_decode({n: d[n] for n in RAW + ("A_log", "bias", "S0")},
                                                       g_min=d["g_min"], scale=d["scale"], T0=T0)
    x = to_dev(torch, d, RAW, torch.bfloat16) | to_dev(torch, d, ("A_log", "bias", "S0"), torch.float32)
    gate = dict(A_log=x["A_log"], bias=x["bias"], g_min=d["g_min"], scale=d["scale"])
    head = [x[n][:, :T0].contiguous() for n in RAW]
    o_pre, S = kc.kda_prefill(*head, S0=x["S0"], **gate)
    steps = [kc.kda_decode(*[x[n][:, t].contiguous() for n in RAW], S, **gate) for t in range(T0, T)]
    o = torch.cat([o_pre] + [s.unsqueeze(1) for s in steps], dim=1)
    torch.cuda.synchronize()
    assert bits_equal(o, o_ref) and bits_equal(S, S_ref)
    if group == 1:  # and within the bf16 goal of the float64 truth, as the README's recipe reads it
        truth, _ = kdalab.kda_recurrent(d["q"], d["k"], d["v"], d["g"], d["beta"], d["S0"], scale=d["scale"])
        r = kdalab.check(o.float().cpu(), truth, name="o", tol=kdalab.budgets()["kda_bf16_goal"][0])
        assert r.passed, r.verdict


def test_decode_steps_captured_in_a_cuda_graph_replay_the_eager_bits(torch):
    d = kda_inputs(2, 6, 2, 1, 128, seed=7)
    x = to_dev(torch, d, RAW, torch.bfloat16) | to_dev(torch, d, ("A_log", "bias", "S0"), torch.float32)
    gate = dict(A_log=x["A_log"], bias=x["bias"], g_min=d["g_min"], scale=d["scale"])
    T = d["T"]
    state_e = x["S0"].clone()
    eager = [kc.kda_decode(*[x[n][:, t].contiguous() for n in RAW], state_e, **gate).clone() for t in range(T)]

    static = [x[n][:, 0].contiguous().clone() for n in RAW]
    state_g, o_g = x["S0"].clone(), torch.empty_like(eager[0])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as torch.cuda.graph asks
        kc.kda_decode(*static, state_g, o=o_g, **gate)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # kc picks up the capture stream (torch's current stream)
        kc.kda_decode(*static, state_g, o=o_g, **gate)
    state_g.copy_(x["S0"])
    replayed = []
    for t in range(T):
        for s, n in zip(static, RAW):
            s.copy_(x[n][:, t])
        graph.replay()
        replayed.append(o_g.clone())
    torch.cuda.synchronize()
    for t in range(T):
        assert torch.equal(replayed[t], eager[t]), f"token {t}"
    assert torch.equal(state_g, state_e)


def bf16_randn(torch, shape, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(torch.bfloat16)


def test_mla_absorb_and_decode_from_torch_equal_the_host_path_and_capture_in_a_graph(torch):
    B, H, dn, dc, N = 2, 32, 128, 512, 300
    q_C, W_UK = bf16_randn(torch, (B, H, dn), seed=1), bf16_randn(torch, (H * dn, dc), dc ** -0.5, seed=2)
    c = bf16_randn(torch, (B, N, dc), seed=3)
    scale = dn ** -0.5
    hi_ref, lo_ref, a_ref = _core._host_mla_absorb_decode(q_C.double().numpy(), W_UK.double().numpy(),
                                                          c.double().numpy(), scale)
    q_C, W_UK, c = q_C.cuda(), W_UK.cuda(), c.cuda()
    q_hi, q_lo = kc.mla_absorb_query(q_C, W_UK)
    a = kc.mla_decode(q_hi, q_lo, c, scale=scale)
    torch.cuda.synchronize()
    assert bits_equal(q_hi, hi_ref) and bits_equal(q_lo, lo_ref) and bits_equal(a, a_ref)

    ws, out = kc.mla_decode_workspace(q_hi, c), torch.empty_like(a)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kc.mla_absorb_query(q_C, W_UK, q_hi=q_hi, q_lo=q_lo)
        kc.mla_decode(q_hi, q_lo, c, scale=scale, out=out, workspace=ws)
    graph.replay()
    torch.cuda.synchronize()
    assert bits_equal(out, a_ref)


@pytest.mark.parametrize("s_q", [2, 4])
def test_mla_multi_token_decode_from_torch_is_within_the_fast_budget_and_graph_capturable(torch, s_q):
    from kdalab.verify.candidates import numpy_mla_decode
    B, H, dc, N = 2, 32, 512, 300
    lens = np.array([N, s_q + 40])
    c = bf16_randn(torch, (B, N, dc), seed=4)
    q = torch.randn((B, s_q, H, dc), generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 1.2
    scale = 192 ** -0.5
    truth = numpy_mla_decode(q.numpy(), c.double().numpy(), lens, scale=scale)
    q_hi, c, lens_d = q.to(torch.bfloat16).cuda(), c.cuda(), torch.as_tensor(lens, dtype=torch.int32).cuda()
    a = kc.mla_decode(q_hi, None, c, scale=scale, lens=lens_d)  # precision auto: fast for s_q > 1
    torch.cuda.synchronize()
    assert a.shape == (B, s_q, H, dc)
    r = kdalab.check(a.double().cpu().numpy(), truth, name="a", tol=kdalab.budgets()["mla_decode_fast"][0])
    assert r.passed, r
    ws, out = kc.mla_decode_workspace(q_hi, c), torch.empty_like(a)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kc.mla_decode(q_hi, None, c, scale=scale, lens=lens_d, out=out, workspace=ws)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, a)
    with pytest.raises(kdalab.Error, match="q_lo"):  # fast reads the bf16 query alone
        kc.mla_decode(q_hi, q_hi, c, scale=scale, lens=lens_d)
    with pytest.raises(kdalab.Error, match="precision = accurate with s_q"):
        kc.mla_decode(q_hi, q_hi, c, scale=scale, lens=lens_d, precision="accurate")


@pytest.mark.parametrize("path,precision", [("absorbed", "auto"), ("naive", "auto"), ("auto", "fast")])
def test_mla_prefill_from_torch_equals_the_host_path(torch, path, precision):
    B, T, H, dn, dc, prefix, N = 2, 40, 4, 128, 512, 24, 80
    cache = torch.zeros((B, N, dc), dtype=torch.bfloat16)
    cache[:, :prefix] = bf16_randn(torch, (B, prefix, dc), seed=4)
    c_new, q_C = bf16_randn(torch, (B, T, dc), seed=5), bf16_randn(torch, (B, T, H, dn), seed=6)
    W_UK, W_UV = bf16_randn(torch, (H * dn, dc), dc ** -0.5, seed=7), bf16_randn(torch, (H * dn, dc), dc ** -0.5, seed=8)
    scale = dn ** -0.5
    o_ref, cache_ref = _core._host_mla_prefill(*(t.double().numpy() for t in (cache, c_new, q_C, W_UK, W_UV)),
                                               prefix, scale, path, precision)
    c = cache.cuda()
    o = kc.mla_prefill(c, q_C.cuda(), W_UK.cuda(), W_UV.cuda(), prefix=prefix, scale=scale, c_new=c_new.cuda(),
                       path=path, precision=precision)
    torch.cuda.synchronize()
    assert bits_equal(o, o_ref) and bits_equal(c, cache_ref)


def test_mla_prefill_bf16_out_is_the_fp32_o_rounded(torch):
    B, T, H, dn, dc, prefix, N = 2, 130, 4, 128, 512, 24, 160
    cache = torch.zeros((B, N, dc), dtype=torch.bfloat16)
    cache[:, :prefix] = bf16_randn(torch, (B, prefix, dc), seed=11)
    c_new, q_C = bf16_randn(torch, (B, T, dc), seed=12), bf16_randn(torch, (B, T, H, dn), seed=13)
    W_UK, W_UV = bf16_randn(torch, (H * dn, dc), dc ** -0.5, seed=14), bf16_randn(torch, (H * dn, dc), dc ** -0.5, seed=15)
    args = [t.cuda() for t in (q_C, W_UK, W_UV)]
    o32 = kc.mla_prefill(cache.cuda(), *args, prefix=prefix, scale=dn ** -0.5, c_new=c_new.cuda(), precision="fast")
    o16 = kc.mla_prefill(cache.cuda(), *args, prefix=prefix, scale=dn ** -0.5, c_new=c_new.cuda(), precision="fast",
                         out_dtype="bfloat16")
    torch.cuda.synchronize()
    assert o16.dtype == torch.bfloat16 and torch.equal(o16, o32.bfloat16())
    with pytest.raises(kdalab.Error, match="out_bf16 with precision accurate"):
        kc.mla_prefill(cache.cuda(), *args, prefix=prefix, scale=dn ** -0.5, c_new=c_new.cuda(), out_dtype="bfloat16")
    with pytest.raises(ValueError, match="out_dtype = 'float16'"):
        kc.mla_prefill(cache.cuda(), *args, prefix=prefix, scale=dn ** -0.5, precision="fast", out_dtype="float16")


def test_attn_res_from_torch_equals_the_host_path(torch):
    S, T, d = 5, 7, 256
    src, w = bf16_randn(torch, (S, T, d), seed=9), bf16_randn(torch, (d,), seed=10).float()
    ref = _core._host_attn_res(src.double().numpy(), w.double().numpy(), 1e-6)
    out = kc.attn_res(src.cuda(), w.cuda())
    torch.cuda.synchronize()
    assert bits_equal(out, ref)


def test_bad_cuda_input_names_the_tensor_and_what_is_accepted(torch):
    d = kda_inputs(1, 16, 1, 1, 64, seed=11)
    x = to_dev(torch, d, RAW, torch.bfloat16) | to_dev(torch, d, ("A_log", "bias"), torch.float32)
    gate = dict(A_log=x["A_log"], bias=x["bias"], g_min=d["g_min"], scale=d["scale"])
    args = [x[n] for n in RAW]
    with pytest.raises(kdalab.Error, match=r"tensor 'k' has dtype float32; accepted: bfloat16"):
        kc.kda_prefill(args[0], args[1].float(), *args[2:], **gate)
    with pytest.raises(kdalab.Error, match=r"tensor 'q' is not on a CUDA device .*pass q.cuda\(\)"):
        _core.cuda_kda_prefill(args[0].cpu(), *args[1:], x["A_log"], x["bias"], args[2], None, None,
                               torch.empty(16, dtype=torch.uint8, device="cuda"), g_min=-5.0, scale=1.0)
    v = torch.empty((1, 16, 1, 128), dtype=torch.bfloat16, device="cuda")[..., ::2]
    v.copy_(args[2])
    with pytest.raises(kdalab.Error, match=r"tensor 'v' of shape \[1, 16, 1, 64\] is not C-contiguous"):
        kc.kda_prefill(*args[:2], v, *args[3:], **gate)
    with pytest.raises(kdalab.Error, match=r"tensor 'g' has shape \[1, 16, 1, 32\], expected \[1, 16, 1, 64\]"):
        kc.kda_prefill(*args[:3], args[3][..., :32].contiguous(), args[4], **gate)
    q = args[0][..., :32].contiguous()  # the kernel's own check, before anything is launched
    with pytest.raises(kdalab.Error, match=r"D = 32 is not supported; accepted: D = d_k = d_v in \{64, 128, 256\}"):
        kc.kda_prefill(q, q, *[a[..., :32].contiguous() for a in args[2:4]], args[4],
                       A_log=x["A_log"], bias=x["bias"][:, :32].contiguous(), g_min=-5.0, scale=1.0)


def test_torch_imports_after_kdalab_in_a_fresh_process(torch):
    """`import kdalab` then `import torch` (the order a user's script may take) works in a CUDA build and a CUDA
    tensor can then be made: the CUDA build imports torch before loading its own CUDA libraries."""
    import subprocess
    import sys

    code = "import kdalab, torch; x = torch.ones(4, device='cuda'); print(int(x.sum().item()))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "4"
