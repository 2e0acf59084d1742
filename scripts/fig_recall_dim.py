#!/usr/bin/python3
"""Figure: associative-recall accuracy vs model dimension at a fixed number of pairs (kdalab recall).

The layout of Zoology's MQAR figure (accuracy vs model dimension, one panel per number of key-value pairs N, one
curve per memory): accuracy vs d_k (= d_v) at fixed N, read from the recall grid's points with N = ratio x d_k, random
unit keys, beta = 1, g_min = -5 (if present), MLA with d_c = d_k + d_v (solid) and (d_k + d_v) / 2 (dashed). Panels:
the (up to three) N with the most d_k points (ties: the larger N), at least two each. Softmax attention recalls at any d_k; memories with a
fixed state need d_k growing with N (Zoology, Arora et al. 2023). Mechanistic capacity without training, float64.
Curves that lie on each other are drawn with figstyle's overlay, as in fig_recall.py.
Usage: /usr/bin/python3 scripts/fig_recall_dim.py RESULTS.h5 [--out-dir figures] [--dump FILE.json]
"""
import sys

import h5py
import numpy as np

import figstyle as fs
from figstyle import plt


def main():
    a = fs.parse_args(__doc__.splitlines()[0])
    with h5py.File(a.results, "r") as f:
        t = fs.need_table(f, "recall/capacity", ("d_k", "N", "g_min", "keys", "memory", "beta", "d_c", "accuracy"),
                          a.results)
        km = "random" if "random" in set(t["keys"].tolist()) else None
        if km is None:
            return fs.skip(f"{a.results}: recall/capacity has no rows with random keys")
        rnd = t["keys"] == km
        gmins = sorted(set(t["g_min"][t["g_min"] < 0].tolist()))
        gm = -5.0 if -5.0 in gmins else (gmins[0] if gmins else 0.0)
        # the N with the most distinct d_k (ties: the larger N, the harder task), at least two d_k each
        counts = {}
        for n in sorted(set(t["N"][rnd].tolist())):
            counts[n] = len(set(t["d_k"][rnd & (t["N"] == n)].tolist()))
        Ns = sorted([n for n in counts if counts[n] >= 2], key=lambda n: (-counts[n], -n))[:3]
        if not Ns:
            return fs.skip(f"{a.results}: recall/capacity has no N with two or more d_k (random keys)")
        Ns = sorted(Ns)
        fig, axes = plt.subplots(1, len(Ns), figsize=(3.5 * len(Ns) + 0.4, 3.6), squeeze=False, sharey=True)
        for j, n in enumerate(Ns):
            ax = axes[0][j]
            curves = []  # (memory, label, line style, d_k, accuracy)
            for mem in fs.COLORS:
                base = rnd & (t["N"] == n) & (t["memory"] == mem)
                for sel, ls, lab in fs.recall_variants(t, base, mem, gm, t["d_k"]):
                    if not sel.any():
                        continue
                    o = np.argsort(t["d_k"][sel])
                    ls = "--" if mem == "linear" and ls == "-" else ls
                    curves.append((mem, lab, ls, t["d_k"][sel][o].astype(float), t["accuracy"][sel][o].astype(float)))
            hidden = []
            for g in fs.overlay_groups([(c[3], c[4]) for c in curves], rel=0.0, abs_tol=0.015 * 1.06):
                for rank, k in enumerate(g):
                    mem, lab, ls, x, y = curves[k]
                    ln, = ax.plot(x, y, color=fs.COLORS[mem], **fs.overlay_style(rank, len(g), fs.COLORS[mem], ls, ms=3,
                                                                                  lw=1.5))
                    ln.set_label(lab if j == 0 else "_" + lab)
                    if rank > 0:
                        hidden.append((ln, f"{lab}: {fs.lies_on(curves[g[0]][1])}"))
            if hidden:
                ax.legend(*zip(*hidden), loc="lower right", fontsize=6)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("model dimension  $d_k = d_v$")
            ax.set_ylim(-0.03, 1.03)
            ax.set_title(f"N = {int(n)} key-value pairs")
            ax.axhline(1.0, color="#999999", lw=0.6, ls=":")
        axes[0][0].set_ylabel("recall accuracy (nearest value)")
        handles, labels = axes[0][0].get_legend_handles_labels()
        # one legend for the figure, right of the panels (below them it ran into the footer)
        fig.legend(handles, labels, loc="center left", fontsize=6.5, frameon=False, bbox_to_anchor=(1.0, 0.55))
        fig.suptitle(f"Associative recall vs model dimension at fixed N ({km} unit keys, beta = 1, float64, no training)",
                     y=1.03)
        fs.label_footer(fig, f, "Points are the recall grid's cells with N = ratio x d_k (recall/capacity); "
                        "softmax attention keeps every pair at any d_k, fixed-state memories need d_k growing with N.")
        fig.tight_layout()
        return fs.save(fig, a.out_dir, "recall_dim")


if __name__ == "__main__":
    sys.exit(fs.run(main))
