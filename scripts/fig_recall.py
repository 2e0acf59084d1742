#!/usr/bin/python3
"""Figure: associative-recall capacity curves (kdalab recall).

Accuracy and relative read error vs N / d_k for every memory (float64 arithmetic, said in the title), one column per
key embedding, at one d_k (64 if present), beta = 1, g_min = -5 (if present), MLA latent d_c = d_k + d_v (solid) and
(d_k + d_v) / 2 (dashed). Reference curve: linear attention's sqrt(N / d_k) crosstalk (brown, dash-dot, drawn above
the curves: linear attention's own dashed curve follows it closely).
Error axis: log, from just below the smallest error >= EXACT_BELOW (1e-8) to just above the largest (never
clipped). A read error below 1e-8 (an exact 0, or float64 rounding at 1e-16..1e-10: the memory recalls
exactly) is not put on that axis (it would stretch it to 1e-17 and squeeze the curves into a sliver): it is
marked in the strip "exact" under the error panel, one row per memory, in the memory's colour.
Curves that lie on each other in a panel (every point within 1.5% of the panel's height: e.g. DeltaNet and Gated
DeltaNet on orthogonal keys) are drawn with figstyle's overlay (the first underneath, large open marker; the others on top,
smaller markers, broken lines) and the panel's legend says which lies on which.
Usage: /usr/bin/python3 scripts/fig_recall.py RESULTS.h5 [--out-dir figures] [--dump FILE.json]
"""
import sys

import h5py
import matplotlib.ticker as mticker
import numpy as np

import figstyle as fs
from figstyle import plt

# A relative read error below this is exact recall for every purpose here (float64 rounding is ~1e-16,
# float32's epsilon 1.2e-7): marked in the "exact" strip instead of drawn on the log error axis.
EXACT_BELOW = 1e-8
# Two curves lie on each other when every point differs by less than this fraction of the panel's height (markers
# of 3 pt on a panel ~140 pt high: within 1.5% they cover each other).
ACC_COINCIDE = 0.015
# The sqrt(N / d_k) reference line: a colour no memory has (figstyle.COLORS), dash-dot, drawn above the curves.
REF_COLOR = "#8c564b"


def draw_overlaid(ax, curves, ys, tol, to_axis, legend):
    """Draws the curves (memory, label, line style, x, ...) with the y values `ys` into `ax`, grouping those that
    lie on each other (every point within `tol` after `to_axis`: identity on a linear axis, log10 on a log one) with
    figstyle's overlay. The line of an accuracy panel (`legend` True) carries its label, others "_<label>".
    Returns [(line, "<label>: lies on <label>")] for every curve drawn on top of another."""
    hidden = []
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = [to_axis(np.asarray(y, dtype=float)) for y in ys]
    for g in fs.overlay_groups([(c[3], y) for c, y in zip(curves, scaled)], rel=0.0, abs_tol=tol):
        for rank, k in enumerate(g):
            mem, lab, ls, x = curves[k][:4]
            ln, = ax.plot(x, ys[k], color=fs.COLORS[mem], **fs.overlay_style(rank, len(g), fs.COLORS[mem], ls, ms=3, lw=1.5))
            ln.set_label(lab if legend else "_" + lab)
            if rank > 0:
                hidden.append((ln, f"{lab}: {fs.lies_on(curves[g[0]][1])}"))
    return hidden


