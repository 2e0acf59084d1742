"""The token tasks of the trained recall experiment from Python (kdalab.mqar, palindrome, stack_task) are the C++
generators' bits: the checksums pinned in tests/numerics/test_recall_tasks.cpp, recomputed here from the arrays.
No torch needed."""
import numpy as np
import pytest

import kdalab

# the same constants as tests/numerics/test_recall_tasks.cpp
MQAR_CHECKSUM = 0x0E4911FD9C7448D1
PALINDROME_CHECKSUM = 0x23DD8C0701F18B07
STACK_CHECKSUM = 0x88329E7458386B2F


def fnv1a64(*arrays):
    h = 1469598103934665603
    for a in arrays:
        for b in np.ascontiguousarray(a, dtype="<i8").tobytes():
            h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


@pytest.mark.parametrize("make, pinned", [
    (lambda: kdalab.mqar(16, 64, 4, 8192, 1), MQAR_CHECKSUM),
    (lambda: kdalab.palindrome(8, 64, 32, 1), PALINDROME_CHECKSUM),
    (lambda: kdalab.stack_task(8, 64, 200, 64, 1), STACK_CHECKSUM),
])
def test_recall_tasks_return_the_cpp_generators_bits(make, pinned):
    d = make()
    assert d["inputs"].dtype == np.int64 and d["targets"].dtype == np.int64
    assert d["inputs"].shape == (d["n"], d["seq_len"]) == d["targets"].shape
    assert fnv1a64(d["inputs"], d["targets"]) == d["checksum"] == pinned
    again = make()
    assert np.array_equal(again["inputs"], d["inputs"]) and np.array_equal(again["targets"], d["targets"])


def test_mqar_scores_only_the_queries():
    d = kdalab.mqar(4, 64, 4, 512, 3)
    assert kdalab.IGNORE_INDEX == -100
    assert ((d["targets"] != -100).sum(axis=1) == 4).all()
    assert (d["targets"][d["targets"] != -100] >= 256).all()


def test_recall_tasks_refuse_bad_shapes_naming_them():
    with pytest.raises(kdalab.Error, match="seq_len = 63"):
        kdalab.mqar(4, 63, 4, 8192, 1)
    with pytest.raises(kdalab.Error, match="vocab = 130"):
        kdalab.stack_task(4, 64, 130, 64, 1)
    with pytest.raises(kdalab.Error, match="n = -1"):
        kdalab.palindrome(-1, 64, 32, 1)
