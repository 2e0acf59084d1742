# Index emulation (numpy) of the accurate KDA state pass's tf32 Qg S (kernels/kda_prefill/state_wgmma.cu,
# kda_state_wg_kernel<true>; design: docs/kernels/kda_prefill.md, "Qg S in tf32 in the kernel"): the prepare's slot
# writes (prepare_phases.cuh store_qg_tf32_perm), the state pass's copy plan into the swizzled stage (CopyPlan), the
# descriptor fetch of B (K-major, 128-byte swizzle: 16-byte chunk c of row r at chunk c ^ (r & 7), a k-step of 8 tf32 =
# 32 bytes inside the row) and the A fragments taken from S^T's m64n128 accumulators (tf32 A layout: a0..a3 = (gq, tq),
# (gq + 8, tq), (gq, tq + 4), (gq + 8, tq + 4)), against a direct S^T Qg^T. --break passes the accumulators in their
# own order (what the kernel would do without the key permutation): the check must then fail.
# Usage: python3 bench/kda_tf32_layout_emu.py [--break]; exit 1 when the products differ.
import sys
import numpy as np
BREAK = '--break' in sys.argv[1:]
rng = np.random.default_rng(1)
Qg = rng.standard_normal((16, 128)).astype(np.float32)       # [token][key]
ST = rng.standard_normal((64, 128)).astype(np.float32)       # S^T [value col m][key]
# prepare: thread i = physical key
A = np.zeros(16 * 64, np.float32); Bv = np.zeros(16 * 64, np.float32)  # main Qg area, lo Qg area (float[16][64])
for i in range(128):
    p8 = i & 7
    L = (i & ~7) | ((4 + (p8 >> 1)) if (p8 & 1) else (p8 >> 1))
    m = A if L < 64 else Bv
    for t in range(16):
        m[t * 64 + (L & 63)] = Qg[t, i]
A = A.view(np.uint8); Bv = Bv.view(np.uint8)
OFF_WQ, OFF_QL = 0, 23552
stage = np.zeros(23552 + 8192, np.uint8)
def sw(r, c): return r * 128 + ((c ^ (r & 7)) << 4)
for tid in range(128):
    r, c = tid // 16, tid % 16
    x = r * 128 + (((c % 8) ^ r) << 4)
    d_wq = (c // 8) * 4096 + x
    d_ql = OFF_QL + (c // 8) * 2048 + x
    for k in (2, 3):
        src = 16 * tid + 2048 * (k - 2)
        dst = d_wq + (k // 2) * 2048 + (k & 1) * 1024
        stage[dst:dst + 16] = A[src:src + 16]
    for k in (0, 1):
        src = 16 * tid + 2048 * k
        dst = d_ql + (k // 2) * 4096 + (k & 1) * 1024
        stage[dst:dst + 16] = Bv[src:src + 16]
sf = stage.view(np.float32)
def fetchB(start, n, k):  # element (k, n) of a K-major SW128 tf32 B tile at descriptor start address `start`, SBO 1024
    base = start & ~1023; off = start - base  # off < 128 inside the first row (k-step advance)
    atom, rr = n // 8, n % 8
    byte = off + 4 * k
    chunk = byte // 16
    addr = base + atom * 1024 + rr * 128 + ((chunk ^ rr) << 4) + (byte % 16)
    return sf[addr // 4]
oT = np.zeros((64, 16), np.float64)
for kt in range(16):
    start = (OFF_WQ + (kt // 4) * 4096 + 2048 + (kt % 4) * 32) if kt < 8 else (OFF_QL + ((kt - 8) // 4) * 2048 + (kt % 4) * 32)
    Bt = np.array([[fetchB(start, n, k) for n in range(16)] for k in range(8)], np.float64)  # [k][n]
    # A fragments: warp w, lane (gq, tq); Sacc[4j+e] = S^T[16w + gq + 8(e>>1)][8j + 2tq + (e&1)]
    At = np.zeros((64, 8))
    for w in range(4):
        for gq in range(8):
            for tq in range(4):
                sacc = lambda e: ST[16 * w + gq + 8 * (e >> 1), 8 * kt + 2 * tq + (e & 1)]
                a = [sacc(0), sacc(1), sacc(2), sacc(3)] if BREAK else [sacc(0), sacc(2), sacc(1), sacc(3)]  # as mma_n16_tf32 gets them
                # tf32 A layout: a0 (gq, tq), a1 (gq+8, tq), a2 (gq, tq+4), a3 (gq+8, tq+4)
                At[16 * w + gq, tq] = a[0]; At[16 * w + gq + 8, tq] = a[1]
                At[16 * w + gq, tq + 4] = a[2]; At[16 * w + gq + 8, tq + 4] = a[3]
    oT += At @ Bt
ref = ST.astype(np.float64) @ Qg.T.astype(np.float64)
err = np.abs(oT - ref).max() / np.abs(ref).max()
w_free = not stage[0:2048].any() and not stage[4096:6144].any()  # the W rows (0..15) of the [W; Qg] blocks untouched
print(f"max |o^T - S^T Qg^T| / max |S^T Qg^T| = {err:.2e}; W rows untouched: {w_free}")
sys.exit(0 if err < 1e-12 and w_free else 1)
