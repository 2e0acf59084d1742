#!/usr/bin/python3
"""Figure: KDA parity error by precision (kdalab parity).

Relative RMS of o against the high-precision truth vs sequence length T, one line per
(implementation, state precision, matmul precision), with the bf16 output floor (1.66e-3), the
kdalab goal (2.0e-3) and the peers (fla 4.0-4.6e-3, FlashKDA 5.6-5.8e-3) of ANCHORS.md.
Reads the table parity/table (or a group "parity" holding the columns directly): columns impl,
T and o_rel_rms (or rel_rms), plus precision or state_precision/matmul_precision when present.
Usage: /usr/bin/python3 scripts/fig_parity.py RESULTS.h5 [--out-dir figures]
"""
import sys

import h5py
import numpy as np

import figstyle as fs
from figstyle import plt


def find_table(f):
    for g in ("parity/table", "parity"):
        if g in f and isinstance(f[g], h5py.Group) and "impl" in f[g] and "T" in f[g]:
            return g
    return None


def main():
    a = fs.parse_args(__doc__.splitlines()[0])
    with h5py.File(a.results, "r") as f:
        g = find_table(f)
        if g is None:
            return fs.skip(f"{a.results} has no parity table with columns impl and T")
        t = fs.table(f, g)
        err_col = "o_rel_rms" if "o_rel_rms" in t else ("rel_rms" if "rel_rms" in t else None)
        if err_col is None:
            return fs.skip(f"{a.results}: {g} has no o_rel_rms / rel_rms column")
        n = len(t["impl"])
        if "precision" in t:
            prec = t["precision"]
        elif "state_precision" in t and "matmul_precision" in t:
            prec = np.array([f"state {s}, matmul {m}" for s, m in zip(t["state_precision"], t["matmul_precision"])])
        else:
            prec = np.array([""] * n)
        labels = np.array([f"{i}" + (f" ({p})" if p else "") for i, p in zip(t["impl"], prec)])
        fig, ax = plt.subplots(figsize=(7.4, 4.0))
        cmap = plt.get_cmap("tab10")
        for k, lab in enumerate(sorted(set(labels.tolist()))):
            sel = labels == lab
            Ts = np.array(sorted(set(t["T"][sel].tolist())))
            med = np.array([np.median(t[err_col][sel][t["T"][sel] == T]) for T in Ts])
            lo = np.array([np.min(t[err_col][sel][t["T"][sel] == T]) for T in Ts])
            hi = np.array([np.max(t[err_col][sel][t["T"][sel] == T]) for T in Ts])
            ax.plot(Ts, np.maximum(med, 1e-18), "-o", ms=3.5, color=cmap(k % 10), label=lab)
            ax.fill_between(Ts, np.maximum(lo, 1e-18), np.maximum(hi, 1e-18), color=cmap(k % 10), alpha=0.15, lw=0)
        for y, txt, c in ((1.66e-3, "bf16 output floor 1.66e-3", "#555555"), (2.0e-3, "kdalab goal 2.0e-3", "#2ca02c"),
                          (4.0e-3, "fla chunk_kda 4.0e-3", "#d62728"), (5.6e-3, "FlashKDA 5.6e-3", "#9467bd")):
            ax.axhline(y, color=c, ls="--", lw=0.8, label=txt)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("sequence length $T$ (tokens)")
        ax.set_ylabel(r"relative RMS error of $o$ vs truth")
        ax.set_title("KDA numeric parity by implementation and precision")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=6.5, frameon=False)
        fs.label_footer(fig, f, "Median over the grid points at each T (band: min to max); an exact 0 is drawn at 1e-18. Truth: the "
                        "high-precision recurrence on the same rounded inputs (anchor-kda, ANCHORS.md).")
        fig.tight_layout()
        return fs.save(fig, a.out_dir, "parity_error")


if __name__ == "__main__":
    sys.exit(main())
