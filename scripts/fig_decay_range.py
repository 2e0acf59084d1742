#!/usr/bin/python3
"""Figure: decay-range heat map (kdalab decay-range).

Relative RMS error of o against the float64 recurrence for each gate lower bound g_min (rows;
"softplus" = the unbounded Kimi Linear gate) and chunk size C (columns), one panel per
implementation/precision. Dark hatched cells: o has NaN/Inf (a line under the panel's title counts them, the colour
bar's "o not finite (overflow)" key names them; fp16 at --gate-shift 20 is all such cells, on purpose); their text is what `kdalab decay-range` prints on the
console, rel_rms as stored (inf) and in brackets how many values of o are NaN or Inf. Cell text: the error, then the range
analysis of the factored tile (o = K/Gamma, the stored k e^-c, overflows, s = Gamma subnormal, z = Gamma underflows
to 0, as counts). Dark cells in the fp64 control panel (softplus at C >= 32 with --gate-shift 20) are explained
under that panel: the unbounded gate's factored decay over the chunk leaves fp64's exp range. The fp32 edges of a 16-token tile: Gamma leaves the normal range below
g = -5.459, 1/Gamma (K/Gamma of a key entry of 1) overflows below -5.545.
Usage: /usr/bin/python3 scripts/fig_decay_range.py RESULTS.h5 [--out-dir figures]
"""
import sys

import h5py
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Rectangle

import figstyle as fs
from figstyle import plt

PANELS = [("chunked", "fp64"), ("chunked", "fp32"), ("chunked", "bf16"), ("chunked", "fp16"), ("kernel-plan", "bf16"),
          ("cuda", "bf16")]
TITLES = {("chunked", "fp64"): "chunked, fp64 (control)", ("chunked", "fp32"): "chunked, fp32",
          ("chunked", "bf16"): "chunked, bf16", ("chunked", "fp16"): "chunked, fp16",
          ("kernel-plan", "bf16"): "twin, CUDA kernel plan", ("cuda", "bf16"): "CUDA kernel (C = 16)"}


# Cells where o has NaN/Inf: dark red, hatched, counted under the panel's title; the colour bar's key says what they are.
BAD_COLOR, BAD_EDGE, BAD_HATCH = "#5b0f0f", "#d08080", "///"

FP64_EXP_MAX = float(np.log(np.finfo(np.float64).max))  # 709.78: e^c overflows fp64 above this


def control_note(t, shift):
    """The note under the fp64 control panel when some of its cells are dark (o has NaN/Inf): which cells, and why a
    control goes non-finite (the chunk's factored decay c, the table's c_min, leaves fp64's exp range: K/Gamma = k e^-c
    overflows; a softplus gate is unbounded, so its c grows with C without limit). "" when every fp64 cell is finite."""
    sel = (t["impl"] == "chunked") & (t["precision"] == "fp64")
    bad = sel & ((t["o_nan"] + t["o_inf"] > 0) | ~np.isfinite(t["rel_rms"].astype(float)))
    if not bad.any():
        return ""
    parts = []
    for gate in ("softplus", "bounded"):
        gsel = bad & (t["gate"] == gate)
        if not gsel.any():
            continue
        Cs = ", ".join(str(c) for c in sorted(set(int(c) for c in t["C"][gsel])))
        c = -t["c_min"][gsel].astype(float)
        span = f"{c.min():.0f}" + (f" .. {c.max():.0f}" if c.min() != c.max() else "")
        if gate == "softplus":
            parts.append(f"softplus at C = {Cs}: the softplus gate is unbounded (g down to "
                         f"{float(np.min(t['g_lowest'][gsel])):.1f} per token with --gate-shift {shift:g}), so the "
                         f"chunk's factored decay |c| reaches {span} nats")
        else:
            gm = ", ".join(f"{g:g}" for g in sorted(set(t["g_min"][gsel].tolist())))
            parts.append(f"g_min = {gm} at C = {Cs}: the chunk's factored decay |c| reaches {span} nats")
    what = "NaN" if int(t["o_inf"][bad].sum()) == 0 else "NaN/Inf"
    return ("Dark fp64 cells (the control): " + "; ".join(parts) + f", past fp64's exp range (|c| > {FP64_EXP_MAX:.1f}): "
            f"K/Gamma = k e^-c overflows (ovf) and o gets {what} even in fp64 (the float64 recurrence, the truth, forms "
            "no such factor).")


