#!/usr/bin/python3
"""Figure: KDA parity error by precision (kdalab parity).

Relative RMS of o against the high-precision truth vs sequence length T, one line per
(implementation, state precision, matmul precision), with the bf16 output floor (1.66e-3), the
kdalab goal (2.0e-3) and the peers measured on the anchor-kda cases (fla 4.0-4.6e-3, FlashKDA 5.6-5.8e-3;
numerics/tolerance.hpp).
Reads the table parity/table (or a group "parity" holding the columns directly): columns impl,
T and o_rel_rms (or rel_rms), plus precision or state_precision/matmul_precision when present.
Series that lie on each other (every median within COINCIDE, 2%: e.g. the twin's state fp32 and bf16 rows,
whose o is the same, or the CUDA kernel and its twin) stay visible: the first of such a group is drawn
underneath with a large open marker and a thick solid line, each further one on top with a smaller marker
of another shape and a thinner dashed/dotted line, and its legend entry says which series it lies on.
Rows whose error is not finite (o_rel_rms = inf: the row's o has NaN/Inf, e.g. the twin at a g_min far beyond
the kernel's range) are left out of the medians and bands; each (series, T) holding such rows is marked by a
triangle at the top edge of the panel in the series' colour, its legend entry counts them and the footer says so.
An implementation with rows at only some grid points (float32-chunk refuses the softplus points: decay span over 80
nats) is said under the full-range panel: how many points are plotted and why the rest are missing (the reason from
the file's parity `notes`). The CUDA kernel's skipped rows are said there too, from the same `notes`: every cuda-bf16 row
skipped (a CPU build, no GPU: its series is missing) or the points outside the kernel's shapes.
When bf16 rows get the zoomed panel, the full-range panel shows the reference lines as one light band (named above
the data) and the zoom draws each line, named at its right edge; the full-range panel keeps headroom above the data.
Usage: /usr/bin/python3 scripts/fig_parity.py RESULTS.h5 [--out-dir figures] [--dump FILE.json]
"""
import json
import re
import sys

import h5py
import matplotlib.ticker as mticker
import numpy as np

import figstyle as fs
from figstyle import plt


ZERO_AT = 1e-18  # an exact 0 is drawn here on the log axis
COINCIDE = fs.COINCIDE  # two series coincide when every median differs by less than this (2%), relatively
NONFINITE_MARKER = "^"  # drawn at the top edge (axes fraction NONFINITE_Y) where a series has non-finite rows
NONFINITE_Y = 0.97
NONFINITE_GLYPH = "\u25b2"  # the marker as the legend and footer text name it


def find_table(f):
    for g in ("parity/table", "parity"):
        if g in f and isinstance(f[g], h5py.Group) and "impl" in f[g] and "T" in f[g]:
            return g
    return None


SKIPPED_NOTE = re.compile(r"^(\S+) C=(\d+) skipped at (?:point (\d+) \([^)]*\)|\d+ points \[([^\]]*)\]): (.*)$")


def skipped_points_notes(f, t):
    """Notes on implementations that have rows at only some of the grid points: one per "<impl> C=<C> skipped at ..."
    line of the group's `notes` attribute (kdalab parity: a chunked implementation refuses a point whose factored
    decay span is over its scalar type's limit), as "<impl>, C = <C>: <k> of the <n> grid points plotted; the other
    <m> (<which>) skipped: <why>", where <which> names the gate of the skipped points when they are exactly the
    points of one gate, and <why> is the note's whole reason, its "accepted: ..." part included, ended by a full
    stop. [] when the file has no such note (or no `point` column to count grid points by)."""
    if "point" not in t or "parity" not in f:
        return []
    points = np.asarray(t["point"]).astype(int)
    n = len(set(points.tolist()))
    gate_of = {}
    if "gate" in t:
        for p, g in zip(points.tolist(), t["gate"]):
            gate_of.setdefault(p, g)
    out = []
    for line in fs.attr(f["parity"], "notes", "").splitlines():
        m = SKIPPED_NOTE.match(line)
        if not m:
            continue
        impl, C = m.group(1), int(m.group(2))
        skipped = {int(m.group(3))} if m.group(3) is not None else {int(x) for x in re.findall(r"(\d+) \(", m.group(4))}
        sel = t["impl"] == impl
        if "C" in t:
            sel = sel & (np.asarray(t["C"]).astype(int) == C)
        plotted = len(set(points[sel].tolist()))
        which = ""
        gates = {gate_of.get(p) for p in skipped}
        if len(gates) == 1 and None not in gates:
            g = next(iter(gates))
            if skipped == {p for p, gg in gate_of.items() if gg == g}:
                which = f"every {g}-gate point"
        # the whole reason, "; accepted: F * |g_min| <= 80 ..." included (was cut there); an empty one is left out,
        # not "skipped: "; a full stop ends the note, so the next one (a line of its own) does not run on from it
        why = m.group(5).strip().rstrip(".")
        out.append(f"{impl}, C = {C}: {plotted} of the {n} grid points plotted (its median is over those); the other "
                   f"{len(skipped)}{' (' + which + ')' if which else ''} skipped{': ' + why if why else ''}.")
    return out


