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


def refused(match, fn, *args, **kw):
    with pytest.raises(kdalab.Error, match=match) as e:
        fn(*args, **kw)
    assert isinstance(e.value, ValueError) and "\n" not in str(e.value)


def test_recall_tasks_refuse_more_tokens_than_their_bound_before_allocating():
    # 2^33 x 2^32 tokens wrap around to 0 in a 64-bit size: without the bound, no array and writes past it
    refused(r"n = 8589934592 examples of seq_len = 4294967296 .* accepted: n x seq_len <= 268435456",
            kdalab.palindrome, 2**33, 2**32, 32, 1)
    refused(r"stack: n = 3 examples of seq_len = 134217728", kdalab.stack_task, 3, 2**27, 200, 64, 1)
    refused(r"mqar: n = 1000000 examples of seq_len = 1000000", kdalab.mqar, 10**6, 10**6, 4, 8192, 1)
    assert kdalab.palindrome(2**20, 2**8, 32, 1)["inputs"].shape == (2**20, 2**8)  # the bound itself is accepted


def test_stack_task_refuses_a_stack_count_whose_token_range_overflows():
    # 2 + 2 S wrapped around for S >= 2^62 and passed the vocabulary check
    refused(r"num_stacks = 4611686018427387904; accepted: vocab > 2 \+ 2 num_stacks$",
            kdalab.stack_task, 1, 8, 3, 2**62, 1)
    refused(r"num_stacks = 9223372036854775807", kdalab.stack_task, 1, 8, 2**63 - 1, 2**63 - 1, 1)


def test_stack_task_takes_any_stack_count_its_vocabulary_holds():
    S = 2**61  # every stack a token of its own: only the stacks an example touches are held
    d = kdalab.stack_task(2, 8, 2**63 - 1, S, 1)
    ops = d["inputs"][:, ::2]
    assert ((ops >= 2) & (ops < 2 + 2 * S)).all() and (d["inputs"][:, 1::2] >= 2 + 2 * S).all()


def test_mqar_with_every_key_of_the_vocabulary_is_fast():
    # N = vocab / 2 - 1 keys: every key token, drawn without replacement (a linear search per draw was O(N^2))
    import time
    N = 2**17 - 1
    t0 = time.perf_counter()
    d = kdalab.mqar(1, 4 * (N + 1), N, 2**18, 1, power_a=1.0)
    assert time.perf_counter() - t0 < 10  # about 0.1 s; minutes with the linear search
    assert sorted(d["inputs"][0, : 2 * N : 2].tolist()) == list(range(1, N + 1))


def test_mqar_names_a_tiny_or_negative_power_a_with_its_value():
    # its shortest text: printed with a fixed 6 decimals, -1e-9 read "-0.000000"
    refused(r"mqar: power_a = -1e-09; accepted: \(0, 1\]$", kdalab.mqar, 1, 64, 4, 256, 1, power_a=-1e-9)
    refused(r"mqar: power_a = nan; accepted", kdalab.mqar, 1, 64, 4, 256, 1, power_a=float("nan"))


@pytest.mark.parametrize("call, says", [
    (lambda: kdalab.mqar(1, 64, 4, 256, -1), r"mqar: seed = -1; accepted: an integer in \[0, 2\^64 - 1\]"),
    (lambda: kdalab.palindrome(1, 64, 32, 2**64), r"palindrome: seed = 18446744073709551616; accepted"),
    (lambda: kdalab.stack_task(1.5, 64, 200, 64, 1), r"stack_task: n = 1.5 \(float\); accepted: an integer in \[1, "),
    (lambda: kdalab.mqar(None, 64, 4, 256, 1), r"mqar: n = None \(NoneType\)"),
    (lambda: kdalab.mqar(1, [64], 4, 256, 1), r"mqar: seq_len = \[64\] \(list\)"),
    (lambda: kdalab.mqar(True, 64, 4, 256, 1), r"mqar: n = True \(bool\)"),
    (lambda: kdalab.palindrome(1, 64, "32", 1), r"palindrome: vocab = '32' \(str\)"),
    (lambda: kdalab.palindrome(1, 64, 2**63, 1), r"palindrome: vocab = 9223372036854775808; accepted: an integer in "
                                                 r"\[1, 2\^63 - 1\]"),
    (lambda: kdalab.stack_task(1, 64, 200, -64, 1), r"stack_task: num_stacks = -64; accepted"),
    (lambda: kdalab.mqar(1, 64, 0, 256, 1), r"mqar: num_kv_pairs = 0; accepted"),
    (lambda: kdalab.mqar(1, 64, 4, 256, 1, power_a="0.5"), r"mqar: power_a = '0.5' \(str\); accepted: a number in "
                                                         r"\(0, 1\]"),
    (lambda: kdalab.mqar(1, 64, 4, 256, 1, power_a=None), r"mqar: power_a = None \(NoneType\)"),
    (lambda: kdalab.mqar(1, 64, 4, 256, 1, random_non_queries="no"), r"mqar: random_non_queries = 'no' \(str\); "
                                                                    r"accepted: True or False"),
])
def test_recall_tasks_name_a_bad_argument_its_value_and_the_accepted_range(call, says):
    refused(says, call)


def test_recall_tasks_take_numpy_scalars_and_the_extreme_seeds():
    a = kdalab.mqar(np.int64(2), np.int32(64), np.uint8(4), np.int64(256), np.uint64(2**64 - 1))
    b = kdalab.mqar(2, 64, 4, 256, 2**64 - 1)
    assert a["checksum"] == b["checksum"] and a["seed"] == 2**64 - 1
    assert kdalab.palindrome(1, 64, 32, 0)["seed"] == 0
    c = kdalab.mqar(2, 64, 4, 256, 3, power_a=np.float32(0.5), random_non_queries=np.bool_(False))["checksum"]
    assert c == kdalab.mqar(2, 64, 4, 256, 3, power_a=0.5, random_non_queries=False)["checksum"]
    assert kdalab.mqar(2, 64, 4, 256, 3, power_a=1)["checksum"] == kdalab.mqar(2, 64, 4, 256, 3, power_a=1.0)["checksum"]


@pytest.mark.parametrize("make", [
    lambda n: kdalab.mqar(n, 64, 4, 256, 11),
    lambda n: kdalab.palindrome(n, 32, 256, 11),
    lambda n: kdalab.stack_task(n, 32, 256, 8, 11),
])
def test_a_split_of_m_examples_is_the_first_m_of_a_longer_split(make):
    """Prefix-stable generators: train_recall's check for a scored position reads the first 64 examples of a split
    for the whole split."""
    long, short = make(500), make(64)
    for key in ("inputs", "targets"):
        assert np.array_equal(long[key][:64], short[key]), key