def main():
    a = fs.parse_args(__doc__.splitlines()[0])
    with h5py.File(a.results, "r") as f:
        t = fs.need_table(f, "decay_range/table", ("gate", "g_min", "C", "impl", "precision", "rel_rms", "o_nan", "o_inf",
                                                    "overflow", "underflow", "subnormal"), a.results)
        for col, fill in (("c_min", np.nan), ("g_lowest", np.nan)):  # older files: the note says less
            t.setdefault(col, np.full(len(t["impl"]), fill))
        gate_rows = []
        for g, gm in zip(t["gate"], t["g_min"]):
            key = "softplus" if g == "softplus" else float(gm)
            if key not in gate_rows:
                gate_rows.append(key)
        bounded = sorted([g for g in gate_rows if g != "softplus"], reverse=True)
        gate_rows = bounded + (["softplus"] if "softplus" in gate_rows else [])
        Cs = sorted(set(t["C"].tolist()))
        panels = [p for p in PANELS if ((t["impl"] == p[0]) & (t["precision"] == p[1])).any()]
        if not panels:
            return fs.skip(f"{a.results}: decay_range/table has no rows of a known implementation and precision")
        ncol = min(3, len(panels))
        nrow = (len(panels) + ncol - 1) // ncol
        fig, axes = plt.subplots(nrow, ncol, figsize=(3.2 * ncol, 3.0 * nrow), squeeze=False, sharey=True,
                                 layout="constrained")
        cmap = plt.get_cmap("viridis").copy()
        cmap.set_bad(BAD_COLOR)
        im = None
        any_bad = False  # some panel has a NaN/Inf cell: the colour bar gets the "o not finite (overflow)" key
        for k, (impl, prec) in enumerate(panels):
            ax = axes[k // ncol][k % ncol]
            Z = np.full((len(gate_rows), len(Cs)), np.nan)
            txt = [["" for _ in Cs] for _ in gate_rows]
            n_cells, bad_cells, n_ovf = 0, [], 0  # cells drawn; (row, col) of those with NaN/Inf; of those, with ovf
            for i in range(len(t["impl"])):
                if t["impl"][i] != impl or t["precision"][i] != prec:
                    continue
                key = "softplus" if t["gate"][i] == "softplus" else float(t["g_min"][i])
                if t["C"][i] not in Cs:
                    continue
                r, c = gate_rows.index(key), Cs.index(t["C"][i])
                e = float(t["rel_rms"][i])
                n_bad = int(t["o_nan"][i]) + int(t["o_inf"][i])  # non-finite values of o, as the console counts them
                bad = n_bad > 0 or not np.isfinite(e)
                Z[r, c] = np.nan if bad else np.log10(max(e, 1e-17))
                n_cells += 1
                if bad:
                    bad_cells.append((r, c))
                    n_ovf += int(t["overflow"][i] > 0)
                flags = "ovf" if t["overflow"][i] > 0 else ("0" if t["underflow"][i] > 0 else
                                                           ("sub" if t["subnormal"][i] > 0 else ""))
                # as the console: the stored rel_rms (inf, or nan where that was stored) and the NaN+Inf count of o
                lab = f"{e:.0e}" + (f" ({n_bad})" if n_bad else "")
                txt[r][c] = lab + ("\n" + flags if flags else "")
                if impl == "cuda" and "allow_unsafe_range" in t and t["allow_unsafe_range"][i] == 1:
                    txt[r][c] += "\nunsafe"
            im = ax.imshow(np.ma.masked_invalid(Z), cmap=cmap, vmin=-17, vmax=0, aspect="auto")
            ax.set_facecolor(BAD_COLOR)
            for r in range(len(gate_rows)):
                for c in range(len(Cs)):
                    col = "white" if (np.isnan(Z[r, c]) or Z[r, c] < -8) else "black"
                    ax.text(c, r, txt[r][c], ha="center", va="center", fontsize=6.5, color=col,
                            bbox={"facecolor": BAD_COLOR, "edgecolor": "none", "pad": 0.5} if np.isnan(Z[r, c]) else None)
            any_bad = any_bad or bool(bad_cells)
            ax.set_xticks(range(len(Cs)), [str(c) for c in Cs])
            ax.set_yticks(range(len(gate_rows)), [("softplus" if g == "softplus" else f"{g:g}") for g in gate_rows])
            if k // ncol == nrow - 1 or k + ncol >= len(panels):
                ax.set_xlabel("chunk size $C$ (tokens factored)")
            if k % ncol == 0:
                ax.set_ylabel(r"gate lower bound $g_{\min}$")
            ax.set_title(TITLES.get((impl, prec), f"{impl}, {prec}"), pad=13 if bad_cells else None)
            if bad_cells:
                # NaN/Inf cells are hatched and counted in a line under the title: a panel where every cell overflowed
                # (fp16 at --gate-shift 20, on purpose) otherwise read as an empty dark panel. The words say
                # "non-finite", as the cells say "inf": the console's word, not NaN/Inf
                for r, c in bad_cells:
                    ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, hatch=BAD_HATCH, edgecolor=BAD_EDGE,
                                           lw=0))
                nb = len(bad_cells)
                what = f"all {n_cells} cells" if nb == n_cells else f"{nb} of {n_cells} cells"
                why = "overflow" if n_ovf == nb else f"{n_ovf} with K/Gamma overflow"
                ax.text(0.5, 1.01, f"{what} non-finite ({why})", transform=ax.transAxes, ha="center", va="bottom",
                        fontsize=7.5, color=BAD_COLOR)
            if (impl, prec) == ("chunked", "fp64"):
                note = control_note(t, float(f["decay_range"].attrs.get("gate_shift", 0)))
                if note:
                    fs.panel_note(ax, note)
            ax.grid(False)
        for k in range(len(panels), nrow * ncol):
            axes[k // ncol][k % ncol].axis("off")
        if im is not None:
            cb = fig.colorbar(im, ax=axes, shrink=0.6, pad=0.02)
            cb.set_label(r"$\log_{10}$ relative RMS error of $o$")
            if any_bad:  # the key of the hatched dark cells, above the colour scale
                cb.ax.text(0.5, 1.03, "o not finite\n(overflow)", transform=cb.ax.transAxes, ha="center", va="bottom",
                           fontsize=7, color="white",
                           bbox={"facecolor": BAD_COLOR, "edgecolor": BAD_EDGE, "hatch": BAD_HATCH, "pad": 2})
        attrs = f["decay_range"].attrs
        fig.suptitle("Why $g_{\\min} = -5$ and 16-token tiles go together: error of the factored chunk form")
        fs.label_footer(fig, f, f"Decays pinned near their bound (gate logit shifted by {float(attrs.get('gate_shift', 0)):g}); "
                        f"T = {int(attrs.get('T', 0))}, d_k = d_v = {int(attrs.get('D', 0))}. Dark hatched cells: o has NaN/Inf (counted under each panel's title); their text is "
                        "rel_rms as stored (inf) and, in brackets, how many values of o are NaN or Inf (as the console prints them). "
                        "Range analysis of the stored factors (numerics/range.hpp): ovf = K/Gamma (k e^-c, as stored) overflows, 0 = Gamma rounds to 0, sub = Gamma subnormal. "
                        "fp32 edges over 16 tokens: -5.459 (normal range), -5.545 (1/Gamma overflow: K/Gamma of a key entry of 1). "
                        + fs.attr(f["decay_range"], "gpu_note", ""))
        return fs.save(fig, a.out_dir, "decay_range")


if __name__ == "__main__":
    sys.exit(fs.run(main))