def distinct_reasons(reasons):
    """`reasons` without the empty ones (blank after stripping) and without repeats, in first-seen order: a `notes`
    line with no reason, or the same reason on two lines, printed "every row skipped: ." or "a; a."."""
    out = []
    for r in reasons:
        r = r.strip()
        if r and r not in out:
            out.append(r)
    return out


def reasons_text(reasons):
    """": <r1>; <r2>." for the distinct non-empty `reasons`, "." when there is none (the skip is still said)."""
    rs = distinct_reasons(reasons)
    return f": {'; '.join(rs)}." if rs else "."


CUDA_ALL_SKIPPED = "cuda-bf16 rows skipped:"  # kdalab parity: this build / machine cannot run the kernel (no GPU, no CUDA)
CUDA_POINT_SKIPPED = re.compile(r"^cuda-bf16 row skipped at [^:]*:(.*)$")  # a point outside the kernel's shapes


def cuda_skipped_notes(f, t):
    """Notes on the CUDA kernel's rows that kdalab parity skipped, from the group's `notes` attribute (where parity
    records them; its stdout prints the same lines): "cuda-bf16 (the CUDA kernel): not drawn, every row skipped: <why>"
    when the table has no cuda-bf16 row (the note "cuda-bf16 rows skipped: <why>": a CPU build, or no GPU; or every
    point outside the kernel's shapes); "cuda-bf16: <k> of the <n> grid points plotted; its rows at the others skipped:
    <why>" when a GPU run skipped only the points outside the kernel's shapes ("cuda-bf16 row skipped at ...: <why>").
    [] when the notes name no skipped cuda-bf16 row."""
    if "parity" not in f:
        return []
    lines = fs.attr(f["parity"], "notes", "").splitlines()
    has_rows = bool(np.any(t["impl"] == "cuda-bf16"))
    reasons = [line[len(CUDA_ALL_SKIPPED):] for line in lines if line.startswith(CUDA_ALL_SKIPPED)]
    shape_reasons = [m.group(1) for m in (CUDA_POINT_SKIPPED.match(x) for x in lines) if m]
    if not has_rows:  # no series drawn: every row skipped, for this build / machine or for every point's shape
        reasons += shape_reasons
        return [f"cuda-bf16 (the CUDA kernel): not drawn, every row skipped{reasons_text(reasons)}"] if reasons else []
    out = []
    if shape_reasons and "point" in t:
        points = np.asarray(t["point"]).astype(int)
        plotted = len(set(points[t["impl"] == "cuda-bf16"].tolist()))
        out.append(f"cuda-bf16: {plotted} of the {len(set(points.tolist()))} grid points plotted; its rows at the "
                   f"others skipped{reasons_text(shape_reasons)}")
    return out


def truth_text(f):
    """What the rows were compared with, from the run's --truth (the root config attribute)."""
    truth = ""
    try:
        cfg = f.attrs["config"]
        truth = str(json.loads(cfg.decode() if isinstance(cfg, bytes) else str(cfg)).get("truth", ""))
    except Exception:
        truth = ""
    names = {"f64": "the float64 recurrence", "f80": "the 80-bit long-double recurrence",
             "mp": "the cpp_bin_float_50 recurrence"}
    return names.get(truth, "the high-precision recurrence" + (f" (--truth {truth})" if truth else ""))


def inputs_text(t):
    """The inputs the rows were measured on: 'anchor-kda', or the input kinds of a parity run with --inputs (the
    generator column names a kind other than the anchor as '..., inputs=KIND)'; numerics/kda_inputs.hpp)."""
    gens = [str(g) for g in t["generator"]] if "generator" in t else []
    kinds = sorted({g.split("inputs=", 1)[1].split(")")[0].split(",")[0] if "inputs=" in g else "anchor" for g in gens})
    if kinds in ([], ["anchor"]):
        return "anchor-kda"
    return f"inputs of the kinds {', '.join(kinds)} (numerics/kda_inputs.hpp), pooled in the medians"


