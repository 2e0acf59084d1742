#!/usr/bin/env python3
"""Exit 0 when two kdalab results files hold the same results, timing columns aside; else one line per difference.

Same: every group and dataset, each dataset's dtype, shape and values bit for bit (NaN included), and every attribute,
except datasets whose `units` attribute is "s" (wall times), decode-cost's note made from them, and the root attributes that describe one run rather than
its results (date, command_line, host, device, merged_shards, merged_subcommand, and config's "out").
Usage: same_results.py A.h5 B.h5
"""
import json
import sys

import h5py
import numpy as np

RUN_ATTRS = {"date", "command_line", "host", "device", "merged_shards", "merged_subcommand"}


def content(path):
    out = {}
    with h5py.File(path, "r") as f:
        def attrs(name, obj):
            for k, v in obj.attrs.items():
                if name == "/" and k in RUN_ATTRS:
                    continue
                if name == "/" and k == "config":
                    c = json.loads(v)
                    c.pop("out", None)
                    v = json.dumps(c, sort_keys=True)
                if name == "/decode_cost/cpu" and k == "note":  # made from the CPU rows' timings
                    v = "from timings"
                out[f"{name}@{k}"] = v.decode() if isinstance(v, bytes) else str(v)

        def visit(name, obj):
            name = "/" + name
            attrs(name, obj)
            if isinstance(obj, h5py.Dataset):
                if obj.attrs.get("units") in ("s", b"s"):
                    out[name] = "timing"
                    return
                a = obj[()]
                if a.dtype.kind in "fiu":
                    out[name] = f"{a.dtype}{a.shape}:" + np.ascontiguousarray(a).tobytes().hex()
                else:
                    out[name] = f"{a.dtype.kind}{a.shape}:" + repr([x.decode() if isinstance(x, bytes) else x for x in np.ravel(a)])
            else:
                out[name] = "group"

        attrs("/", f)
        f.visititems(visit)
    return out


def main():
    a, b = content(sys.argv[1]), content(sys.argv[2])
    diff = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    for k in diff:
        print(f"differs: {k}: {str(a.get(k, '(absent)'))[:120]} vs {str(b.get(k, '(absent)'))[:120]}")
    print(f"same_results: {len(a)} entries compared, {len(diff)} differ")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
