# CPU emulation (numpy) of the naive MLA prefill precision plans vs float64 truth on the same bf16 inputs: the
# table of kernels/mla_prefill.hpp and docs/kernels/mla_prefill.md. Usage: python3 bench/mla_naive_emu.py [SEED]
import numpy as np, sys
def bf16(x):
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32).astype(np.float64)
def f16(x): return np.asarray(x, dtype=np.float64).astype(np.float16).astype(np.float64)
def hilo(x):
    h = bf16(x); return h, bf16(x - h)
rng = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
dc, dn, dv = 512, 128, 128
def case(N0, T, H, sq):
    W_UK = bf16(rng.standard_normal((H, dn, dc)) / np.sqrt(dc))
    W_UV = bf16(rng.standard_normal((H, dv, dc)) / np.sqrt(dc))
    N = N0 + T
    C = bf16(rng.standard_normal((N, dc)))
    q = bf16(sq * rng.standard_normal((T, H, dn)))
    scale = 1 / np.sqrt(dn)
    res = {}
    pos = N0 + np.arange(T)
    mask = np.arange(N)[None, :] <= pos[:, None]
    plans = {
      'bf16 k,v,P (plain FA)': ('b', 'b', 'b'),
      'k hi+lo, v bf16, P bf16': ('hl', 'b', 'b'),
      'k hi+lo, v bf16, P hi+lo': ('hl', 'b', 'hl'),
      'k hi+lo, v hi+lo, P bf16': ('hl', 'hl', 'b'),
      'k hi+lo, v hi+lo, P hi+lo': ('hl', 'hl', 'hl'),
      'k bf16, v bf16, P hi+lo': ('b', 'b', 'hl'),
      'k hi+lo, v fp16, P fp16': ('hl', 'h', 'h'),
      'q,k fp16, v fp16, P fp16': ('h', 'h', 'h'),
    }
    num = {p: 0.0 for p in plans}; den = 0.0
    for i in range(H):
        K = C @ W_UK[i].T; V = C @ W_UV[i].T   # exact-ish (fp32 accumulation ~1e-7)
        S = (q[:, i, :] @ K.T) * scale
        S = np.where(mask, S, -np.inf); m = S.max(1, keepdims=True)
        P = np.exp(S - m); o_true = (P @ V) / P.sum(1, keepdims=True)
        den += (o_true ** 2).sum()
        for name, (kp, vp, pp) in plans.items():
            if kp == 'b': Kr = bf16(K); qq = q[:, i, :]
            elif kp == 'hl': Kr = K; qq = q[:, i, :]  # hi+lo: exact to ~2^-16
            else: Kr = f16(K); qq = f16(q[:, i, :])
            if kp == 'hl': h, l = hilo(K); Kr = h + l
            Sx = (qq @ Kr.T) * scale
            Sx = np.where(mask, Sx, -np.inf); mx = Sx.max(1, keepdims=True)
            Px = np.exp(Sx - mx); l_ = Px.sum(1, keepdims=True)   # l from unrounded (fp32) p
            if pp == 'b': Pr = bf16(Px)
            elif pp == 'hl': h, lo = hilo(Px); Pr = h + lo
            else: Pr = f16(Px)
            if vp == 'b': Vr = bf16(V)
            elif vp == 'hl': h, lo = hilo(V); Vr = h + lo
            else: Vr = f16(V)
            o = (Pr @ Vr) / l_
            num[name] += ((o - o_true) ** 2).sum()
    return {p: np.sqrt(num[p] / den) for p in plans}
for (N0, T, H, sq) in [(0, 300, 4, 1.0), (37, 300, 4, 2.0), (0, 1000, 2, 2.0), (37, 64, 8, 2.0), (0, 1000, 2, 4.0)]:
    r = case(N0, T, H, sq)
    print(f"N0={N0} T={T} H={H} q~{sq}N(0,1) (logit std ~{sq:.0f}):")
    for k, v in r.items(): print(f"   {k:<28} {v:.3e}")