def main():
    a = fs.parse_args(__doc__.splitlines()[0])
    with h5py.File(a.results, "r") as f:
        g = find_table(f)
        if g is None:
            return fs.skip(f"{a.results} has no parity table with columns impl and T")
        t = fs.need_table(f, g, ("impl", "T"), a.results)
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
        series = []  # (label, Ts, median, lo, hi, non-finite rows per T, rows per T)
        err = np.asarray(t[err_col], dtype=float)
        for lab in sorted(set(labels.tolist())):
            sel = labels == lab
            Ts = np.array(sorted(set(t["T"][sel].tolist())))
            per_T = [err[sel][t["T"][sel] == T] for T in Ts]
            fin = [v[np.isfinite(v)] for v in per_T]
            # a T whose rows are all non-finite has no median: NaN breaks the line there (its marker says why)
            series.append((lab, Ts, np.array([np.median(v) if v.size else np.nan for v in fin]),
                           np.array([np.min(v) if v.size else np.nan for v in fin]),
                           np.array([np.max(v) if v.size else np.nan for v in fin]),
                           np.array([v.size - w.size for v, w in zip(per_T, fin)]), np.array([v.size for v in per_T])))
        n_nonfinite = int(sum(int(sr[5].sum()) for sr in series))

        # Groups of coinciding series (figstyle.overlay_groups: medians within COINCIDE at every T, non-finite rows at
        # the same T), in label order; a CUDA kernel series goes first (drawn underneath).
        groups = fs.overlay_groups([(sr[1], np.maximum(sr[2], ZERO_AT)) for sr in series], rel=COINCIDE,
                                   first=lambda k: (not series[k][0].startswith("cuda"), k),
                                   same=lambda i, k: np.array_equal(series[i][5], series[k][5]), need_finite=False)
        # The bf16 class (median >= 1e-4 somewhere: the twin, the kernel) also gets a zoomed panel, where it
        # can be told apart from the reference lines it sits among (1.66e-3 .. 5.6e-3).
        zoomed = [k for k in range(len(series)) if np.any(series[k][2] >= 1e-4)]  # NaN (no finite row) compares False
        fig, axes = plt.subplots(1, 2 if zoomed else 1, figsize=(10.6 if zoomed else 7.4, 4.0), squeeze=False,
                                 gridspec_kw={"width_ratios": [1.25, 1]} if zoomed else None)
        ax, axz = axes[0][0], (axes[0][1] if zoomed else None)
        cmap = plt.get_cmap("tab10")
        for g in groups:
            for rank, k in enumerate(g):
                lab, Ts, med, lo, hi, bad, rows = series[k]
                c = cmap(k % 10)
                text = lab
                if np.any(np.isfinite(med)) and not np.any(med > 0):
                    text += f"\n  exactly 0 (drawn at {ZERO_AT:.0e})"
                if bad.sum():
                    text += (f"\n  {int(bad.sum())} of {int(rows.sum())} rows non-finite "
                             f"({NONFINITE_GLYPH} at the top edge)")
                if rank > 0:
                    text += "\n  " + fs.lies_on(series[g[0]][0])
                style = fs.overlay_style(rank, len(g), c)
                for a_ in ([ax, axz] if k in zoomed else [ax]):
                    a_.plot(Ts, np.maximum(med, ZERO_AT), color=c, label=text if a_ is ax else "_" + text, **style)
                    a_.fill_between(Ts, np.maximum(lo, ZERO_AT), np.maximum(hi, ZERO_AT), color=c, alpha=0.12, lw=0)
                    if bad.sum():  # x in data, y in axes fractions: the top edge, whatever the limits
                        a_.plot(Ts[bad > 0], np.full(int((bad > 0).sum()), NONFINITE_Y), NONFINITE_MARKER, color=c,
                                ms=6, mfc=c, mec="k", mew=0.5, ls="none", clip_on=False, zorder=5,
                                transform=a_.get_xaxis_transform(), label="_" + lab + " non-finite")
        refs = ((1.66e-3, "bf16 output floor 1.66e-3", ":"), (2.0e-3, "kdalab goal 2.0e-3", "--"),
                (4.0e-3, "fla chunk_kda 4.0e-3", "-."), (5.6e-3, "FlashKDA 5.6e-3", (0, (5, 2, 1, 2, 1, 2))))
        if axz is None:  # one panel: the reference lines drawn in it, named in the legend
            for y, txt, ls in refs:
                ax.axhline(y, color="#444444", ls=ls, lw=0.8, label=txt, zorder=1)
        else:
            # The full-range panel spans ~16 decades: the four lines (a factor 3.4 apart) would be one dark smear over
            # the bf16 markers. There they are one light band, named above the data; the zoom draws and names each.
            ax.axhspan(refs[0][0], refs[-1][0], color="#888888", alpha=0.18, lw=0, zorder=0)
            for y, txt, ls in refs:
                axz.axhline(y, color="#444444", ls=ls, lw=0.8, zorder=1, label=txt)
        all_T = sorted(set(t["T"].tolist()))
        for a_ in ([ax, axz] if axz is not None else [ax]):
            a_.set_xscale("log")
            if len(all_T) == 1:  # one T (e.g. a long-T run): centre it, not 1e6 .. 1e7
                a_.set_xlim(all_T[0] / 1.6, all_T[0] * 1.6)
            a_.set_yscale("log")
            a_.set_xlabel("sequence length $T$ (tokens)")
        # Headroom above the highest of the data and the reference lines (an eighth of the decades shown), so neither
        # sits on the top edge, where the non-finite markers go; the band's name goes in it, above all the data.
        finite_hi = [np.nanmax(sr[4]) for sr in series if np.any(np.isfinite(sr[4]))]
        top = max(finite_hi + [refs[-1][0]])
        lo_y = ax.get_ylim()[0]
        ax.set_ylim(lo_y, top * (top / lo_y) ** 0.12)
        if axz is not None:
            ax.annotate(f"reference lines {refs[0][0]:.2e} .. {refs[-1][0]:.1e} (shaded; each named in the zoom)",
                        xy=(0.99, top), xycoords=ax.get_yaxis_transform(), xytext=(0, 4), textcoords="offset points",
                        ha="right", va="bottom", fontsize=6, color="#444444")
        ax.set_ylabel(r"relative RMS error of $o$ vs truth")
        # under the full-range panel: an implementation plotted at only some of the grid points, or not at all (the
        # CUDA kernel's rows in a CPU build: stdout said so, the figure did not)
        skipped_notes = skipped_points_notes(f, t) + cuda_skipped_notes(f, t)
        if skipped_notes:
            fs.panel_note(ax, "\n".join(skipped_notes))  # one note a line (joined, they run together)
        ax.set_title("KDA numeric parity by implementation and precision")
        if axz is not None:
            lo_z = min([np.nanmin(series[k][3]) for k in zoomed] + [refs[0][0]])  # zoomed: some finite value
            hi_z = max([np.nanmax(series[k][4]) for k in zoomed] + [refs[-1][0]])
            axz.set_ylim(lo_z / 1.15, hi_z * 1.15)
            axz.yaxis.set_major_locator(mticker.LogLocator(base=10, subs=np.arange(1.0, 10.0)))
            axz.yaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:.0e}".replace("e-0", "e-")))
            axz.yaxis.set_minor_formatter(mticker.NullFormatter())
            axz.set_title("zoom: the bf16 rows among the reference lines")
            axz.set_ylabel(r"relative RMS error of $o$ vs truth (zoom)")
            axr = axz.twinx()  # the reference lines named at the right edge, where no series can hide them
            axr.set_yscale("log")
            axr.set_ylim(axz.get_ylim())
            axr.set_yticks([y for y, _, _ in refs], [txt for _, txt, _ in refs], fontsize=6, color="#444444")
            axr.yaxis.set_minor_locator(mticker.NullLocator())
            axr.grid(False)
            axr.spines["right"].set_visible(False)
        handles, texts = ax.get_legend_handles_labels()
        if axz is not None:  # the reference lines' styles, as the zoom draws them
            hz, tz = axz.get_legend_handles_labels()
            handles, texts = handles + hz, texts + tz
        if n_nonfinite:  # one legend entry for the marker itself
            from matplotlib.lines import Line2D
            handles.append(Line2D([], [], ls="none", marker=NONFINITE_MARKER, color="#777777", mec="k", mew=0.5, ms=6))
            texts.append(f"{NONFINITE_GLYPH} at the top edge: rows with non-finite {err_col} (NaN/Inf), not drawn")
        fig.legend(handles, texts, loc="upper left", bbox_to_anchor=(1.0, 0.93), fontsize=6.5,
                   frameon=False)
        fs.label_footer(fig, f, f"Median over the grid points at each T (band: min to max); an exact 0 is drawn at {ZERO_AT:.0e}. "
                        "Series whose medians agree within 2% at every T are drawn on top of each other with smaller "
                        "markers and broken lines ('lies on' in the legend). Truth: " + truth_text(f) + " on "
                        "the same rounded inputs (" + inputs_text(t) + ")."
                        + (f" {n_nonfinite} row(s) have a non-finite {err_col} (o has NaN/Inf): left out of the medians "
                           f"and bands, marked {NONFINITE_GLYPH} at the top edge at their T." if n_nonfinite else ""))
        fig.tight_layout()
        return fs.save(fig, a.out_dir, "parity_error")


if __name__ == "__main__":
    sys.exit(fs.run(main))
