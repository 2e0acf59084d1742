"""Shared fixtures of the kdalab Python tests: where the repository and the golden fixtures are; torch with a CUDA
device for the tests of the CUDA build."""
import os
import pathlib

import pytest

import kdalab

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


@pytest.fixture(scope="module")
def torch():
    """torch, for a CUDA build of kdalab on a machine where torch sees a GPU; the test is skipped otherwise."""
    if not kdalab.built_with_cuda:
        pytest.skip("kdalab was built without its CUDA kernels (KDALAB_CUDA=OFF)")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return torch
