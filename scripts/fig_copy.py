#!/usr/bin/python3
"""Figure: copy accuracy vs string length L with the information bound (kdalab copy).

One panel per state size d_k: exact-copy accuracy vs L for every memory (fp32 solid, bf16 dashed,
fp64 dotted for the recurrent memories; softmax and MLA in fp64), with the information bound of
the fixed d_k x d_v state at each precision (L log2|D| <= state bits) and L = d_k marked. In the bound's panel each
state's lines are named (d_k=..) beside the panel, at its fp32 line, and a dot marks the longest L each recurrent
memory copied in fp32 (dots at one L drawn with figstyle's overlay: an open ring around the one on top).
Curves that lie on each other (every point within 0.016) are drawn with figstyle's overlay (the first underneath with a
large open marker, the others on top with smaller ones, each in its precision's line style) and named in a note under
the panel.
Usage: /usr/bin/python3 scripts/fig_copy.py RESULTS.h5 [--out-dir figures]
"""
import sys

import h5py
import numpy as np

import figstyle as fs
from figstyle import plt

LS = {"fp64": ":", "fp32": "-", "bf16": "--"}
# Two accuracy curves lie on each other when every point differs by less than this (1.5% of the 0..1 axis).
COINCIDE = 0.016


def overlap_text(group):
    """A group of coinciding curves [(memory, precision, ...)] in words, the first (drawn underneath) first:
    "DeltaNet (fp64, fp32, bf16) = linear attention (fp64, fp32)"."""
    order, precs = [], {}
    for mem, prec, *_ in group:
        if mem not in precs:
            order.append(mem)
            precs[mem] = []
        precs[mem].append(prec)
    return " = ".join(f"{fs.LABELS[m]} ({', '.join(precs[m])})" for m in order)


