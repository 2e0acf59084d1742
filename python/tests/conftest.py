"""Shared fixtures of the kdalab Python tests: where the repository and the golden fixtures are."""
import os
import pathlib

import pytest

ROOT = pathlib.Path(os.environ.get("KDALAB_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
GOLDEN = ROOT / "data" / "golden"


@pytest.fixture(scope="session")
def golden():
    """Path of a golden fixture file by op name (data/golden/<op>.h5)."""
    def path(op):
        p = GOLDEN / f"{op}.h5"
        assert p.is_file(), f"golden fixture {p} is missing"
        return str(p)
    return path
