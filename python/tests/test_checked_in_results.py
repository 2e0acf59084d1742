"""The results files checked in under data/ (baselines, golden fixtures, trained-recall runs) name no machine's
folders in their attributes: a clone elsewhere has none of them. Read with /usr/bin/python3's h5py (the figures'
interpreter), so that the check runs wherever the figures do."""
import os
import subprocess

import pytest

from conftest import ROOT

SCAN = r"""
import glob, h5py, re, sys
machine = re.compile(r"(^|[\s'\"=:,\[])/(work|tmp|home|root|mnt|scratch)/")
found = []
for fn in sorted(glob.glob(sys.argv[1] + "/**/*.h5", recursive=True)):
    with h5py.File(fn, "r") as f:
        def check(name, obj):
            for k, v in obj.attrs.items():
                s = v.decode() if isinstance(v, bytes) else str(v)
                m = machine.search(s)
                if m:
                    found.append(f"{fn} {name}@{k}: ...{s[max(0, m.start() - 30):m.end() + 30]}...")
        check("/", f)
        f.visititems(check)
print("\n".join(found))
"""


def test_checked_in_results_name_no_machine_folders():
    py = "/usr/bin/python3"
    if not os.path.exists(py) or subprocess.run([py, "-c", "import h5py"]).returncode != 0:
        pytest.skip("/usr/bin/python3 lacks h5py")
    r = subprocess.run([py, "-c", SCAN, str(ROOT / "data")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", "attributes naming a machine's folders:\n" + r.stdout
