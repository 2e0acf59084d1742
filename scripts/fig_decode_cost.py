#!/usr/bin/python3
"""Figure: per-token decode cost vs context n, log-log (kdalab decode-cost).

Left: numbers one head reads per decode step, softmax 2 n d vs the KDA state d^2, with the tabulated
points (d = 64: n = 1,000 / 128,000 / 1,000,000) marked and their ratios printed.
Right: measured time per decode step of the CPU reference (one head, float32: the softmax read per n; the KDA step is
ONE measurement, repeated on every n row of the file, drawn as one horizontal line without markers) and, when present,
the GPU kernels (when they were not run, decode-cost's note saying why is written under the panel). The legend names
the CPU precision (from the column's description) and the GPU of the file's `device` attribute, and the y axis reaches
high enough that no curve runs under the legend. The footer carries decode-cost's note on the CPU softmax curve (its working set vs this
machine's caches) when the file has one.
Usage: /usr/bin/python3 scripts/fig_decode_cost.py RESULTS.h5 [--out-dir figures]
"""
import re
import sys

import h5py
import numpy as np

import figstyle as fs
from figstyle import plt


def main():
    a = fs.parse_args(__doc__.splitlines()[0])
    with h5py.File(a.results, "r") as f:
        t = fs.need_table(f, "decode_cost/analytic", ("n", "d", "softmax_reads", "kda_reads", "ratio_floor"), a.results)
        # (not c / g: the loop below takes c for a colour)
        cpu = fs.optional_table(f, "decode_cost/cpu", ("impl", "n", "d", "seconds_per_token"))
        gpu = fs.optional_table(f, "decode_cost/gpu", ("n", "mla_layer_s", "kda_layer_s"))
        has_cpu, has_gpu = cpu is not None, gpu is not None
        ncols = 2 if (has_cpu or has_gpu) else 1
        fig, axes = plt.subplots(1, ncols, figsize=(4.2 * ncols, 3.6), squeeze=False)
        ax = axes[0][0]
        n = np.logspace(3, 6, 50)
        for d, c in ((64, "#1f77b4"), (128, "#2ca02c")):
            ax.plot(n, 2 * n * d, "-", color=c, label=f"softmax, $2nd$ (d = {d})")
            ax.plot(n, np.full_like(n, d * d), "--", color=c, label=f"KDA state, $d^2$ (d = {d})")
        for d, mk in ((64, "o"), (128, "s")):
            sel = t["d"] == d
            if not sel.any():
                continue
            ax.plot(t["n"][sel], t["softmax_reads"][sel], mk, color="k", ms=5, mfc="none")
            ax.plot(t["n"][sel], t["kda_reads"][sel], mk, color="k", ms=5, mfc="none")
            if d == 64:
                for nn, sm, r in zip(t["n"][sel], t["softmax_reads"][sel], t["ratio_floor"][sel]):
                    left = nn < 1e4
                    ax.annotate(f"{int(sm):,}\n{int(r):,}x", (nn, sm), textcoords="offset points",
                                xytext=(6, -16) if left else (-4, 6), ha="left" if left else "right", fontsize=6.5)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("context $n$ (tokens cached)")
        ax.set_ylabel("numbers read per decode step, one head")
        ax.set_title("Analytic reads (tabulated points: open markers)")
        ax.legend(loc="upper left", fontsize=6.5)
        if ncols == 2:
            ax = axes[0][1]
            notes = []  # what the panel does not draw, said under it (with decode-cost's GPU note)
            if has_cpu:
                c = cpu
                # the precision the CPU steps ran in, as the file records it (the column's description: "float32")
                m = re.search(r"\b(float(?:16|32|64)|bf16|fp(?:16|32|64))\b",
                              fs.attr(f["decode_cost/cpu/seconds_per_token"], "description", ""))
                prec = f", {m.group(1)}" if m else ""
                for impl, col, mk in (("softmax", "#d62728", "o"), ("kda", "#2ca02c", "s")):
                    sel = c["impl"] == impl
                    if not sel.any():
                        continue
                    o = np.argsort(c["n"][sel])
                    ns, us = c["n"][sel][o], 1e6 * np.asarray(c["seconds_per_token"][sel][o], dtype=float)
                    what = "softmax read" if impl == "softmax" else "KDA step"
                    name = f"CPU reference{prec}: {what} (d = {int(c['d'][sel][0])})"
                    # a time that is NaN, infinite, 0 or negative is no measurement: not drawn (on a log axis it drew
                    # nothing while the legend said "0 us" or "inf us"; all NaN ended in a traceback), said in a note
                    good = np.isfinite(us) & (us > 0)
                    if not good.all():
                        notes.append(f"CPU {what}: {int((~good).sum())} of {len(us)} rows have no finite time > 0 "
                                     f"(NaN, inf or <= 0) and are not drawn" + ("" if good.any() else
                                                                                " (nothing drawn)") + ".")
                    ns, us = ns[good], us[good]
                    if len(us) == 0:
                        continue
                    if impl == "kda" and np.all(us == us[0]):
                        # decode-cost measures the KDA step once (it does not depend on n) and repeats that value on
                        # every n row: drawn as one measurement, a horizontal line over the n range without markers,
                        # not as points that look like a measurement per n
                        # (one n row: a single marker, a zero-length line would not show)
                        ax.plot([ns.min(), ns.max()], [us[0], us[0]], "-" if ns.min() < ns.max() else mk, lw=1.5,
                                ms=3.5, color=col,
                                label=f"{name}:\n  one measurement, {us[0]:.3g} µs (a step does not depend on n)")
                    else:
                        ax.plot(ns, us, "-" + mk, ms=3.5, color=col, label=name)
            if has_gpu:
                g = gpu
                o = np.argsort(g["n"])
                gpu_name = fs.gpu_name(f)  # the GPU the file's rows were measured on (was "H200" whatever it was)
                ax.plot(g["n"][o], 1e6 * g["mla_layer_s"][o], "-^", ms=3.5, color="#7f7f7f",
                        label=f"{gpu_name}, kdalab kernel: absorbed MLA decode,\n  32 heads, $d_c$ = 512, bf16 cache")
                ax.plot(g["n"][o], 1e6 * g["kda_layer_s"][o], "--v", ms=3.5, color="#1f77b4",
                        label=f"{gpu_name}, kdalab kernel: KDA decode step,\n  32 heads, fp32 state")
            else:
                note = fs.attr(f["decode_cost/gpu"], "note", "") if "decode_cost/gpu" in f else ""
                if note:  # under the panel, not over the curves (was drawn on the KDA line at the bottom)
                    notes.append(note)
            if notes:
                fs.panel_note(ax, " ".join(notes))
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("context $n$ (tokens cached)")
            ax.set_ylabel("time per decode step (µs)")
            ax.set_title("Measured per-token decode step")
            legend = ax.legend(loc="upper left", fontsize=6.5) if ax.get_lines() else None
        fig.suptitle("Decode cost per token vs context: softmax re-reads the cache, KDA reads a fixed state", y=1.02)
        # Why the CPU softmax curve may bend up (its working set against the caches): decode-cost's own note.
        cpu_note = fs.attr(f["decode_cost/cpu"], "note", "") if has_cpu else ""
        fs.label_footer(fig, f, "CPU: " + cpu_note if cpu_note else "")
        fig.tight_layout()
        if ncols == 2 and legend is not None:
            # room above the curves for the legend (otherwise it covers the softmax curve's last segment)
            fs.clear_legend_headroom(ax, legend)
        return fs.save(fig, a.out_dir, "decode_cost")


if __name__ == "__main__":
    sys.exit(fs.run(main))
