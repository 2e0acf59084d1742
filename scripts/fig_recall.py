#!/usr/bin/python3
"""Figure: associative-recall capacity curves (kdalab recall).

Accuracy and relative read error vs N / d_k for every memory, one column per key embedding, at one
d_k (64 if present), beta = 1, g_min = -5 (if present), MLA latent d_c = d_k + d_v (solid) and
(d_k + d_v) / 2 (dashed). Reference curve: linear attention's sqrt(N / d_k) crosstalk.
Usage: /usr/bin/python3 scripts/fig_recall.py RESULTS.h5 [--out-dir figures]
"""
import sys

import h5py
import numpy as np

import figstyle as fs
from figstyle import plt


def main():
    a = fs.parse_args(__doc__.splitlines()[0])
    with h5py.File(a.results, "r") as f:
        if "recall/capacity" not in f:
            return fs.skip(f"{a.results} has no recall/capacity table")
        t = fs.table(f, "recall/capacity")
        dks = sorted(set(t["d_k"].tolist()))
        dk = 64 if 64 in dks else max(dks)
        gmins = sorted(set(t["g_min"][t["g_min"] < 0].tolist()))
        gm = -5.0 if -5.0 in gmins else (gmins[0] if gmins else 0.0)
        keymodes = [k for k in ("random", "orthogonal", "correlated") if k in set(t["keys"].tolist())]
        fig, axes = plt.subplots(2, len(keymodes), figsize=(3.4 * len(keymodes), 6.4), squeeze=False, sharex=True,
                                 gridspec_kw={"height_ratios": [1, 1.5]})
        for j, km in enumerate(keymodes):
            ax_a, ax_e = axes[0][j], axes[1][j]
            for mem in fs.COLORS:
                base = (t["keys"] == km) & (t["d_k"] == dk) & (t["memory"] == mem)
                if mem in ("deltanet", "gated_deltanet", "kda"):
                    base &= t["beta"] == 1.0
                if mem in ("gla", "gated_deltanet", "kda"):
                    base &= t["g_min"] == gm
                variants = [(base, "-", fs.LABELS[mem])]
                if mem == "mla":
                    variants = [(base & (t["d_c"] == 2 * dk), "-", "MLA, $d_c = d_k + d_v$"),
                                (base & (t["d_c"] == dk), "--", "MLA, $d_c = (d_k + d_v)/2$")]
                for sel, ls, lab in variants:
                    if not sel.any():
                        continue
                    o = np.argsort(t["ratio"][sel])
                    x = t["ratio"][sel][o]
                    ls = "--" if mem == "linear" and ls == "-" else ls
                    ax_a.plot(x, t["accuracy"][sel][o], ls, marker="o", ms=3, color=fs.COLORS[mem], label=lab)
                    ax_e.plot(x, np.maximum(t["rel_err"][sel][o], 1e-17), ls, marker="o", ms=3, color=fs.COLORS[mem])
            if km == "random":
                xx = np.logspace(np.log10(1 / 8), np.log10(8), 50)
                ax_e.plot(xx, np.sqrt(xx), ":", color=fs.COLORS["linear"], lw=1.2, label=r"$\sqrt{N/d_k}$")
                ax_e.legend(loc="center right")
            ax_a.axvline(1.0, color="#999999", lw=0.8, ls=":")
            ax_e.axvline(1.0, color="#999999", lw=0.8, ls=":")
            title = {"random": "random unit keys", "orthogonal": "orthogonal keys (blocks of $d_k$)",
                     "correlated": f"correlated keys (overlap {f['recall'].attrs.get('overlap', '?')})"}[km]
            ax_a.set_title(title)
            ax_a.set_xscale("log", base=2)
            ax_a.set_ylim(-0.03, 1.03)
            ax_e.set_yscale("log")
            ax_e.set_ylim(1e-17, 10)
            ax_e.set_xlabel("pairs per key dimension  $N / d_k$")
            if j == 0:
                ax_a.set_ylabel("recall accuracy (nearest value)")
                ax_e.set_ylabel(r"relative read error $\|o - v\| / \|v\|$")
        h, lab = axes[0][0].get_legend_handles_labels()
        fig.legend(h, lab, loc="upper center", ncol=4, bbox_to_anchor=(0.5, 0.965), frameon=False)
        fig.suptitle(f"Associative recall without training: mechanistic capacity at $d_k = d_v = {dk}$, "
                     f"$\\beta = 1$, $g_{{\\min}} = {gm:g}$", y=1.0)
        fs.label_footer(fig, f, "Mechanistic capacity of untrained memories on Zoology-style MQAR sequences "
                        "(not Zoology's trained-model curves). Delta rule with beta=1 is exact up to d_k orthonormal "
                        "keys; linear attention's error grows like sqrt(N/d); softmax (inverse temperature "
                        f"{f['recall'].attrs.get('softmax_scale', '?')}) stays exact.")
        fig.tight_layout(rect=(0, 0, 1, 0.9))
        return fs.save(fig, a.out_dir, "recall_capacity")


if __name__ == "__main__":
    sys.exit(main())
