#!/usr/bin/python3
"""Figure: the hybrid's attention speedup over an all-MLA stack vs context and batch (kdalab decode-cost).

Left: attention time per generated token at batch 1 vs context n (the layout of Kimi Linear's Fig. 1b, TPOT vs
decoding length, for the attention layers only): each layout's memory-bound model, the kernels' measured times on the
GPU when the file has them, and the paper's whole-model TPOTs at 1M for scale. Middle: attention cost per token,
all-MLA / hybrid, vs context n for the Kimi Linear 48B and K3
layouts, with each layout's limit L / L_MLA (27/7; the K3 layout's 93/24 at --k3-layers 93) and the reported
6.24x (1.84 vs 11.48 ms at 1M) and ~2.2x at batch 1. Right: the largest batch whose caches and states fit the memory budget vs n.
Usage: /usr/bin/python3 scripts/fig_hybrid.py RESULTS.h5 [--out-dir figures]
"""
import sys

import h5py
import numpy as np

import figstyle as fs
from figstyle import plt

STYLE = {"kimi-linear-48b": ("#2ca02c", "Kimi Linear 48B (20 KDA + 7 MLA)"),
         "kimi-k3": ("#1f77b4", "K3 layout (3:1 + final MLA; layer count illustrative)")}


def layout_label(lay):
    """The prose legend label of a decode_cost/hybrid `layout` (both panels use these, never the internal names):
    a hybrid's from STYLE; "all-mla-27" is the Kimi Linear 48B shapes with every layer MLA, "all-mla-<L>" the K3
    shapes with every layer MLA; any other layout keeps its name."""
    if lay in STYLE:
        return STYLE[lay][1]
    if lay == "all-mla-27":
        return "all-MLA, Kimi Linear 48B shapes (27 MLA)"
    if lay.startswith("all-mla-") and lay[len("all-mla-"):].isdigit():
        return f"all-MLA, K3 shapes ({lay[len('all-mla-'):]} MLA; layer count illustrative)"
    return lay


def layout_style(lay):
    """(colour, line style) of a layout's curve in the left and right panels: a hybrid solid in its STYLE colour, an
    all-MLA stack dashed in the colour of the hybrid with its shapes (all-mla-27: Kimi Linear 48B; other all-mla-<L>: K3)."""
    col = STYLE.get(lay, ("#7f7f7f", lay))[0]
    if lay == "all-mla-27":
        col = STYLE["kimi-linear-48b"][0]
    elif lay.startswith("all-mla"):
        col = STYLE["kimi-k3"][0]
    return col, "--" if lay.startswith("all-mla") else "-"


