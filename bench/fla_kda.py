#!/usr/bin/env python3
"""fla peer harness for KDA: times fla's Triton KDA kernels in the same GPU session as kdalab
and writes fla's outputs on the anchor-kda cases as `kdalab check --op kda` input files.

kdalab's own harness around a peer; it imports fla (fla-org/flash-linear-attention) from --fla-path
(default peers/fla-src, a git-ignored copy of the `fla/` package) and never builds, copies or changes it.
It loads only fla.ops.kda (bare parent packages fla, fla.ops, fla.modules: their __init__ files import
every op, fla.layers and fla.models, i.e. einops and transformers), which needs torch, triton and
packaging; if that fails it falls back to the ordinary `import fla.ops.kda` (--full-import forces it).

  python3 bench/fla_kda.py [--fla-path peers/fla-src] [--json OUT.json] [--check-dir DIR] [--force]
                           [--ops kda-prefill,kda-decode,check,kda-backward] [--time-budget S] [--prewarm N]
                           [--dry-run]

Outputs (kdalab's rule): --json's folder must exist and be writable; --check-dir is created if missing
(its parent folder must exist and be writable). An existing --json file, or an existing check file in
--check-dir (fla_kda_B<B>_T<T>_H<H>.h5, only with --ops check), is never overwritten without --force:
one line on stderr naming the option and the path, exit 2, nothing written. --dry-run makes the same
checks (arguments, --fla-path, outputs), prints the plan and exits without importing torch or fla. An op or a
shape given twice, a shape field above 2^31 - 1, and a shapes option (--prefill-shapes, --decode-shapes,
--backward-shapes) set for an op that --ops does not name are usage errors too (exit 2): none would be timed as given.

What it runs (bf16 in/out, fp32 state, D = d_k = d_v = 128 only: kdalab bench's D = 64 and D = 256 rows
(" D=64" / " D=256" keys) have no fla peer, and a D field in --prefill-shapes / --decode-shapes /
--backward-shapes is refused;
scale = D^-1/2, everything fused the way
kdalab's kernels take it: raw gate logits, raw beta logits, un-normalised q/k):
  kda-prefill: fla.ops.kda.chunk_kda(q, k, v, g_raw, beta_raw, A_log=, dt_bias=, initial_state=S0,
      output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
      use_beta_sigmoid_in_kernel=True, lower_bound=-5, safe_gate=True, chunk_size=64): the K3 gate
      g = -5 Sigmoid(exp(A_log) (g_raw + bias)) is computed in fla's gate+chunk-cumsum kernel.
  kda-decode: fla.ops.kda.fused_recurrent.fused_recurrent_kda_fwd(..., initial_state=S,
      inplace_final_state=True, out=o, same fusions): one token per sequence, state updated in place
      (the call vLLM-style decoding uses; the public fused_recurrent_kda copies the state instead).
  kda-backward (only when --ops names it: fla's backward compiles and autotunes for several minutes): the
      kda-prefill call above with requires_grad on q, k, v, g_raw, beta_raw, A_log, bias and S0, then
      torch.autograd.grad((o, S), those leaves, (do, dS)): fla's forward + backward, the pair that
      `kdalab bench --op kda-backward` times as its row time. Upstream gradients do N(0,1) bf16 [B,T,HV,D] and
      dS N(0,1) fp32 [B,HV,D,D] (bench/fla_kda_bwd.py's distribution), drawn after the inputs from the same
      generator. Per shape also: fla's forward alone with autograd recording (the same call, grad enabled,
      no backward), "bwd_est_ms" = forward + backward - forward (an estimate of the backward alone: fla's
      backward is not a separate public call), and "peak_bytes" = torch.cuda.max_memory_allocated() over one
      forward + backward after the first call (inputs and upstream gradients included, as kdalab's
      peak_bytes includes them; "inputs_bytes" = torch.cuda.memory_allocated() before the call). The JSON
      value is the forward + backward time (graph or eager as below; the meta says which).
  Shapes: the `kdalab bench` defaults (experiments/bench.cpp parse_shapes), keys
      "<op> B=.. T=.. H=.. HV=..". Inputs as bench.cpp draws them: q, k, v, g_raw, beta_raw N(0,1) bf16,
      A_log U(0,1) [HV] fp32, bias U(0,1) [HV, D] fp32, S0 = 0.1 N(0,1) [B, HV, D, D] fp32.
  Timing: CUDA events, median of --iters after a first call (Triton JIT + autotune) and --warmup calls.
      Two numbers per shape: "eager" (events around one Python call, what a Python caller sees) and
      "graph" (the call captured --reps times in one CUDA graph, replay time / reps: the GPU time, the
      closest match to kdalab's C++ launches). The JSON value is --report (default graph; eager where
      capture failed, said in the meta).
  check: for each anchor-kda case (B, T, H) in (1,17,1) (3,64,1) (1,300,2) (1,1000,4) (1,4096,2):
      anchor-kda inputs drawn with torch (seed --seed + 1000 + case index), fla chunk_kda as above, one
      HDF5 file per case in the format of README.md "Checking your own kernel's tensors": q, k, v, g
      (logits), beta (logits) as float32 holding bf16 (format = "bf16"), A_log [H], bias [H, D], S0
      (layout KV), candidates o (bf16) and S (fp32, layout KV); root attributes scale, l2norm_qk = 1,
      gate = "k3", g_min = -5, beta = "logits". Also printed: fla's relative RMS against a float64
      recurrence computed here (a preview; the numbers of record come from `kdalab check`).

Output JSON (--json): {"kda-prefill B=1 T=8192 H=64 HV=64": ms, ..., "kda-backward B=1 T=8192 H=64 HV=64": ms}
for `kdalab bench --peer-json`,
plus one object under "_fla_meta" (fla commit, versions, flags, eager and graph times; ignored by
kdalab bench). Rewritten after every shape, so a run cut short keeps what it measured. One file per
peer: `kdalab bench --peer-json fla_kda.json --peer-json torch_mla.json` merges them (bench/gpu_pass.sh
runs this script when peers/fla-src is there). Expect ~5-8 min on an H200 for everything (most of it
Triton compiling and autotuning): give --time-budget inside a device command's limit.

Compile cost: fla's Triton kernels are JIT-compiled and autotuned per head count (H, HV are
compile-time constants): ~100 compiles per (H, HV), one after another in one process. --prewarm N
first runs every shape once in N parallel worker processes, grouped by (H, HV); in the workers
Triton's benchmark runs each autotune config once untimed, so they only fill Triton's on-disk compile
cache. The main process then loads the binaries and autotunes with real timings, alone on the GPU
(FLA_CACHE_RESULTS=0: no autotune result is reused from disk).

Exit codes: 0 done (shapes skipped for the time budget are listed), 2 bad usage, fla not found at
--fla-path or an output path refused, 1 an unexpected failure (torch or CUDA missing, fla import error).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import types

# kdalab bench defaults (experiments/bench.cpp parse_shapes): (B, T, H, HV)
PREFILL_SHAPES = [(1, 8192, 64, 64), (1, 8192, 96, 96), (1, 65536, 32, 32), (4, 4096, 16, 32)]
DECODE_SHAPES = [(256, 1, 32, 32), (1, 1, 32, 32), (64, 1, 32, 64)]
BACKWARD_SHAPES = [(1, 8192, 64, 64), (1, 8192, 96, 96), (1, 65536, 32, 32)]
# the anchor-kda accuracy cases: (B, T, H), HV = H
ANCHOR_CASES = [(1, 17, 1), (3, 64, 1), (1, 300, 2), (1, 1000, 4), (1, 4096, 2)]
D = 128
G_MIN = -5.0
OPS = ("kda-prefill", "kda-decode", "check", "kda-backward")
DEFAULT_OPS = ("kda-prefill", "kda-decode", "check")  # kda-backward only when asked (minutes of Triton autotuning)

T0 = time.monotonic()


def log(*a):
    print(*a, flush=True)


def elapsed():
    return time.monotonic() - T0


class UsageError(Exception):
    """Bad command-line input: one line on stderr, exit 2."""


# ---------------------------------------------------------------------------------------------------
# command line


def _is_number(x):
    """True for a field of ASCII digits only ('²' is isdigit() but not a number int() takes)."""
    x = x.strip()
    return x.isascii() and x.isdecimal()


def parse_shapes(text, op):
    """'B:T:H[:HV],...' -> [(B, T, H, HV)]; decode shapes need T = 1 (as kdalab bench --shapes). D = 128 only:
    a 5th (D) field is refused (kdalab bench's D = 64 / 256 rows have no fla peer here)."""
    out = []
    for item in text.split(","):
        f = item.strip().split(":")
        if len(f) == 5:
            raise UsageError(f"--{op}-shapes: '{item}' has a D field; this script times D = d_k = d_v = 128 only "
                             "(kdalab bench's D = 64 / 256 rows have no fla peer); give B:T:H or B:T:H:HV")
        if len(f) not in (3, 4) or not all(_is_number(x) for x in f):
            raise UsageError(f"--{op}-shapes: '{item}' is not B:T:H or B:T:H:HV with positive integers")
        v = [int(x) for x in f]
        if len(v) == 3:
            v.append(v[2])
        B, T, H, HV = v
        if max(v) > 2**31 - 1:
            raise UsageError(f"--{op}-shapes: '{item}' has a field above 2^31 - 1; accepted: B:T:H[:HV] with each "
                             "field in [1, 2^31 - 1] (as kdalab bench --shapes)")
        if min(B, T, H, HV) < 1 or HV % H:
            raise UsageError(f"--{op}-shapes: '{item}' needs B, T, H >= 1 and HV a multiple of H")
        if op == "decode" and T != 1:
            raise UsageError(f"--decode-shapes: decode shapes have T = 1, got '{item}'")
        if (B, T, H, HV) in out:  # its JSON key would be written twice, the later time replacing the earlier
            raise UsageError(f"--{op}-shapes: '{item.strip()}' is given more than once; give each shape once")
        out.append((B, T, H, HV))
    return out


def build_parser():
    p = argparse.ArgumentParser(
        prog="bench/fla_kda.py",
        description="Time fla's chunk_kda / fused_recurrent_kda on the kdalab bench shapes (JSON for "
                    "`kdalab bench --peer-json`) and write fla's outputs on the anchor-kda cases as "
                    "`kdalab check --op kda` files. Runs on a CUDA GPU with torch + triton; see the file "
                    "header for what exactly is called.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--fla-path", default="peers/fla-src",
                   help="folder holding fla's python package (PATH/fla/ops/kda), or the fla package folder itself")
    p.add_argument("--json", default="fla_kda.json",
                   help="peer timings out: {key: ms} + _fla_meta; its folder must exist; an existing file "
                        "only with --force")
    p.add_argument("--check-dir", default="fla_check",
                   help="folder for the kdalab check input files (--ops check; created if missing, its parent "
                        "must exist); existing fla_kda_B*_T*_H*.h5 files in it only with --force")
    p.add_argument("--force", action="store_true",
                   help="overwrite an existing --json file and existing check files in --check-dir")
    p.add_argument("--ops", default=",".join(DEFAULT_OPS),
                   help="comma-separated subset of " + ", ".join(OPS) + " (kda-backward: fla's forward + backward, "
                        "its first call compiles and autotunes for minutes; e.g. --ops kda-backward alone)")
    p.add_argument("--prefill-shapes", default=",".join("%d:%d:%d:%d" % s for s in PREFILL_SHAPES),
                   help="B:T:H[:HV],...; the default is kdalab bench's")
    p.add_argument("--decode-shapes", default=",".join("%d:%d:%d:%d" % s for s in DECODE_SHAPES),
                   help="B:1:H[:HV],...; the default is kdalab bench's")
    p.add_argument("--backward-shapes", default=",".join("%d:%d:%d:%d" % s for s in BACKWARD_SHAPES),
                   help="B:T:H[:HV],... of the kda-backward rows; the default is kdalab bench's")
    p.add_argument("--iters", type=int, default=100, help="timed calls (or graph replays) per shape, median reported (>= 1; use 50 or more for the record)")
    p.add_argument("--warmup", type=int, default=10, help="untimed calls after the first (compile + autotune) call")
    p.add_argument("--reps", type=int, default=0,
                   help="calls per CUDA graph (0: decode 100, prefill enough for >= 2 ms per replay, at most 20)")
    p.add_argument("--report", choices=("graph", "eager"), default="graph",
                   help="which time goes into the JSON value (both are printed and kept in _fla_meta)")
    p.add_argument("--seed", type=int, default=20261129,
                   help="base seed (timing inputs and anchor cases), an integer in [0, 2^63 - 1]")
    p.add_argument("--no-safe-gate", action="store_true",
                   help="chunk_kda safe_gate=False (fla's token-parallel intra-chunk path; still lower_bound = -5)")
    p.add_argument("--chunk-size", type=int, default=64, choices=(32, 64), help="chunk_kda chunk_size")
    p.add_argument("--dispatch", action="store_true",
                   help="keep fla's backend dispatch (FlashKDA / TileLang if installed); default: "
                        "FLA_DISABLE_BACKEND_DISPATCH=1, i.e. fla's own Triton kernels")
    p.add_argument("--full-import", action="store_true",
                   help="import the whole fla package (fla/__init__ pulls fla.layers / fla.models, i.e. "
                        "transformers, einops); default: load only fla.ops.kda under bare parent packages")
    p.add_argument("--prewarm", type=int, default=-1,
                   help="parallel worker processes that JIT-compile and autotune every shape first "
                        "(-1: one per distinct (H, HV), at most 8; 0: off)")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds, finite and > 0; shapes not started by then are skipped and listed (default: no "
                        "limit). "
                        "Leave ~60 s of a device command's limit for start-up and writing")
    p.add_argument("--dry-run", action="store_true",
                   help="check the arguments, the fla path and the output paths, print the plan, exit "
                        "(imports neither torch nor fla)")
    p.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    return p


def resolve_fla_root(path):
    """The folder that holds the `fla` package (so that `import fla.ops.kda` works from it)."""
    if os.path.isfile(os.path.join(path, "fla", "ops", "kda", "__init__.py")):
        return os.path.abspath(path)
    if os.path.isfile(os.path.join(path, "ops", "kda", "__init__.py")) and os.path.basename(
            os.path.normpath(path)) == "fla":
        return os.path.abspath(os.path.dirname(os.path.normpath(path)))
    raise UsageError(
        f"--fla-path '{path}': fla not found there (looked for '{os.path.join(path, 'fla', 'ops', 'kda', '__init__.py')}'); "
        "give the folder that holds fla's python package `fla/` (e.g. peers/fla-src, made with "
        "`git archive HEAD fla | tar -x -C peers/fla-src` from a clone of fla-org/flash-linear-attention)")


def check_file_name(case):
    """The check file written for anchor-kda case (B, T, H) inside --check-dir."""
    return "fla_kda_B%d_T%d_H%d.h5" % case


def _writable_folder(option, path, folder):
    """UsageError unless `folder` (where `path` of --`option` goes) is an existing, writable folder."""
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise UsageError(f"--{option} '{path}': '{folder}' is a file, not a folder; give a path inside a folder")
    if not os.path.isdir(folder):
        raise UsageError(f"--{option} '{path}': folder '{folder}' does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"--{option} '{path}': folder '{folder}' is not writable")


def check_folder(option, d, names, force):
    """kdalab's output rule for the folder `d` of --`option` that the check files `names` go into: an existing
    folder must be writable and hold none of them unless `force`; a missing one is created later, inside an
    existing, writable folder. Returns the plan line; raises UsageError naming the option and path."""
    if os.path.exists(d):
        if not os.path.isdir(d):
            raise UsageError(f"--{option} '{d}' exists and is not a folder; give a folder (created if missing)")
        _writable_folder(option, d, d)
        there = [n for n in names if os.path.lexists(os.path.join(d, n))]
        if there and not force:
            raise UsageError(f"--{option} '{d}': {os.path.join(d, there[0])} already exists"
                             + (f" (and {len(there) - 1} more check files)" if len(there) > 1 else "")
                             + "; pass --force to overwrite them (the old files are kept otherwise)")
        return (f"check files -> {d}/ ({len(there)} of {len(names)} overwritten: --force)" if there
                else f"check files -> {d}/ (new)")
    _writable_folder(option, d, os.path.dirname(os.path.normpath(d)) or ".")
    return f"check files -> {d}/ (folder created)"


def check_outputs(args, ops):
    """kdalab's output rule for --json and (with --ops check) --check-dir, before anything is run or written:
    the folder exists and is writable, an existing file is overwritten only with --force. Returns a list of
    plan lines ('PATH (new)' / 'PATH (overwritten: --force)'). Raises UsageError naming the option and path."""
    plan = []
    j = args.json
    if not j:
        raise UsageError("--json: an output file name is required (e.g. --json fla_kda.json)")
    if os.path.isdir(j):
        raise UsageError(f"--json '{j}' is a directory; give a file name ending in .json")
    _writable_folder("json", j, os.path.dirname(j) or ".")
    if os.path.lexists(j) and not args.force:
        raise UsageError(f"--json '{j}' already exists; pass --force to overwrite it (the old file is kept otherwise)")
    plan.append(f"json -> {j} ({'overwritten: --force' if os.path.lexists(j) else 'new'})")
    if "check" in ops:
        d = args.check_dir
        if not d:
            raise UsageError("--check-dir: a folder name is required (e.g. --check-dir fla_check)")
        plan.append(check_folder("check-dir", d, [check_file_name(c) for c in ANCHOR_CASES], args.force))
    return plan


def fla_commit(root):
    """The fla commit recorded beside the copy (PATH/COMMIT), or 'unknown'."""
    for f in (os.path.join(root, "COMMIT"), os.path.join(root, "fla", "COMMIT")):
        if os.path.isfile(f):
            with open(f) as fh:
                return fh.read().strip() or "unknown"
    return "unknown"


def fla_environment(dispatch):
    """Before fla is imported: fla's own Triton kernels unless --dispatch, no on-disk reuse of autotune timings."""
    if not dispatch:
        os.environ["FLA_DISABLE_BACKEND_DISPATCH"] = "1"
    os.environ["FLA_CACHE_RESULTS"] = "0"


def fla_settings(root, commit, args, ops=None):
    """The log line naming fla's folder and commit, the ops (when given) and the chunk_kda settings of args."""
    what = f"; ops {','.join(ops)}" if ops else ""
    return (f"fla from {root} (commit {commit}){what}; chunk_size {args.chunk_size}, "
            f"safe_gate {not args.no_safe_gate}, backend dispatch {'on' if args.dispatch else 'off'}")


def case_name(case):
    """'B=.. T=.. H=..' of one (B, T, H) case."""
    return "B=%d T=%d H=%d" % case


def end_dry_run(plan):
    """The end of --dry-run: the output plan, a line each, and that nothing was done. Returns exit code 0."""
    for line in plan:
        log(line)
    log("dry run: nothing was imported, run or written")
    return 0


# ---------------------------------------------------------------------------------------------------
# loading fla


def fla_version(root):
    """fla.__version__ as fla/__init__.py states it (read, not executed), or '0+unknown'."""
    import re
    try:
        with open(os.path.join(root, "fla", "__init__.py")) as fh:
            m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", fh.read(), re.M)
        return m.group(1) if m else "0+unknown"
    except OSError:
        return "0+unknown"


def load_fla(root, full_import):
    """Imports fla.ops.kda from `root` and returns (chunk_kda, fused_recurrent_kda_fwd, how).

    Default: registers bare package modules for `fla`, `fla.ops` and `fla.modules` (their __init__
    files import every op, fla.layers and fla.models, hence transformers / einops; `fla` gets only
    __version__, read from fla/__init__.py), then imports fla.ops.kda, which needs only torch, triton
    and packaging from outside fla.
    """
    if root not in sys.path:
        sys.path.insert(0, root)
    import importlib
    import importlib.machinery
    how = "full package import"
    if not full_import:
        how = "bare parent packages fla, fla.ops, fla.modules; fla.ops.kda imported"
        for name in ("fla", "fla.ops", "fla.modules"):
            if name in sys.modules:
                continue
            folder = os.path.join(root, *name.split("."))
            m = types.ModuleType(name)
            m.__path__ = [folder]
            m.__package__ = name
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [folder]
            m.__spec__ = spec
            if name == "fla":  # fla.utils._decorators does `from .. import __version__`
                m.__version__ = fla_version(root)
            sys.modules[name] = m
            if "." in name:
                parent, child = name.rsplit(".", 1)
                setattr(sys.modules[parent], child, m)
    try:
        kda = importlib.import_module("fla.ops.kda")
    except Exception as e:
        if full_import:
            raise
        # fall back to the ordinary package import (needs what fla/__init__ pulls in: einops, ...)
        for n in [n for n in sys.modules if n == "fla" or n.startswith("fla.")]:
            del sys.modules[n]
        kda = importlib.import_module("fla.ops.kda")
        how = f"full package import (the bare load failed: {type(e).__name__}: {e})"
    fr = importlib.import_module("fla.ops.kda.fused_recurrent")
    return kda.chunk_kda, fr.fused_recurrent_kda_fwd, how


def top_level_modules():
    """Top-level names of the non-stdlib modules loaded so far (fla and __main__ left out)."""
    std = set(getattr(sys, "stdlib_module_names", ()))
    return {n.split(".")[0] for n, m in list(sys.modules.items())
            if m is not None and n.split(".")[0] not in std and not n.startswith("_") and n.split(".")[0] != "fla"}


# ---------------------------------------------------------------------------------------------------
# the harness proper (torch imported lazily so that --help / --dry-run / errors need no torch)


class Harness:
    def __init__(self, args, root):
        import torch
        self.torch = torch
        self.args = args
        self.root = root
        before = top_level_modules()
        self.chunk_kda, self.recurrent_fwd, self.import_how = load_fla(root, args.full_import)
        # third-party packages that importing fla.ops.kda added beyond torch (and what torch had loaded)
        self.fla_needs = sorted(top_level_modules() - before)
        import inspect
        params = inspect.signature(self.recurrent_fwd).parameters
        self.decode_inplace = "inplace_final_state" in params and "out" in params
        self.dev = torch.device("cuda")
        self.safe_gate = not args.no_safe_gate
        self.graph_error = None  # after one failed capture, no more captures (eager times only)

    # -- inputs ---------------------------------------------------------------------------------
    def inputs(self, B, T, H, HV, seed):
        """bench.cpp's distribution (also the anchor-kda cases'): q, k [B,T,H,D], v, g_raw [B,T,HV,D],
        beta_raw [B,T,HV] N(0,1) in bf16; A_log [HV], bias [HV,D] U(0,1) fp32; S0 [B,HV,D,D] 0.1 N(0,1) fp32."""
        torch = self.torch
        gen = torch.Generator(device=self.dev)
        gen.manual_seed(seed)

        def normal_bf16(*shape):
            # drawn in fp32, rounded once to bf16 (round to nearest even)
            return torch.randn(*shape, generator=gen, device=self.dev, dtype=torch.float32).to(torch.bfloat16)

        x = dict(q=normal_bf16(B, T, H, D), k=normal_bf16(B, T, H, D), v=normal_bf16(B, T, HV, D),
                 g=normal_bf16(B, T, HV, D), beta=normal_bf16(B, T, HV))
        x["A_log"] = torch.rand(HV, generator=gen, device=self.dev, dtype=torch.float32)
        x["bias"] = torch.rand(HV, D, generator=gen, device=self.dev, dtype=torch.float32)
        x["S0"] = 0.1 * torch.randn(B, HV, D, D, generator=gen, device=self.dev, dtype=torch.float32)
        self._gen = gen  # inputs_with_upstream draws the upstream gradients next
        return x

    def inputs_with_upstream(self, B, T, H, HV, seed):
        """inputs() and, drawn next from the same generator, the upstream gradients of kda-backward (bench.cpp's
        distribution, bench/fla_kda_bwd.py's too): do [B,T,HV,D] N(0,1) in bf16, dS [B,HV,D,D] N(0,1) fp32."""
        torch = self.torch
        x = self.inputs(B, T, H, HV, seed)
        gen = self._gen
        x["do"] = torch.randn(B, T, HV, D, generator=gen, device=self.dev, dtype=torch.float32).to(torch.bfloat16)
        x["dS"] = torch.randn(B, HV, D, D, generator=gen, device=self.dev, dtype=torch.float32)
        return x

    # -- the fla calls --------------------------------------------------------------------------
    def prefill_call(self, x):
        """fla chunk_kda with the K3 gate, q/k L2Norm and beta sigmoid in fla's kernels; returns (o, S)."""
        return self.chunk_kda(
            x["q"], x["k"], x["v"], x["g"], x["beta"],
            scale=D ** -0.5, initial_state=x["S0"], output_final_state=True,
            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
            A_log=x["A_log"], dt_bias=x["bias"].reshape(-1), lower_bound=G_MIN, safe_gate=self.safe_gate,
            chunk_size=self.args.chunk_size)

    GRAD_LEAVES = ("q", "k", "v", "g", "beta", "A_log", "bias", "S0")

    def grad_leaves(self, x):
        """The inputs that chunk_kda differentiates as autograd leaves (requires_grad) for backward_call: detached
        views of x's tensors (the same memory: nothing is written to them, and the peak memory counts them once)."""
        return {n: x[n].detach().requires_grad_(True) for n in self.GRAD_LEAVES}

    def backward_call(self, x, leaves, backward=True):
        """fla's chunk_kda forward on `leaves` with autograd recording (the prefill call's fusions), then, when
        `backward`, its backward: torch.autograd.grad((o, S), leaves, (do, dS)) (returns the gradients; nothing is
        accumulated into .grad, so repeated calls do the same work)."""
        torch = self.torch
        with torch.enable_grad():
            o, S = self.chunk_kda(
                leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
                scale=D ** -0.5, initial_state=leaves["S0"], output_final_state=True,
                use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                A_log=leaves["A_log"], dt_bias=leaves["bias"].reshape(-1), lower_bound=G_MIN,
                safe_gate=self.safe_gate, chunk_size=self.args.chunk_size)
            if not backward:
                return o, S
            # .to() is a no-op where fla's dtypes are the upstream's (bf16 o, fp32 S)
            return torch.autograd.grad((o, S), [leaves[n] for n in self.GRAD_LEAVES],
                                       (x["do"].to(o.dtype), x["dS"].to(S.dtype)), allow_unused=True)

    def decode_call(self, x, S, o):
        """One fla decode step (T = 1 per sequence), state S updated in place, output into o."""
        if self.decode_inplace:
            return self.recurrent_fwd(
                q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], A_log=x["A_log"],
                dt_bias=x["bias"].reshape(-1), initial_state=S, scale=D ** -0.5, output_final_state=False,
                inplace_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                use_beta_sigmoid_in_kernel=True, lower_bound=G_MIN, out=o)
        # fallback (older/newer fla without the in-place arguments): new state tensor each call
        return self.recurrent_fwd(
            q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], A_log=x["A_log"],
            dt_bias=x["bias"].reshape(-1), initial_state=S, scale=D ** -0.5, output_final_state=True,
            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
            lower_bound=G_MIN)

    # -- timing ---------------------------------------------------------------------------------
    def time_eager(self, fn, iters):
        torch = self.torch
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ts = []
        torch.cuda.synchronize()
        for _ in range(iters):
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            ts.append(e0.elapsed_time(e1))
        ts.sort()
        return ts[len(ts) // 2], ts[0]

    def time_graph(self, fn, reps, iters):
        """fn captured `reps` times in one CUDA graph; (median, min) of replay time / reps."""
        torch = self.torch
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                fn()
        g.replay()
        torch.cuda.synchronize()
        med, mn = self.time_eager(g.replay, iters)
        del g
        return med / reps, mn / reps

    def measure(self, fn, is_decode):
        """First call (compile + autotune), warm-up, eager timing, graph timing. Returns a dict."""
        torch = self.torch
        a = self.args
        t = time.monotonic()
        fn()
        torch.cuda.synchronize()
        first_s = time.monotonic() - t
        for _ in range(a.warmup):
            fn()
        torch.cuda.synchronize()
        eager, eager_min = self.time_eager(fn, a.iters)
        r = dict(first_call_s=round(first_s, 2), eager_ms=eager, eager_min_ms=eager_min)
        reps = a.reps or (100 if is_decode else max(1, min(20, math.ceil(2.0 / max(eager, 1e-3)))))
        if self.graph_error is not None:
            r.update(graph_ms=None, graph_error="not tried: an earlier capture failed: " + self.graph_error)
            return r
        try:
            graph, graph_min = self.time_graph(fn, reps, a.iters)
            r.update(graph_ms=graph, graph_min_ms=graph_min, graph_reps=reps)
        except Exception as e:  # capture not possible: keep the eager number, say why
            self.graph_error = f"{type(e).__name__}: {e}"[:300]
            r.update(graph_ms=None, graph_error=self.graph_error)
            torch.cuda.synchronize()
        return r

    def bench_prefill(self, shape):
        torch = self.torch
        B, T, H, HV = shape
        x = self.inputs(B, T, H, HV, self.args.seed)
        with torch.no_grad():
            r = self.measure(lambda: self.prefill_call(x), is_decode=False)
        nq, nv = B * T * H * D, B * T * HV * D
        r["bytes"] = 2.0 * (2 * nq + 3 * nv + B * T * HV) + 2.0 * 4.0 * B * HV * D * D  # as bench.cpp
        x = None  # free the inputs before the next shape
        torch.cuda.empty_cache()
        return r

    def bench_backward(self, shape):
        """kda-backward: fla's forward + backward (measure(): first call, warm-up, eager, CUDA graph), its
        peak memory over one forward + backward, and its forward alone with autograd recording (the same
        measure()); bwd_est_ms = forward + backward - forward (eager and graph), an estimate."""
        torch = self.torch
        B, T, H, HV = shape
        x = self.inputs_with_upstream(B, T, H, HV, self.args.seed)
        leaves = self.grad_leaves(x)
        r = self.measure(lambda: self.backward_call(x, leaves), is_decode=False)
        # peak memory of one forward + backward, after the first call (Triton's autotuning allocates its own buffers)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        r["inputs_bytes"] = torch.cuda.memory_allocated()
        grads = self.backward_call(x, leaves)
        torch.cuda.synchronize()
        r["peak_bytes"] = torch.cuda.max_memory_allocated()
        grads = None
        f = self.measure(lambda: self.backward_call(x, leaves, backward=False), is_decode=False)
        r["forward"] = f
        r["fwd_eager_ms"] = f["eager_ms"]
        r["fwd_graph_ms"] = f.get("graph_ms")
        r["bwd_est_eager_ms"] = r["eager_ms"] - f["eager_ms"]
        r["bwd_est_graph_ms"] = (r["graph_ms"] - f["graph_ms"]) if r.get("graph_ms") and f.get("graph_ms") else None
        r["bwd_est_note"] = ("forward + backward minus the forward alone (grad enabled, same inputs): an estimate of "
                             "fla's backward, which has no separate public call")
        r["bytes"] = backward_row_bytes(B, T, H, HV)
        x = leaves = grads = None  # free the inputs before the next shape
        torch.cuda.empty_cache()
        return r

    def bench_decode(self, shape):
        torch = self.torch
        B, _, H, HV = shape
        x = self.inputs(B, 1, H, HV, self.args.seed)
        S = x["S0"].clone()
        o = torch.empty(B, 1, HV, D, device=self.dev, dtype=torch.bfloat16)
        with torch.no_grad():
            r = self.measure(lambda: self.decode_call(x, S, o), is_decode=True)
        if not self.decode_inplace:
            r["note"] = "fused_recurrent_kda_fwd without inplace_final_state/out: state copied each call"
        ns, nq, nv = B * HV * D * D, B * H * D, B * HV * D
        r["bytes"] = 2.0 * 4.0 * ns + 2.0 * (2 * nq + 3 * nv + B * HV)  # as bench.cpp
        x = S = o = None
        torch.cuda.empty_cache()
        return r

    # -- accuracy -------------------------------------------------------------------------------
    def truth_f64(self, x, scale):
        """Float64 recurrence (K3 report Eq. 1, docs/equations.md section 1) on exactly x's values:
        q, k L2-normalised, g = g_min Sigmoid(exp(A_log) (g_raw + bias)), beta = Sigmoid(beta_raw),
        S_t = S' + beta k (v - S'^T k)^T with S' = Diag(exp g) S_{t-1}, o_t = scale S_t^T q_t.
        Value head hv reads key head hv // (HV / H). Returns (o [B,T,HV,D], S [B,HV,D,D])."""
        torch = self.torch
        f = torch.float64
        q, k = x["q"].to(f), x["k"].to(f)
        q = q / q.norm(dim=-1, keepdim=True)
        k = k / k.norm(dim=-1, keepdim=True)
        HV, H = x["v"].shape[2], q.shape[2]
        if HV != H:
            q, k = q.repeat_interleave(HV // H, dim=2), k.repeat_interleave(HV // H, dim=2)
        v = x["v"].to(f)
        g = G_MIN * torch.sigmoid(x["A_log"].to(f).exp()[:, None] * (x["g"].to(f) + x["bias"].to(f)))
        alpha = g.exp()
        beta = torch.sigmoid(x["beta"].to(f))
        S = x["S0"].to(f).clone()
        o = torch.empty_like(v)
        for t in range(q.shape[1]):
            S = S * alpha[:, t, :, :, None]
            kt = k[:, t]
            pred = torch.einsum("bhk,bhkv->bhv", kt, S)
            S = S + torch.einsum("bhk,bhv->bhkv", kt, beta[:, t, :, None] * (v[:, t] - pred))
            o[:, t] = scale * torch.einsum("bhk,bhkv->bhv", q[:, t], S)
        return o, S

    def check_case(self, case, index, out_dir, meta):
        torch = self.torch
        B, T, H = case
        seed = self.args.seed + 1000 + index
        x = self.inputs(B, T, H, H, seed)
        with torch.no_grad():
            t = time.monotonic()
            o, S = self.prefill_call(x)  # first call: compile + autotune
            torch.cuda.synchronize()
            first_s = time.monotonic() - t
            o2, S2 = self.prefill_call(x)
            torch.cuda.synchronize()
        deterministic = bool(torch.equal(o, o2) and torch.equal(S, S2))
        o_ref, S_ref = self.truth_f64(x, D ** -0.5)

        def rel(a, b):
            return float((a.double() - b).norm() / b.norm())

        def f32(t):
            return t.detach().float().cpu().numpy()

        arrays = {n: f32(x[n]) for n in ("q", "k", "v", "g", "beta", "A_log", "bias", "S0")}
        arrays["o"] = f32(o2)
        arrays["S"] = f32(S2)
        attrs = dict(meta)
        attrs.update(case=f"B={B} T={T} H={H} HV={H} D={D}", seed=seed,
                     generator="anchor-kda distribution, drawn with torch.Generator(cuda)")
        path = os.path.join(out_dir, check_file_name(case))
        write_check_file(path, arrays, scale=D ** -0.5, g_min=G_MIN, extra_attrs=attrs)
        r = dict(file=path, rel_rms_o_vs_f64=rel(o2, o_ref), rel_rms_S_vs_f64=rel(S2, S_ref),
                 first_call_s=round(first_s, 2), deterministic=deterministic,
                 nonfinite_o=int((~torch.isfinite(o2)).sum()), bytes_on_disk=os.path.getsize(path))
        del x, o, S, o2, S2, o_ref, S_ref
        torch.cuda.empty_cache()
        return r


# ---------------------------------------------------------------------------------------------------
# files (no torch: numpy + h5py only)


def write_h5_check(path, datasets, scale, g_min, attrs, gzip_level):
    """An HDF5 file of `kdalab check` (docs/check-format.md) with fla's KDA conventions: the K3 gate with this
    g_min, L2-normalised q/k, beta as logits, this scale; then attrs (numbers as numbers, the rest as strings).

    datasets: [(name, numpy array, dataset attributes, e.g. {"format": "bf16"} or {"layout": "KV"})] in file
    order; float32 and float64 arrays are stored as they are, other dtypes as float32. Written to PATH.tmp.<pid>
    and renamed, datasets of >= 4096 values gzip (gzip_level) + shuffle compressed."""
    import h5py
    import numpy as np
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with h5py.File(tmp, "w") as f:
            for name, a, dattrs in datasets:
                a = np.ascontiguousarray(a)
                if a.dtype not in (np.float32, np.float64):
                    a = a.astype(np.float32)
                kw = dict(compression="gzip", compression_opts=gzip_level, shuffle=True) if a.size >= 4096 else {}
                d = f.create_dataset(name, data=a, **kw)
                for k, v in dattrs.items():
                    d.attrs[k] = v
            f.attrs["scale"] = float(scale)
            f.attrs["l2norm_qk"] = 1
            f.attrs["gate"] = "k3"
            f.attrs["g_min"] = float(g_min)
            f.attrs["beta"] = "logits"
            for k, v in attrs.items():
                f.attrs[k] = v if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_check_file(path, arrays, scale, g_min, extra_attrs):
    """One `kdalab check --op kda` input file (README.md "Checking your own kernel's tensors").

    arrays: numpy float32 q, k [B,T,H,D]; v, g (gate logits) [B,T,HV,D]; beta (logits) [B,T,HV];
    A_log [HV]; bias [HV,D]; S0 [B,HV,D,D]; o [B,T,HV,D] (bf16 values); S [B,HV,D,D] (fp32).
    Stored as float32 (write_h5_check), gzip level 4 (bf16-in-float32 halves; the device returns files of at
    most 16 MiB)."""
    import numpy as np
    bf16 = ("q", "k", "v", "g", "beta", "o")
    order = ("q", "k", "v", "g", "beta", "A_log", "bias", "S0", "o", "S")
    datasets = [(name, np.ascontiguousarray(arrays[name], dtype=np.float32),
                 {"format": "bf16"} if name in bf16 else {"layout": "KV"} if name in ("S0", "S") else {})
                for name in order]
    write_h5_check(path, datasets, scale, g_min, extra_attrs, gzip_level=4)


def _finite_json(x):
    """NaN/Inf (e.g. a non-finite fla output's rel RMS) -> null: strict JSON that kdalab bench can read."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite_json(v) for v in x]
    return x


def write_json(path, data):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(_finite_json(data), fh, indent=1, default=str, allow_nan=False)
        fh.write("\n")
    os.replace(tmp, path)


def key_of(op, s):
    return f"{op} B={s[0]} T={s[1]} H={s[2]} HV={s[3]}"


BACKWARD_TIMING = ("chunk_kda forward + torch.autograd.grad backward per call (JSON value), the forward alone with "
                   "autograd recording, bwd_est = their difference (an estimate), peak_bytes = "
                   "torch.cuda.max_memory_allocated over one forward + backward; each time from a CUDA graph of "
                   "the calls where capture works, else eager CUDA events (--report; the meta says which)")


def backward_row_bytes(B, T, H, HV):
    """The bytes of a `kdalab bench --op kda-backward` row (experiments/bench.cpp: the prefill's model plus
    backward_model, D = 128, fused gate), so that TB/s here and there divide the same bytes."""
    M, P = B * T, D // 64
    nq, nv, nb, ns = M * H * D, M * HV * D, M * HV, B * HV * D * D
    n = (T + 63) // 64
    prefill = 2.0 * (2 * nq + 3 * nv + nb) + 2.0 * 4.0 * ns
    bwd_in = 2.0 * (2 * nq + 3 * nv + nb) + 4.0 * (HV + HV * D) + 4.0 * 2 * ns
    bwd_out = 2.0 * (2 * nq + 2 * nv + nb) + 4.0 * (HV + HV * D) + 4.0 * ns
    ws = M * (2 * H * D + 2 * H + HV * D + HV) + B * n * HV * D * D + P * M * HV * (3 * D + 1) + M * HV + M * HV * D
    return prefill + bwd_in + bwd_out + 2.0 * 4.0 * ws


# ---------------------------------------------------------------------------------------------------
# prewarm: JIT-compile + autotune every shape once in parallel worker processes


def worker_main(args, root):
    """--_worker 'op:B:T:H:HV;...': run each shape once (fills Triton's on-disk compile cache)."""
    h = Harness(args, root)
    torch = h.torch
    try:  # compile every autotune config, run each once, skip the timing (the main process times them)
        import triton.testing

        def run_once(fn, *a, quantiles=None, **k):
            fn()
            torch.cuda.synchronize()
            return [1.0] * len(quantiles) if quantiles else 1.0
        triton.testing.do_bench = run_once
    except Exception as e:
        log(f"worker {os.getpid()}: Triton's benchmark not replaced ({e}); autotuning in full")
    failed = 0
    for item in args._worker.split(";"):
        op, B, T, H, HV = item.split(":")
        B, T, H, HV = int(B), int(T), int(H), int(HV)
        t = time.monotonic()
        try:
            if op == "backward":  # forward + backward with autograd: fla's backward kernels compile too
                x = h.inputs_with_upstream(B, T, H, HV, args.seed)
                h.backward_call(x, h.grad_leaves(x))
            else:
                x = h.inputs(B, T, H, HV, args.seed)
                with torch.no_grad():
                    if op == "decode":
                        S, o = x["S0"].clone(), torch.empty(B, 1, HV, D, device=h.dev, dtype=torch.bfloat16)
                        h.decode_call(x, S, o)
                    else:
                        h.prefill_call(x)
            torch.cuda.synchronize()
            log(f"worker {os.getpid()}: {item} {time.monotonic() - t:.1f} s")
        except Exception as e:  # go on with the other shapes; the main process reports the failure itself
            failed += 1
            log(f"worker {os.getpid()}: {item} failed: {type(e).__name__}: {e}")
        x = S = o = None
        torch.cuda.empty_cache()
    return 1 if failed else 0


def prewarm(args, root, jobs, budget_left):
    """jobs: [(op, B, T, H, HV)]. Groups them by (H, HV) (compile-time constants in fla's kernels)
    and runs the groups in parallel worker processes. Returns a summary dict for the meta."""
    groups = {}
    for j in jobs:
        groups.setdefault((j[3], j[4]), []).append(j)
    n = args.prewarm if args.prewarm > 0 else min(len(groups), 8, max(1, (os.cpu_count() or 2) // 2))
    n = max(1, min(n, len(groups)))
    buckets = [[] for _ in range(n)]
    for i, (_, g) in enumerate(sorted(groups.items())):
        buckets[i % n].extend(g)
    t = time.monotonic()
    procs = []
    logdir = tempfile.mkdtemp(prefix="fla_prewarm_")
    for i, b in enumerate(buckets):
        spec = ";".join("%s:%d:%d:%d:%d" % j for j in b)
        cmd = [sys.executable, os.path.abspath(__file__), "--fla-path", root, "--_worker", spec,
               "--chunk-size", str(args.chunk_size), "--seed", str(args.seed)]
        if args.no_safe_gate:
            cmd.append("--no-safe-gate")
        if args.full_import:
            cmd.append("--full-import")
        lf = open(os.path.join(logdir, f"w{i}.log"), "w")
        procs.append((subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT), lf, spec))
    log(f"prewarm: {len(jobs)} shapes in {len(groups)} head configurations, {n} worker processes "
        f"(logs {logdir})")
    timeout = budget_left if budget_left is not None else 900.0
    failed = []
    for p, lf, spec in procs:
        left = max(1.0, timeout - (time.monotonic() - t))
        try:
            rc = p.wait(timeout=left)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rc = "timeout"
        lf.close()
        if rc != 0:
            failed.append(spec)
            with open(lf.name) as fh:
                tail = fh.read()[-1500:]
            log(f"prewarm worker for {spec} ended with {rc}; its log ends:\n{tail}")
    wall = time.monotonic() - t
    log(f"prewarm: done in {wall:.0f} s" + (f", {len(failed)} worker(s) failed" if failed else ""))
    return dict(workers=n, head_configs=len(groups), wall_s=round(wall, 1), failed=failed)


# ---------------------------------------------------------------------------------------------------


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:  # the arguments, then --fla-path, then the output paths (kdalab bench's order: --out last)
        ops = [o.strip() for o in args.ops.split(",") if o.strip()]
        bad = [o for o in ops if o not in OPS]
        if bad or not ops:
            raise UsageError(f"--ops '{args.ops}': unknown {bad or 'empty'}; accepted: comma-separated {', '.join(OPS)}")
        twice = next((o for i, o in enumerate(ops) if o in ops[:i]), None)
        if twice:
            raise UsageError(f"--ops '{args.ops}': {twice} is given more than once; give each op once")
        # a shapes option of an op that does not run, set to other than its default, would be ignored: refused
        for name, op in (("prefill_shapes", "kda-prefill"), ("decode_shapes", "kda-decode"),
                         ("backward_shapes", "kda-backward")):
            if getattr(args, name) != parser.get_default(name) and op not in ops:
                raise UsageError(f"--{name.replace('_', '-')} applies to --ops {op} only; --ops is '{args.ops}' "
                                 f"(add {op} to --ops, or leave the option out)")
        prefill = parse_shapes(args.prefill_shapes, "prefill")
        decode = parse_shapes(args.decode_shapes, "decode")
        backward = parse_shapes(args.backward_shapes, "backward")
        if args.iters < 1 or args.warmup < 0 or args.reps < 0:
            raise UsageError(f"--iters {args.iters} / --warmup {args.warmup} / --reps {args.reps}: "
                             "accepted: --iters >= 1 (50 or more for the record), --warmup >= 0, --reps >= 0")
        if args.time_budget is not None and not (math.isfinite(args.time_budget) and args.time_budget > 0):
            raise UsageError(f"--time-budget {args.time_budget}: accepted: seconds, finite and > 0 (leave it out "
                             "for no limit)")
        if not 0 <= args.seed <= 2**63 - 1:
            raise UsageError(f"--seed {args.seed}: accepted: an integer in [0, 2^63 - 1]")
        root = resolve_fla_root(args.fla_path)
        plan = [] if args._worker else check_outputs(args, ops)  # a prewarm worker writes neither
    except UsageError as e:
        print(f"fla_kda.py: {e}", file=sys.stderr)
        return 2

    fla_environment(args.dispatch)

    if args._worker:
        return worker_main(args, root)

    commit = fla_commit(root)
    log(fla_settings(root, commit, args, ops))
    if args.dry_run:
        if "kda-prefill" in ops:
            log("prefill shapes: " + ", ".join(key_of("kda-prefill", s) for s in prefill))
        if "kda-decode" in ops:
            log("decode shapes: " + ", ".join(key_of("kda-decode", s) for s in decode))
        if "check" in ops:
            log("check cases: " + ", ".join(map(case_name, ANCHOR_CASES)))
        if "kda-backward" in ops:
            log("backward shapes: " + ", ".join(key_of("kda-backward", s) for s in backward))
            log("backward rows: " + BACKWARD_TIMING)
        return end_dry_run(plan)

    try:
        import torch
    except ImportError as e:
        print(f"fla_kda.py: torch is not importable ({e}); run this on the GPU machine", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("fla_kda.py: no CUDA device visible to torch; nothing was measured or written", file=sys.stderr)
        return 1
    budget = args.time_budget or None

    def over_budget():
        return budget is not None and elapsed() > budget

    if "check" in ops:
        import importlib.util
        if importlib.util.find_spec("h5py") is None:  # the check files need it: fail before any GPU work
            print("fla_kda.py: h5py is not importable; it writes the check files (or leave out --ops check)",
                  file=sys.stderr)
            return 1
        os.makedirs(args.check_dir, exist_ok=True)
    jdir = os.path.dirname(os.path.abspath(args.json))
    os.makedirs(jdir, exist_ok=True)

    # prewarm (compile in parallel), then everything in this process
    pre = None
    jobs = []
    if "kda-prefill" in ops:
        jobs += [("prefill",) + s for s in prefill]
    if "kda-decode" in ops:
        jobs += [("decode",) + s for s in decode]
    if "kda-backward" in ops:
        jobs += [("backward",) + s for s in backward]
    if "check" in ops:
        jobs += [("prefill", B, T, H, H) for (B, T, H) in ANCHOR_CASES]
    if args.prewarm != 0 and len({(j[3], j[4]) for j in jobs}) > 1:
        # at most 60% of what is left of the budget: the main process still autotunes and times
        pre = prewarm(args, root, jobs, None if budget is None else 0.6 * (budget - elapsed()))

    try:
        h = Harness(args, root)
    except Exception as e:
        import traceback
        traceback.print_exc()
        print(f"fla_kda.py: importing fla.ops.kda from '{root}' failed: {type(e).__name__}: {e} "
              "(try --full-import, or check the third-party modules it names)", file=sys.stderr)
        return 1
    import triton
    meta = dict(
        peer="fla (fla-org/flash-linear-attention), Triton kernels", fla_commit=commit, fla_path=root,
        fla_import=h.import_how, third_party_modules_fla_added=h.fla_needs,
        torch=torch.__version__, triton=triton.__version__, python=sys.version.split()[0],
        device=torch.cuda.get_device_name(0),
        prefill_call="chunk_kda(q, k, v, g_raw, beta_raw, A_log=, dt_bias=bias, initial_state=S0, "
                     "output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, "
                     f"use_beta_sigmoid_in_kernel=True, lower_bound={G_MIN}, safe_gate={h.safe_gate}, "
                     f"chunk_size={args.chunk_size})",
        backward_call=("chunk_kda(...) as prefill_call with requires_grad on q, k, v, g_raw, beta_raw, A_log, bias, "
                       "S0, then torch.autograd.grad((o, S), those, (do, dS)); do N(0,1) bf16, dS N(0,1) fp32")
        if "kda-backward" in ops else None,
        backward_timing=BACKWARD_TIMING if "kda-backward" in ops else None,
        decode_call=("fused_recurrent_kda_fwd(..., initial_state=S, inplace_final_state=True, out=o, "
                     "use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, "
                     f"lower_bound={G_MIN})") if h.decode_inplace else
                    "fused_recurrent_kda_fwd(..., output_final_state=True) (no in-place arguments in this fla)",
        env=dict(FLA_DISABLE_BACKEND_DISPATCH=os.environ.get("FLA_DISABLE_BACKEND_DISPATCH", "unset"),
                 FLA_CACHE_RESULTS="0"),
        timing=f"CUDA events; median of {args.iters} after the first call and {args.warmup} warm-up calls; "
               f"JSON value = {args.report} ms per call",
        seed=args.seed, prewarm=pre, results={}, skipped=[])
    out = {}
    log(f"fla.ops.kda loaded ({h.import_how}); third-party packages it imported beyond torch: "
        f"{', '.join(h.fla_needs) or 'none'}")
    log(f"device {meta['device']}, torch {meta['torch']}, triton {meta['triton']}; "
        f"{elapsed():.0f} s since start")

    def save():
        out["_fla_meta"] = meta
        write_json(args.json, out)

    save()
    hdr = f"{'key':<40} {'first s':>8} {'eager ms':>10} {'graph ms':>10} {'reps':>5} {'TB/s':>7}"
    for op, shapes, fn in (("kda-prefill", prefill, h.bench_prefill), ("kda-decode", decode, h.bench_decode),
                           ("kda-backward", backward, h.bench_backward)):
        if op not in ops:
            continue
        log(hdr)
        for s in shapes:
            key = key_of(op, s)
            if over_budget():
                meta["skipped"].append(key)
                log(f"{key:<40} skipped (time budget)")
                continue
            try:
                r = fn(s)
            except Exception as e:
                import traceback
                traceback.print_exc()
                meta["results"][key] = dict(error=f"{type(e).__name__}: {e}"[:500])
                log(f"{key:<40} FAILED: {type(e).__name__}: {e}")
                torch.cuda.empty_cache()
                save()
                continue
            ms = r["graph_ms"] if (args.report == "graph" and r.get("graph_ms")) else r["eager_ms"]
            r["reported"] = "graph" if ms == r.get("graph_ms") else "eager"
            r["TBps"] = r["bytes"] / (ms * 1e-3) / 1e12
            out[key] = ms
            meta["results"][key] = r
            g = f"{r['graph_ms']:10.4f} {r['graph_reps']:5d}" if r.get("graph_ms") else f"{'-':>10} {'-':>5}"
            log(f"{key:<40} {r['first_call_s']:8.1f} {r['eager_ms']:10.4f} {g} {r['TBps']:7.2f}"
                + ("" if r.get("graph_ms") else f"   (graph: {r.get('graph_error')})"))
            if op == "kda-backward":
                fwd = r["fwd_graph_ms"] if r["reported"] == "graph" and r.get("fwd_graph_ms") else r["fwd_eager_ms"]
                est = r["bwd_est_graph_ms"] if r["reported"] == "graph" and r.get("bwd_est_graph_ms") else \
                    r["bwd_est_eager_ms"]
                r["fwd_ms"], r["bwd_est_ms"] = fwd, est
                r["fwd_reported"] = "graph" if fwd == r.get("fwd_graph_ms") else "eager"
                r["bwd_est_reported"] = "graph" if est == r.get("bwd_est_graph_ms") else "eager"
                log(f"{'':<40} forward + backward {ms:.4f} ms ({r['reported']}), forward alone {fwd:.4f} ms "
                    f"({r['fwd_reported']}), backward {est:.4f} ms ({r['bwd_est_reported']}; an estimate: the difference); peak "
                    f"memory "
                    f"{r['peak_bytes'] / 1e9:.2f} GB (inputs {r['inputs_bytes'] / 1e9:.2f} GB)")
            save()

    if "check" in ops:
        fmeta = dict(peer="fla chunk_kda (Triton)", fla_commit=commit,
                     fla_call=meta["prefill_call"], torch=meta["torch"], triton=meta["triton"], device=meta["device"])
        log(f"{'check case':<26} {'first s':>8} {'o rel RMS vs f64':>17} {'S rel RMS vs f64':>17}  file")
        meta["check"] = {}
        for i, c in enumerate(ANCHOR_CASES):
            name = case_name(c)
            if over_budget():
                meta["skipped"].append("check " + name)
                log(f"{name:<26} skipped (time budget)")
                continue
            try:
                r = h.check_case(c, i, args.check_dir, fmeta)
            except Exception as e:
                import traceback
                traceback.print_exc()
                meta["check"][name] = dict(error=f"{type(e).__name__}: {e}"[:500])
                log(f"{name:<26} FAILED: {type(e).__name__}: {e}")
                save()
                continue
            meta["check"][name] = r
            log(f"{name:<26} {r['first_call_s']:8.1f} {r['rel_rms_o_vs_f64']:17.3e} {r['rel_rms_S_vs_f64']:17.3e}  "
                f"{r['file']} ({r['bytes_on_disk'] / 2**20:.1f} MiB){'' if r['deterministic'] else ' (NOT deterministic)'}"
                + (f" NON-FINITE o: {r['nonfinite_o']}" if r["nonfinite_o"] else ""))
            save()
        log("then, on the CPU machine: for f in <check-dir>/fla_kda_*.h5; do "
            "build/default/experiments/kdalab check --op kda --in $f --out ${f%.h5}.report.h5; done")
    save()
    if meta["skipped"]:
        log(f"skipped for the time budget ({args.time_budget:.0f} s): {', '.join(meta['skipped'])}")
    log(f"wrote {args.json}; {elapsed():.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
