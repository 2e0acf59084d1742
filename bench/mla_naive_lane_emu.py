# Lane-level emulation (numpy) of mla_naive_attn_kernel's index math (kernels/mla_prefill/naive.cu; design:
# docs/kernels/mla_prefill.md), PTX fragment
# semantics of mma.m16n8k16 / ldmatrix.trans, vs a direct float64 causal attention. Loads synchronous.
import numpy as np
def bf16(x):
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32).astype(np.float64)
DH, QT, KT, STAGES, NWARP, NTHR = 128, 128, 32, 3, 8, 256
ROW = DH + 8; ARR = KT * ROW
def run(B, T, H, N0, PLO=True, seed=0, break_mask=False):
    rng = np.random.default_rng(seed)
    N = N0 + T
    q = bf16(rng.standard_normal((B, T, H, DH)))
    K = rng.standard_normal((B, N, H, DH)).astype(np.float32).astype(np.float64)
    V = rng.standard_normal((B, N, H, DH)).astype(np.float32).astype(np.float64)
    scale = 1/np.sqrt(128); sl2 = scale*np.log2(np.e)
    # workspace after the split: [which, B, N, H, 256] = hi 128 | lo 128
    kv = np.zeros((2, B, N, H, 256))
    for w, X in enumerate((K, V)):
        hi = bf16(X); lo = bf16(X - hi); kv[w, ..., :128] = hi; kv[w, ..., 128:] = lo
    kvf = kv.reshape(-1); v_off = B*N*H*256
    out = np.full((B, T, H, DH), np.nan)
    sq_t = H*DH; sq_b = T*sq_t; qf = q.reshape(-1)
    def mma(d, a, b):  # d[lane][4], a[lane][4][2], b[lane][2][2]
        A = np.zeros((16, 16)); Bm = np.zeros((16, 8))
        for l in range(32):
            g, t = l//4, l % 4
            A[g, 2*t:2*t+2] = a[l][0]; A[g+8, 2*t:2*t+2] = a[l][1]; A[g, 2*t+8:2*t+10] = a[l][2]; A[g+8, 2*t+8:2*t+10] = a[l][3]
            Bm[2*t:2*t+2, g] = b[l][0]; Bm[2*t+8:2*t+10, g] = b[l][1]
        D = A @ Bm
        for l in range(32):
            g, t = l//4, l % 4
            d[l][0] += D[g, 2*t]; d[l][1] += D[g, 2*t+1]; d[l][2] += D[g+8, 2*t]; d[l][3] += D[g+8, 2*t+1]
    def ldsm_t(smem, addrs):  # addrs[lane] -> r[lane][4][2]
        r = [[None]*4 for _ in range(32)]
        for j in range(4):
            M = np.array([smem[addrs[8*j+rr]:addrs[8*j+rr]+8] for rr in range(8)])
            for l in range(32):
                r[l][j] = (M[2*(l % 4), l//4], M[2*(l % 4)+1, l//4])
        return r
    nq = (T + QT - 1)//QT
    for b in range(B):
      for head in range(H):
        for qt in range(nq):
            q0 = qt*QT; kend = N0 + min(q0+QT, T); ntiles = (kend+KT-1)//KT
            ring = np.full(STAGES*4*ARR, np.nan)
            def load_tile(tile, stage):
                st = stage*4*ARR
                for tid in range(NTHR):
                    for j in range(2*KT*32//NTHR):
                        idx = tid + j*NTHR; which = idx//(KT*32); rem = idx % (KT*32); r = rem//32; ch = rem % 32
                        tok = tile*KT + r
                        dst = st + (2*which + ch//16)*ARR + r*ROW + (ch % 16)*8
                        if tok < kend:
                            src = which*v_off + ((b*N + tok)*H + head)*256 + ch*8
                            ring[dst:dst+8] = kvf[src:src+8]
                        else: ring[dst:dst+8] = 0
            for s in range(STAGES-1):
                if s < ntiles: load_tile(s, s)
            W = []
            for warp in range(NWARP):
                r0 = q0 + 16*warp
                wmax = N0 + min(r0+15, T-1) if r0 < T else -1
                st_ = dict(r0=r0, wmax=wmax, acc=[[np.zeros(4) for _ in range(16)] for _ in range(32)],
                           m=[[-np.inf, -np.inf] for _ in range(32)], l=[[0.0, 0.0] for _ in range(32)], qa=[])
                for l in range(32):
                    g, cq = l//4, l % 4; ra = r0+g; rb = ra+8
                    qb = b*sq_b + head*DH
                    frag = []
                    for ks in range(8):
                        k0 = 16*ks + 2*cq
                        fa = lambda rr, k: tuple(qf[qb + rr*sq_t + k: qb + rr*sq_t + k + 2]) if rr < T else (0.0, 0.0)
                        frag.append([fa(ra, k0), fa(rb, k0), fa(ra, k0+8), fa(rb, k0+8)])
                    st_['qa'].append(frag)
                W.append(st_)
            for it in range(ntiles):
                nxt = it + STAGES - 1
                if nxt < ntiles: load_tile(nxt, nxt % STAGES)
                st = (it % STAGES)*4*ARR
                khi, klo, vhi, vlo = st, st+ARR, st+2*ARR, st+3*ARR
                for warp in range(NWARP):
                    w = W[warp]
                    if it*KT > w['wmax']: continue
                    s = [[np.zeros(4) for _ in range(4)] for _ in range(32)]
                    for ks in range(8):
                        for nt in range(4):
                            bh = []; bl = []
                            for l in range(32):
                                g, cq = l//4, l % 4; off = (8*nt+g)*ROW + 16*ks + 2*cq
                                bh.append((tuple(ring[khi+off:khi+off+2]), tuple(ring[khi+off+8:khi+off+10])))
                                bl.append((tuple(ring[klo+off:klo+off+2]), tuple(ring[klo+off+8:klo+off+10])))
                            a = [w['qa'][l][ks] for l in range(32)]
                            d = [s[l][nt] for l in range(32)]
                            mma(d, a, bh); mma(d, a, bl)
                    mx = np.full((32, 2), -np.inf)
                    for l in range(32):
                        g, cq = l//4, l % 4; ra = w['r0']+g; rb = ra+8
                        posa = N0 + min(ra, T-1); posb = N0 + min(rb, T-1)
                        for nt in range(4):
                            for e in range(4):
                                key = it*KT + 8*nt + 2*cq + (e & 1)
                                ok = key <= ((posa if e < 2 else posb) + (16 if break_mask else 0))
                                s[l][nt][e] = s[l][nt][e]*sl2 if ok else -np.inf
                                mx[l, 0 if e < 2 else 1] = max(mx[l, 0 if e < 2 else 1], s[l][nt][e])
                    for l in range(32):  # quad reduction
                        mx[l] = np.max(mx[(l//4)*4:(l//4)*4+4], axis=0)
                    ph = [None]*32; pl = [None]*32
                    for l in range(32):
                        mn = [max(w['m'][l][0], mx[l, 0]), max(w['m'][l][1], mx[l, 1])]
                        c = [np.exp2(w['m'][l][0]-mn[0]), np.exp2(w['m'][l][1]-mn[1])]
                        w['m'][l] = mn
                        sa = sb = 0.0
                        for nt in range(4):
                            s[l][nt][0:2] = np.exp2(s[l][nt][0:2]-mn[0]); s[l][nt][2:4] = np.exp2(s[l][nt][2:4]-mn[1])
                            sa += s[l][nt][0]+s[l][nt][1]; sb += s[l][nt][2]+s[l][nt][3]
                        w['l'][l] = [w['l'][l][0]*c[0]+sa, w['l'][l][1]*c[1]+sb]
                        for nt in range(16):
                            w['acc'][l][nt][0:2] *= c[0]; w['acc'][l][nt][2:4] *= c[1]
                        ph[l] = []; pl[l] = []
                        for kk in range(2):
                            fr = [s[l][2*kk][0:2], s[l][2*kk][2:4], s[l][2*kk+1][0:2], s[l][2*kk+1][2:4]]
                            ph[l].append([tuple(bf16(x)) for x in fr]); pl[l].append([tuple(bf16(x - bf16(x))) for x in fr])
                    for kk in range(2):
                        for np_ in range(8):
                            addrs = [(16*kk + (l % 8) + 8*((l//8) & 1))*ROW + 16*np_ + 8*(l//16) for l in range(32)]
                            bh = ldsm_t(ring, [vhi + x for x in addrs]); bl = ldsm_t(ring, [vlo + x for x in addrs])
                            a_h = [ph[l][kk] for l in range(32)]; a_l = [pl[l][kk] for l in range(32)]
                            d0 = [w['acc'][l][2*np_] for l in range(32)]; d1 = [w['acc'][l][2*np_+1] for l in range(32)]
                            mma(d0, a_h, [bh[l][0:2] for l in range(32)]); mma(d1, a_h, [bh[l][2:4] for l in range(32)])
                            mma(d0, a_h, [bl[l][0:2] for l in range(32)]); mma(d1, a_h, [bl[l][2:4] for l in range(32)])
                            if PLO:
                                mma(d0, a_l, [bh[l][0:2] for l in range(32)]); mma(d1, a_l, [bh[l][2:4] for l in range(32)])
            for warp in range(NWARP):
                w = W[warp]
                if w['wmax'] < 0: continue
                for l in range(32):
                    g, cq = l//4, l % 4; ra = w['r0']+g; rb = ra+8
                    la = sum(W[warp]['l'][(l//4)*4+i][0] for i in range(4)); lb = sum(W[warp]['l'][(l//4)*4+i][1] for i in range(4))
                    for nt in range(16):
                        col = 8*nt + 2*cq
                        if ra < T: out[b, ra, head, col:col+2] = w['acc'][l][nt][0:2]/la
                        if rb < T: out[b, rb, head, col:col+2] = w['acc'][l][nt][2:4]/lb
    # truth
    ref = np.zeros_like(out)
    for b in range(B):
        for h in range(H):
            S = q[b, :, h] @ K[b, :, h].T * scale
            mask = np.arange(N)[None, :] <= (N0 + np.arange(T))[:, None]
            S = np.where(mask, S, -np.inf); P = np.exp(S - S.max(1, keepdims=True))
            ref[b, :, h] = P @ V[b, :, h] / P.sum(1, keepdims=True)
    return np.sqrt(np.nansum((out-ref)**2)/np.sum(ref**2)), int(np.isnan(out).sum())
import sys
for (B, T, H, N0, PLO, brk) in [(1, 20, 1, 5, True, False), (2, 45, 2, 37, True, False), (1, 150, 1, 3, True, False),
                                 (1, 45, 1, 37, False, False), (1, 45, 1, 37, True, True)]:
    e, nn = run(B, T, H, N0, PLO, break_mask=brk)
    print(f"B={B} T={T} H={H} N0={N0} P_lo={PLO} break_mask={brk}: rel_rms {e:.3e}, NaN outputs {nn}")
