#!/usr/bin/python3
"""Prints what each kdalab results file holds: root attributes and every table's shape.

Usage: /usr/bin/python3 scripts/summary.py results/*.h5
"""
import sys

import h5py


def main(paths):
    for p in paths:
        with h5py.File(p, "r") as f:
            a = f.attrs
            print(f"{p}: {a['software']} {a['software_version']} git {a['git_sha']}, {a['date']}, seed {a['seed']}")
            print(f"  command: {a['command_line']}")

            def show(name, obj):
                if isinstance(obj, h5py.Dataset):
                    print(f"  {name:50s} {str(obj.shape):>12s}  [{obj.attrs.get('units', '?')}]")

            f.visititems(show)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
