#!/usr/bin/python3
"""Figure: KDA gradient parity by precision (kdalab parity --backward).

Relative RMS of each gradient (dq, dk, dv, dg, dbeta, dS0) of the recurrence's backward against the truth's
backward vs sequence length T: one panel per gradient, one line per implementation (float64, float32, and the
bf16 reference emulation when the file has its rows), the median over the grid points at each T with the min-max
band, the look of fig_parity.py (the forward figure). An exact 0 (the float64 row where the truth is float64
itself, --truth f64 or auto above --f80-max-work) is drawn at ZERO_AT and said in the legend. The truth of each T
(cpp_bin_float_50, long double or float64: the table's truth column) is named under the panels.
Reads the table parity_backward/table: columns impl, T, truth and <gradient>_rel_rms.
Usage: /usr/bin/python3 scripts/fig_parity_backward.py RESULTS.h5 [--out-dir figures] [--dump FILE.json]
"""
import sys

import numpy as np

import figstyle as fs
from figstyle import plt
import h5py

ZERO_AT = 1e-18  # an exact 0 is drawn here on the log axis (as fig_parity.py)
GRADS = ("dq", "dk", "dv", "dg", "dbeta", "dS0")
GROUP = "parity_backward/table"


def truth_by_T(t):
    """'T = a, b: <truth>; T = c: <truth>' from the table's truth column (the first word of each row's truth)."""
    by = {}
    for T, tr in zip(t["T"].tolist(), t["truth"].tolist()):
        by.setdefault(tr.split(" (")[0], set()).add(int(T))
    return "; ".join(f"T = {', '.join(str(x) for x in sorted(v))}: {k}" for k, v in by.items())


def main():
    a = fs.parse_args(__doc__.splitlines()[0])
    with h5py.File(a.results, "r") as f:
        t = fs.need_table(f, GROUP, ("impl", "T", "truth") + tuple(g + "_rel_rms" for g in GRADS), a.results)
        impls = sorted(set(t["impl"].tolist()), key=lambda s: ("float64", "float32", "bf16-emu").index(s)
                       if s in ("float64", "float32", "bf16-emu") else 9)
        fig, axes = plt.subplots(2, 3, figsize=(11.0, 6.4), sharex=True, squeeze=False)
        cmap = plt.get_cmap("tab10")
        all_T = sorted(set(t["T"].tolist()))
        for gi, g in enumerate(GRADS):
            ax = axes[gi // 3][gi % 3]
            err = np.asarray(t[g + "_rel_rms"], dtype=float)
            for k, im in enumerate(impls):
                sel = t["impl"] == im
                Ts = np.array(sorted(set(t["T"][sel].tolist())))
                vals = [err[sel][t["T"][sel] == T] for T in Ts]
                fin = [v[np.isfinite(v)] for v in vals]
                med = np.array([np.median(v) if v.size else np.nan for v in fin])
                lo = np.array([np.min(v) if v.size else np.nan for v in fin])
                hi = np.array([np.max(v) if v.size else np.nan for v in fin])
                label = im
                if np.any(np.isfinite(med)) and not np.any(med > 0):
                    label += f" (exactly 0: the truth itself; drawn at {ZERO_AT:.0e})"
                ax.plot(Ts, np.maximum(med, ZERO_AT), color=cmap(k % 10), marker="os^"[k % 3], ms=3.5, lw=1.5,
                        label=label if gi == 0 else "_" + label)
                ax.fill_between(Ts, np.maximum(lo, ZERO_AT), np.maximum(hi, ZERO_AT), color=cmap(k % 10), alpha=0.12,
                                lw=0)
            ax.set_xscale("log")
            ax.set_yscale("log")
            if len(all_T) == 1:
                ax.set_xlim(all_T[0] / 1.6, all_T[0] * 1.6)
            ax.set_title(g)
            if gi // 3 == 1:
                ax.set_xlabel("sequence length $T$ (tokens)")
            if gi % 3 == 0:
                ax.set_ylabel("relative RMS error vs truth")
        axes[0][0].legend(fontsize=7, loc="best")
        fig.suptitle("KDA gradient parity (backward of the recurrence) by implementation")
        fs.panel_note(axes[1][0], "truth: " + truth_by_T(t))
        fs.label_footer(fig, f)
        fig.tight_layout()
        return fs.save(fig, a.out_dir, "parity_backward")


if __name__ == "__main__":
    sys.exit(fs.run(main))