def main():
    a = fs.parse_args(__doc__.splitlines()[0])
    with h5py.File(a.results, "r") as f:
        h = fs.need_table(f, "decode_cost/hybrid", ("layout", "batch_kind", "n", "speedup_vs_mla", "batch",
                                                     "seconds_per_token"), a.results)
        at = f["decode_cost/hybrid"].attrs
        fig, axes = plt.subplots(1, 3, figsize=(12.9, 4.3))  # 4.3 in: room for the right panel's legend below it
        g = fs.optional_table(f, "decode_cost/gpu", ("n", "speedup_48b", "hybrid_48b_s", "all_mla_27_s"))
        ax = axes[0]
        for lay in sorted(set(h["layout"].tolist())):
            sel = (h["layout"] == lay) & (h["batch_kind"] == "one")
            if not sel.any():
                continue
            o = np.argsort(h["n"][sel])
            col, ls = layout_style(lay)
            ax.plot(h["n"][sel][o], 1e3 * h["seconds_per_token"][sel][o], ls=ls, color=col, lw=1.2,
                    label=layout_label(lay) + " (model)")
        if g is not None:
            o = np.argsort(g["n"])
            ax.plot(g["n"][o], 1e3 * g["hybrid_48b_s"][o], "o", ms=4, mfc="none", color=STYLE["kimi-linear-48b"][0],
                    label="Kimi Linear 48B, measured kernels on the %s" % fs.gpu_name(f))
            ax.plot(g["n"][o], 1e3 * g["all_mla_27_s"][o], "s", ms=4, mfc="none", color="#7f7f7f",
                    label="all-MLA 27, measured kernels on the %s" % fs.gpu_name(f))
        # the paper's TPOTs at 1M (whole model, its batch): the scale the attention-only curves sit under
        ax.plot([1 << 20], [11.48], "v", ms=6, color="#d62728", label="reported TPOT at 1M, MLA model (11.48 ms)")
        ax.plot([1 << 20], [1.84], "^", ms=6, color="#d62728", mfc="none",
                label="reported TPOT at 1M, Kimi Linear (1.84 ms)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("context $n$ (tokens)")
        ax.set_ylabel("attention time per token (ms), batch 1")
        ax.set_title("Time per output token vs context (attention only)")
        # below the panel, as the right panel's: inside, every corner has a curve or the 1M markers
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.17), fontsize=6.0, frameon=False)
        ax = axes[1]
        for lay, (col, _) in STYLE.items():
            lab = layout_label(lay)
            sel = (h["layout"] == lay) & (h["batch_kind"] == "one")
            if not sel.any():
                continue
            o = np.argsort(h["n"][sel])
            ax.plot(h["n"][sel][o], h["speedup_vs_mla"][sel][o], "-o", ms=3, color=col, label=lab)
        if g is not None:
            o = np.argsort(g["n"])
            ax.plot(g["n"][o], g["speedup_48b"][o], "s", ms=5, mfc="none", color="#2ca02c",
                    label="Kimi Linear 48B, measured on the %s (batch 1)" % fs.gpu_name(f))
        ax.axhline(27 / 7, color="#2ca02c", ls=":", lw=0.9)
        ax.text(1.1e3, 27 / 7 * 1.05, "limit 27/7 = 3.86x", fontsize=6.5, color="#2ca02c")
        # the K3 layout's limit L / L_MLA (93/24 at the default --k3-layers 93: 23 blocks of 3 KDA + 1 MLA and the
        # final MLA), from the file; it sits just above 27/7, so its label goes below the lines, where the curves
        # are still low (older files lack the attributes: no line)
        L, M = int(at.get("k3_layers", 0)), int(at.get("k3_mla_layers", 0))
        if L > 0 and M > 0:
            ax.axhline(L / M, color=STYLE["kimi-k3"][0], ls=(0, (1, 3)), lw=0.9)
            ax.text(1.1e3, L / M * 0.94, f"K3 limit {L}/{M} = {L / M:.2f}x (layer count illustrative)", fontsize=6.5,
                    color=STYLE["kimi-k3"][0], va="top")
        rep = float(at.get("reported_speedup", 11.48 / 1.84))
        rep1 = float(at.get("reported_speedup_batch1", 2.2))
        ax.axhline(rep, color="#d62728", ls="--", lw=1)
        ax.text(1.1e3, rep * 1.03, f"reported at 1M: 11.48 / 1.84 ms = {rep:.2f}x (larger batch)", fontsize=6.5,
                color="#d62728")
        ax.axhline(rep1, color="#ff7f0e", ls="--", lw=1)
        ax.text(1.1e3, rep1 * 1.03, f"reported at batch 1: ~{rep1:.1f}x", fontsize=6.5, color="#ff7f0e")
        ax.set_xscale("log")
        ax.set_ylim(0, max(rep * 1.15, 4.5))
        ax.set_xlabel("context $n$ (tokens)")
        ax.set_ylabel("attention speedup per token (all-MLA / hybrid)")
        ax.set_title("Attention reads per token, any batch")
        # between the 27/7 limit and the reported 6.24x line, where no curve goes (lower right, it touched the K3
        # curve near n ~ 1e4)
        ax.legend(loc="center left", bbox_to_anchor=(0.0, 0.71), fontsize=6.5)
        ax = axes[2]
        for lay in sorted(set(h["layout"].tolist())):
            sel = (h["layout"] == lay) & (h["batch_kind"] == "max")
            o = np.argsort(h["n"][sel])
            col, ls = layout_style(lay)
            mk = dict(marker="s", mfc="none", ms=4) if lay.startswith("all-mla") else dict(marker="o", ms=3)
            ax.plot(h["n"][sel][o], np.maximum(h["batch"][sel][o], 0.5), ls=ls, color=col, label=layout_label(lay), **mk)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("context $n$ (tokens)")
        ax.set_ylabel("largest batch fitting the budget")
        ax.set_title(f"Batch under {float(at.get('memory_gb', 100)):.0f} GB of caches + states")
        # the legend below the panel, under its x label: inside (upper right) it covered the Kimi Linear curve near
        # n ~ 1e4, and the curves run from the upper left to the lower right, leaving no corner free
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.17), fontsize=6.5, frameon=False)
        fig.suptitle("Hybrid vs all-MLA decode: attention time per token, its ratio, and the batch each can hold", y=1.02)
        fs.label_footer(fig, f, "Memory-bound model at " + f"{float(at.get('bandwidth_gbs', 0)):.0f} GB/s: MLA reads "
                        "n (d_c + d_r) bf16 per layer, KDA reads and writes its fp32 state. " + fs.attr(f["decode_cost/hybrid"], "bound"))
        fig.tight_layout()
        return fs.save(fig, a.out_dir, "hybrid_speedup")


if __name__ == "__main__":
    sys.exit(fs.run(main))