def main():
    a = fs.parse_args(__doc__.splitlines()[0])
    with h5py.File(a.results, "r") as f:
        t = fs.need_table(f, "copy/accuracy", ("d_k", "alphabet", "L", "memory", "precision", "copy_accuracy"),
                          a.results)
        dks = sorted(set(t["d_k"].tolist()))
        D = int(t["alphabet"][0])
        Lmax = int(t["L"].max())
        fig, axes = plt.subplots(1, len(dks) + 1, figsize=(3.0 * (len(dks) + 1), 3.4), squeeze=False)
        for j, dk in enumerate(dks):
            ax = axes[0][j]
            curves = []  # (memory, precision, line style, L, accuracy)
            for mem in fs.COLORS:
                for prec in ("fp64", "fp32", "bf16"):
                    sel = (t["memory"] == mem) & (t["d_k"] == dk) & (t["precision"] == prec)
                    if not sel.any():
                        continue
                    o = np.argsort(t["L"][sel])
                    ls = "-" if mem in ("softmax", "mla") else LS[prec]
                    curves.append((mem, prec, ls, t["L"][sel][o], t["copy_accuracy"][sel][o].astype(float)))
            # Curves that lie on each other (e.g. DeltaNet on linear attention, every precision of one memory) are
            # drawn with figstyle's overlay (first underneath, large open marker; the others smaller on top; each
            # keeps its precision's line style) and named in a note under the panel.
            groups = fs.overlay_groups([(c[3], c[4]) for c in curves], rel=0.0, abs_tol=COINCIDE)
            for g in groups:
                for rank, k in enumerate(g):
                    mem, prec, ls, L, acc = curves[k]
                    style = fs.overlay_style(rank, len(g), fs.COLORS[mem], ls, ms=2.5, lw=1.5)
                    style["ls"] = ls
                    ax.plot(L, acc, color=fs.COLORS[mem], label=f"{fs.LABELS[mem]} {prec}", **style)
            same = [overlap_text([curves[k] for k in g]) for g in groups if len(g) > 1]
            if same:
                fs.panel_note(ax, "Lie on each other (drawn on top, smaller markers): " + "; ".join(same) + ".")
            ax.axvline(dk, color="#444444", lw=0.8, ls=":")
            # the label sits above the panel's frame, over the top of its dotted line, where no curve can cover it
            # (at mid-height left of the line the d_k = 16 panel's curves run over it)
            ax.text(dk, 1.0, "$L = d_k$", transform=ax.get_xaxis_transform(), va="bottom", ha="center", fontsize=7,
                    color="#444444")
            ax.set_xscale("log", base=2)
            ax.set_ylim(-0.03, 1.03)
            ax.set_title(f"state $d_k = d_v = {dk}$", pad=13)  # room for the "L = d_k" label under the title
            ax.set_xlabel("string length $L$ (tokens)")
            if j == 0:
                ax.set_ylabel("exact-copy accuracy (strings)")
            else:
                ax.set_yticklabels([])
        # The information bound, beside: bits a copy needs vs bits each fixed state holds.
        ax = axes[0][-1]
        Ls = np.logspace(0, np.log2(max(Lmax, 2) * 256), 60, base=2)
        ax.plot(Ls, Ls * np.log2(D), color="#b22222", lw=1.5, label=f"needed: $L \\log_2 {D}$")
        for dk in dks:
            for prec, bits in (("fp32", 32), ("bf16", 16)):
                ax.axhline(dk * dk * bits, color="#555555", lw=0.7, ls=LS[prec])
            # named beside the panel at the height of its fp32 line, where no line runs (inside, over the lines'
            # left ends, each name would be struck through by the next state's bf16 line, a factor 2 above)
            ax.annotate(f"$d_k$={dk}", xy=(1.0, dk * dk * 32), xycoords=("axes fraction", "data"), xytext=(3, 0),
                        textcoords="offset points", ha="left", va="center", fontsize=6.5, color="#555555",
                        annotation_clip=False)
            dots = []  # (memory, longest L copied in fp32)
            for mem in ("linear", "deltanet", "kda"):
                sel = (t["memory"] == mem) & (t["d_k"] == dk) & (t["precision"] == "fp32") & (t["copy_accuracy"] >= 0.9)
                if sel.any():
                    dots.append((mem, t["L"][sel].max()))
            # dots at the same L lie on each other (linear attention under DeltaNet): figstyle's overlay keeps each visible
            for g in fs.overlay_groups([([Lc], [0.0]) for _, Lc in dots], rel=0.0, abs_tol=0.0):
                for rank, k in enumerate(g):
                    mem, Lc = dots[k]
                    style = fs.overlay_style(rank, len(g), fs.COLORS[mem], ls="none", ms=4)
                    style["ms"] = min(style["ms"], 7.0)
                    ax.plot([Lc], [dk * dk * 32], color=fs.COLORS[mem], label="_" + fs.LABELS[mem] + " longest L", **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("string length $L$ (tokens)")
        ax.set_ylabel("bits")
        ax.set_title("information bound")
        ax.legend(loc="lower right", fontsize=6.5)
        from matplotlib.lines import Line2D
        handles = [Line2D([], [], color=fs.COLORS[m], marker="o", ms=3, label=fs.LABELS[m])
                   for m in fs.COLORS if (t["memory"] == m).any()]
        handles += [Line2D([], [], color="#333333", ls=LS[p], label=p) for p in ("fp64", "fp32", "bf16")]
        fig.legend(handles=handles, loc="upper center", ncol=len(handles), bbox_to_anchor=(0.5, 1.04), frameon=False,
                   fontsize=7)
        fig.suptitle(f"Copying a string over |D| = {D} symbols through a fixed state vs a growing cache", y=1.1)
        fs.label_footer(fig, f, "Untrained memories: position keys (" + fs.attr(f["copy"], "keys", "?") + "), "
                        "symbol values, read back in order. Information bound (Repeat After Me): a state of b bits "
                        "cannot copy strings with L log2|D| > b; the recurrent state holds d_k d_v numbers, softmax "
                        "and MLA caches grow with L. Dotted black: L = d_k. Right: bits needed (red) vs bits held by a d_k x d_k state in fp32 (solid) / bf16 (dashed); dots: the longest L copied exactly (>= 90%) in fp32, in the memory's colour (an open ring around a dot: two memories at the same L).")
        fig.tight_layout()
        return fs.save(fig, a.out_dir, "copy_accuracy")


if __name__ == "__main__":
    sys.exit(fs.run(main))
