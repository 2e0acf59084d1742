"""What bench's torch baseline scripts (torch_mla_decode.py, torch_mla_prefill.py) share: their command line's checks
(made before torch is imported, so that bad arguments cost nothing and say so in one line, exit 2), kdalab's output
rule (the folder must exist and be writable, an existing file is replaced only with --force, no output is one of the
others, each is written whole or not at all), the torch import (one line, exit 3, without torch or a CUDA device) and
the timing (median of CUDA events)."""
import argparse
import json
import os
import sys

INT32_MAX = 2 ** 31 - 1


class Parser(argparse.ArgumentParser):
    """argparse with kdalab's bad-usage rule: one line "<prog>: error: <why>" on stderr, exit 2."""

    def error(self, message):
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def shape_arg(fields):
    """An argparse type for a shape of three fields (e.g. "B:T:H"): integers >= 1, the last <= 256, each <= 2^31 - 1
    (the kernels count tokens in 32-bit integers)."""
    def parse(text):
        parts = text.split(":")
        # ASCII decimal digits only, as kdalab bench reads its shapes (int() alone also takes "2_048", spaces and
        # other scripts' digits)
        vals = [int(x) for x in parts] if all(x.isascii() and x.isdigit() for x in parts) else []
        if len(vals) != 3 or min(vals) < 1 or vals[2] > 256 or max(vals) > INT32_MAX:
            raise argparse.ArgumentTypeError(f"shape '{text}'; accepted: {fields}, integers >= 1, "
                                             f"{fields.split(':')[-1]} <= 256, each <= {INT32_MAX}")
        return tuple(vals)
    return parse


def check_outputs(parser, outs, force):
    """`outs`: (option name, path) pairs. Refuses (parser.error) an empty name, a folder, a missing or unwritable
    folder, an existing file without `force`, and two outputs that are one file."""
    seen = {}
    for name, path in outs:
        if not path:
            parser.error(f"{name} is empty; accepted: a file name")
        folder = os.path.dirname(path) or "."
        if os.path.isdir(path):
            parser.error(f"{name} '{path}' is a folder; accepted: a file name")
        if not os.path.isdir(folder):
            parser.error(f"{name} '{path}': folder '{folder}' does not exist; create it first")
        if not os.access(folder, os.W_OK | os.X_OK):
            parser.error(f"{name} '{path}': folder '{folder}' is not writable")
        if os.path.lexists(path) and not force:
            parser.error(f"{name} '{path}' exists; use --force to replace it")
        real = os.path.realpath(path)
        if real in seen:
            parser.error(f"{name} '{path}' is {seen[real]} too; accepted: different files")
        seen[real] = name


def write_json(path, obj):
    """Writes obj to path whole or not at all (a temporary file beside it, then renamed over it)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "w") as fh:
            json.dump(obj, fh, indent=1)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def cuda_torch(prog):
    """torch, with a CUDA device; else one line "<prog>: cannot run here: ..." and exit 3."""
    try:
        import torch
    except ImportError as e:
        sys.stderr.write(f"{prog}: cannot run here: needs torch ({e})\n")
        sys.exit(3)
    if not torch.cuda.is_available():
        sys.stderr.write(f"{prog}: cannot run here: torch sees no CUDA device\n")
        sys.exit(3)
    return torch


def time_ms(f, warmup=20, iters=100):
    """Median time of the CUDA callable f by CUDA events: `warmup` untimed calls, then `iters` calls each timed
    alone; milliseconds."""
    import torch
    for _ in range(warmup):
        f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        f()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    ts.sort()
    return ts[len(ts) // 2]