def main():
    a = fs.parse_args(__doc__.splitlines()[0])
    with h5py.File(a.results, "r") as f:
        t = fs.need_table(f, "recall/capacity", ("d_k", "g_min", "keys", "memory", "beta", "d_c", "ratio", "accuracy",
                                                  "rel_err"), a.results)
        dks = sorted(set(t["d_k"].tolist()))
        dk = 64 if 64 in dks else max(dks)
        gmins = sorted(set(t["g_min"][t["g_min"] < 0].tolist()))
        gm = -5.0 if -5.0 in gmins else (gmins[0] if gmins else 0.0)
        keymodes = [k for k in ("random", "orthogonal", "correlated") if k in set(t["keys"].tolist())]
        if not keymodes:
            return fs.skip(f"{a.results}: recall/capacity has no rows with keys random, orthogonal or correlated")
        fig, axes = plt.subplots(3, len(keymodes), figsize=(3.4 * len(keymodes), 7.0), squeeze=False, sharex=True,
                                 gridspec_kw={"height_ratios": [1, 1.3, 0.42]})
        err_lo, err_hi = np.inf, 0.0  # the smallest error >= EXACT_BELOW and the largest, over every panel
        legend_style = {}  # label -> (colour, line style): the figure legend names every memory once
        overlays = {}  # id(accuracy axes) -> [(line, "<label>: lies on <label>")] for the curves drawn on top of another
        panels, extras = [], {}  # the error panels, drawn after the loop; their legend entries besides the overlays
        for j, km in enumerate(keymodes):
            ax_a, ax_e, ax_x = axes[0][j], axes[1][j], axes[2][j]
            curves = []  # (memory, label, line style, x, accuracy, error), in the legend's order
            for mem in fs.COLORS:
                base = (t["keys"] == km) & (t["d_k"] == dk) & (t["memory"] == mem)
                for sel, ls, lab in fs.recall_variants(t, base, mem, gm, dk):
                    if not sel.any():
                        continue
                    o = np.argsort(t["ratio"][sel])
                    ls = "--" if mem == "linear" and ls == "-" else ls
                    curves.append((mem, lab, ls, t["ratio"][sel][o], t["accuracy"][sel][o].astype(float),
                                   t["rel_err"][sel][o].astype(float)))
                    if lab not in legend_style:
                        legend_style[lab] = (fs.COLORS[mem], ls)
            errs = [np.where(c[5] < EXACT_BELOW, np.nan, c[5]) for c in curves]  # the line breaks where it is exact
            # Curves that lie on each other (e.g. Gated DeltaNet on DeltaNet on orthogonal keys: both recall exactly
            # up to d_k pairs) are drawn visibly apart and the panel's legend says which lies on which; the error
            # panels are drawn below, once their common scale is known.
            overlays[id(ax_a)] = draw_overlaid(ax_a, curves, [c[4] for c in curves], ACC_COINCIDE * 1.06, lambda y: y,
                                               legend=True)
            panels.append((ax_e, curves, errs))
            for c, e in zip(curves, errs):
                if np.isfinite(e).any():
                    err_lo = min(err_lo, float(np.nanmin(e)))
                    err_hi = max(err_hi, float(np.nanmax(e)))
            for row, (mem, lab, ls, x, acc, err) in enumerate(curves):  # the "exact" strip: one row per curve
                exact = err < EXACT_BELOW
                ax_x.plot(x[exact], np.full(int(exact.sum()), row), "v", ms=4, mfc="none", mew=0.9,
                          color=fs.COLORS[mem], label="_" + lab + " exact")
            row = len(curves)
            extra = []
            if km == "random":
                xx = np.logspace(np.log10(1 / 8), np.log10(8), 50)
                # its own colour and dash-dot style, above every curve (zorder 3 > the curves' 2): drawn in the linear
                # attention colour, dotted, it was hidden under linear attention's dashes, which follow it closely
                ref, = ax_e.plot(xx, np.sqrt(xx), "-.", color=REF_COLOR, lw=1.5, zorder=3, label=r"$\sqrt{N/d_k}$")
                extra = [(ref, r"$\sqrt{N/d_k}$")]
            if overlays[id(ax_a)]:  # the curves drawn on top of another, in their own (smaller, broken) style
                ax_a.legend(*zip(*overlays[id(ax_a)]), loc="best", fontsize=6)
            extras[id(ax_e)] = extra
            for ax in (ax_a, ax_e, ax_x):
                ax.axvline(1.0, color="#999999", lw=0.8, ls=":")
            title = {"random": "random unit keys", "orthogonal": "orthogonal keys (blocks of $d_k$)",
                     "correlated": f"correlated keys (overlap {f['recall'].attrs.get('overlap', '?')})"}[km]
            ax_a.set_title(title)
            ax_a.set_xscale("log", base=2)
            ax_a.set_ylim(-0.03, 1.03)
            ax_e.set_yscale("log")
            ax_x.set_ylim(row - 0.4, -0.6)  # first memory on top, as in the legend
            ax_x.set_yticks([])
            ax_x.grid(axis="y", visible=False)
            ax_x.set_xlabel("pairs per key dimension  $N / d_k$")
            if j == 0:
                ax_a.set_ylabel("recall accuracy (nearest value)")
                ax_e.set_ylabel(r"relative read error $\|o - v\| / \|v\|$")
                ax_x.set_ylabel(f"exact\n(< {EXACT_BELOW:.0e})", fontsize=7.5)
        # One error scale for every panel, from the data: a third of a decade of room either side (the largest,
        # linear attention's ~15 on correlated keys, is never clipped).
        if err_hi > 0:
            for ax_e in axes[1]:
                ax_e.set_ylim(err_lo / 10 ** 0.35, err_hi * 10 ** 0.35)
                if err_hi / err_lo < 1e4:  # a few decades: label 1-2-5 ticks (0.2, 0.5, 1, 2, ...), not only powers of 10
                    ax_e.yaxis.set_major_locator(mticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
                    ax_e.yaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"))
                    ax_e.yaxis.set_minor_formatter(mticker.NullFormatter())
        # Error curves within ACC_COINCIDE of the panel's height (in decades) of each other lie on each other.
        decades = np.log10(err_hi / err_lo) + 0.7 if err_hi > 0 else 1.0
        for ax_e, curves, errs in panels:
            hidden = draw_overlaid(ax_e, curves, errs, ACC_COINCIDE * decades, np.log10, legend=False)
            if hidden or extras[id(ax_e)]:
                ax_e.legend(*zip(*(hidden + extras[id(ax_e)])), loc="lower right", fontsize=6)
        ratios = sorted(set(t["ratio"][t["d_k"] == dk].tolist()))
        for ax in axes[2]:
            ax.set_xticks(ratios)
        from matplotlib.lines import Line2D
        h = [Line2D([], [], color=c, ls=ls, marker="o", ms=3) for c, ls in legend_style.values()]
        fig.legend(h, list(legend_style), loc="upper center", ncol=4, bbox_to_anchor=(0.5, 0.97), frameon=False)
        # the arithmetic the memories ran in: a `precision` column when the file has one, else float64 (kdalab recall
        # runs every memory through run_memory's default, fp64: experiments/memory_task.hpp)
        prec = ", ".join(sorted(set(t["precision"].tolist()))) if "precision" in t else "float64"
        fig.suptitle(f"Associative recall without training: mechanistic capacity at $d_k = d_v = {dk}$, "
                     f"$\\beta = 1$, $g_{{\\min}} = {gm:g}$, {prec}", y=1.0)
        fs.label_footer(fig, f, "Mechanistic capacity of untrained memories on Zoology-style MQAR sequences "
                        "(not Zoology's trained-model curves). Delta rule with beta=1 is exact up to d_k orthonormal "
                        "keys; linear attention's error grows like sqrt(N/d); softmax (inverse temperature "
                        f"{f['recall'].attrs.get('softmax_scale', '?')}) stays exact. A read error below "
                        f"{EXACT_BELOW:.0e} (an exact 0 or float64 rounding, ~1e-16..1e-10) is not drawn on the error "
                        "axis: an open triangle in the strip 'exact' marks it (one row per memory, in the legend's "
                        "order and colours). A curve that lies on another (within 1.5% of the panel's height at every "
                        "point) is drawn on top of it with a smaller marker and a broken line; the panel's legend says "
                        "which it lies on.")
        fig.tight_layout(rect=(0, 0, 1, 0.905))
        return fs.save(fig, a.out_dir, "recall_capacity")


if __name__ == "__main__":
    sys.exit(fs.run(main))
