"""`kdalab verify` catches planted faults: numpy candidates that each break one thing are caught by the case or
property meant for them, and the correct numpy candidate passes every case (so no check fires spuriously)."""
import numpy as np
import pytest

import kdalab

from kdalab.verify import run
from kdalab.verify.candidates import numpy_kda, numpy_mla_decode

CHUNK = 16  # the chunk size the faults are planted against


def future_leak_in_last_partial_chunk(q, k, v, g, beta, *, scale, initial_state=None, cu_seqlens=None):
    """Outputs inside the trailing partial chunk read the last token's value (a token of their future)."""
    o, S = numpy_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens)
    T = o.shape[1]
    start = T - T % CHUNK
    if T % CHUNK:
        o[:, start:T - 1] += 1e-3 * v[:, T - 1:T]
    return o, S


def kv_state_read_as_vk(q, k, v, g, beta, *, scale, initial_state=None, cu_seqlens=None):
    """The [K, V] state taken (and given back) as [V, K]."""
    s0 = None if initial_state is None else np.swapaxes(initial_state, -1, -2)
    o, S = numpy_kda(q, k, v, g, beta, scale=scale, initial_state=s0, cu_seqlens=cu_seqlens)
    return o, np.swapaxes(S, -1, -2)


def last_partial_chunk_dropped(q, k, v, g, beta, *, scale, initial_state=None, cu_seqlens=None):
    """Only whole chunks are processed: the trailing T % 16 tokens give zero output and leave the state alone."""
    T = q.shape[1]
    n = T - T % CHUNK
    o = np.zeros(v.shape)
    if n == 0:
        S = np.zeros((q.shape[0], v.shape[2], q.shape[3], v.shape[3])) if initial_state is None else \
            np.array(initial_state)
        return o, S
    o[:, :n], S = numpy_kda(q[:, :n], k[:, :n], v[:, :n], g[:, :n], beta[:, :n], scale=scale,
                           initial_state=initial_state, cu_seqlens=cu_seqlens)
    return o, S


def nan_on_collinear_keys(q, k, v, g, beta, *, scale, initial_state=None, cu_seqlens=None):
    """NaN wherever two keys of one 16-token chunk are (near-)collinear, as an unguarded inverse would give."""
    o, S = numpy_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens)
    B, T, H, _ = k.shape
    kn = k / np.linalg.norm(k, axis=-1, keepdims=True)
    for c0 in range(0, T, CHUNK):
        blk = kn[:, c0:c0 + CHUNK]
        cos = np.einsum("bthd,bshd->bhts", blk, blk)
        n = blk.shape[1]
        cos[:, :, np.arange(n), np.arange(n)] = 0
        if np.any(np.abs(cos) > 1 - 1e-9):
            o[:, c0:c0 + CHUNK] = np.nan
    return o, S


def varlen_boundary_off_by_one(q, k, v, g, beta, *, scale, initial_state=None, cu_seqlens=None):
    """Each inner sequence boundary of a varlen batch read one token late."""
    if cu_seqlens is not None:
        cu = np.array(cu_seqlens)
        cu[1:-1] = np.minimum(cu[1:-1] + 1, cu[-1])
        cu_seqlens = cu
    return numpy_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens)


def decode_state_to_neighbour_slot(q, k, v, g, beta, *, scale, initial_state=None, cu_seqlens=None):
    """A one-token (decode) call writes sequence b's final state into slot b + 1."""
    o, S = numpy_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens)
    if q.shape[1] == 1 and S.shape[0] > 1:
        S = np.roll(S, 1, axis=0)
    return o, S


def mla_decode_multi_token_not_causal(q, cache, cache_seqlens, *, scale):
    """Multi-token decode whose every query token reads the whole cache, the later query tokens included (a kernel
    that drops the causal mask among the s_q new tokens); one-token decode stays correct."""
    q = np.asarray(q, dtype=np.float64)
    if q.ndim == 3:
        return numpy_mla_decode(q, cache, cache_seqlens, scale=scale)
    s_q = q.shape[1]
    # each query token as a one-token decode over the whole cache: no mask among the s_q new tokens
    return np.stack([numpy_mla_decode(q[:, j], cache, cache_seqlens, scale=scale) for j in range(s_q)], axis=1)


def mla_decode_reads_past_the_length(q, cache, cache_seqlens, *, scale):
    """Multi-token decode whose queries each read one cache row past their own position (the last query past the
    sequence's length, where the cache has one), by a tiny weight: below the agreement budget, not below an exact
    check."""
    q = np.asarray(q, dtype=np.float64)
    o = numpy_mla_decode(q, cache, cache_seqlens, scale=scale)
    if q.ndim == 4:
        s_q = q.shape[1]
        for b, L in enumerate(cache_seqlens):
            for j in range(s_q):
                t = int(L) - s_q + j + 1
                if t < np.shape(cache)[1]:  # (the last query of a full cache has no row past it)
                    o[b, j] += 1e-14 * np.asarray(cache)[b, t]
    return o


def mla_decode_reads_one_token_short(q, cache, cache_seqlens, *, scale):
    """The MLA decode step attends over all but the newest cached token (when there is more than one)."""
    return numpy_mla_decode(q, cache, np.maximum(np.asarray(cache_seqlens) - 1, 1), scale=scale)


# fault -> the cases meant to catch it (each must fail with the expected verdict kind)
FAULTS = {
    future_leak_in_last_partial_chunk: ({"causal/T70-P66", "causal/T63-P62"}, "property broken"),
    kv_state_read_as_vk: ({"layout/state-roundtrip"}, "over budget"),
    last_partial_chunk_dropped: ({"agree/T15", "agree/T17", "agree/T65", "agree/T127"}, "over budget"),
    nan_on_collinear_keys: ({"adv/collinear-keys", "adv/repeated-keys"}, "property broken"),
    varlen_boundary_off_by_one: ({"varlen/pack", "adv/varlen-short"}, None),
    decode_state_to_neighbour_slot: ({"decode/B2-T20", "agree/T1", "layout/state-roundtrip"}, "over budget"),
}


@pytest.fixture(scope="module")
def correct():
    return {r.case: r for r in run(numpy_kda, "kda", printer=None).results}


def test_correct_numpy_candidate_passes_every_case(correct):
    bad = [f"{r.case}: {r.verdict} {r.detail}" for r in correct.values() if not r.passed and r.kind != "not applicable"]
    assert not bad, "\n".join(bad)
    na = {n for n, r in correct.items() if r.kind == "not applicable"}
    assert na <= {n for n in correct if n.startswith("grad/") and n != "grad/causal"}, na
    assert correct["grad/causal"].passed


def test_correct_numpy_candidate_declared_bf16_passes_every_case():
    rep = run(numpy_kda, "kda", adapter="canonical:precision=bf16", printer=None)
    bad = [f"{r.case}: {r.verdict} {r.detail}" for r in rep.results if not r.passed and r.kind != "not applicable"]
    assert not bad, "\n".join(bad)


def test_correct_numpy_mla_decode_passes_every_case():
    rep = run(numpy_mla_decode, "mla_decode", printer=None)
    assert all(r.passed for r in rep.results), [(r.case, r.verdict, r.detail) for r in rep.results]


@pytest.mark.parametrize("fault", list(FAULTS), ids=[f.__name__ for f in FAULTS])
def test_planted_fault_is_caught_by_its_case(fault, correct):
    meant, kind = FAULTS[fault]
    results = {r.case: r for r in run(fault, "kda", printer=None).results}
    for name in meant:
        r = results[name]
        assert not r.passed and r.kind in ("over budget", "property broken"), (name, r.verdict, r.detail)
        if kind:
            assert r.kind == kind, (name, r.verdict, r.detail)
    # whatever else fails is a real consequence of the fault: the correct candidate passes those cases
    for name, r in results.items():
        if not r.passed and r.kind != "not applicable":
            assert correct[name].passed, name


def test_multi_token_decode_without_the_causal_mask_among_the_new_tokens_is_caught():
    rep = run(mla_decode_multi_token_not_causal, "mla_decode", printer=None)
    r = {x.case: x for x in rep.results}
    for name in ("mla/mtp2", "mla/mtp4", "mla/mtp4-sharp"):
        assert r[name].kind == "over budget", (name, r[name].kind)
    assert r["mla/mtp-causal"].kind == "property broken", r["mla/mtp-causal"].kind  # the exact check sees it too
    for name in ("mla/agree", "mla/len1", "mla/sharp"):  # one query token: nothing to mask
        assert r[name].kind == "within the noise of its precision", (name, r[name].kind)


def test_multi_token_decode_reading_a_row_past_its_position_breaks_decode_causality():
    rep = run(mla_decode_reads_past_the_length, "mla_decode", cases=["mla/mtp4", "mla/mtp-causal"], printer=None)
    r = {x.case: x for x in rep.results}
    assert r["mla/mtp4"].kind == "within the noise of its precision"  # 1e-14 hides under the float64 budget
    assert r["mla/mtp-causal"].kind == "property broken", r["mla/mtp-causal"].kind


def test_mla_decode_fault_is_caught_by_agreement():
    rep = run(mla_decode_reads_one_token_short, "mla_decode", cases=["mla/agree", "mla/len1"], printer=None)
    r = {x.case: x for x in rep.results}
    assert r["mla/agree"].kind == "over budget"
    assert r["mla/len1"].kind == "over budget"  # lengths 9 and 2 are read short; length 1 is not


def with_backward(backward):
    def fn(*a, **kw):
        return numpy_kda(*a, **kw)
    fn.backward = backward
    return fn


def dk_with_wrong_sign(*a, **kw):
    d = numpy_kda.backward(*a, **kw)
    d["dk"] = -d["dk"]
    return d


def gradient_leaks_backwards_in_time(*a, **kw):
    """dg at t also receives dg at t - 1 (a gradient flowing to later inputs)."""
    d = numpy_kda.backward(*a, **kw)
    d["dg"][:, 1:] += 1e-3 * d["dg"][:, :-1]
    return d


def test_gradient_leak_is_caught_by_gradient_causality():
    rep = run(with_backward(gradient_leaks_backwards_in_time), "kda", cases=["grad/*"], printer=None)
    r = {x.case: x for x in rep.results}
    assert r["grad/causal"].kind == "property broken" and "dg is nonzero at t = 7" in r["grad/causal"].detail


@pytest.mark.skipif(not hasattr(kdalab, "kda_recurrent_backward"), reason="no backward bindings in this kdalab")
def test_gradient_with_wrong_sign_is_caught_by_gradient_agreement():
    rep = run(with_backward(dk_with_wrong_sign), "kda", cases=["grad/*"], printer=None)
    r = {x.case: x for x in rep.results}
    assert r["grad/agree"].kind == "over budget" and r["grad/agree-hv2h"].kind == "over budget"
    for name in ("grad/repeated-keys", "grad/collinear-keys", "grad/no-decay", "grad/long-memory"):
        assert r[name].kind == "over budget", (name, r[name].kind, r[name].detail)
    assert r["grad/causal"].passed


def test_gradient_agreement_is_not_applicable_without_backward_bindings_or_a_candidate_backward():
    rep = run(lambda *a, **kw: numpy_kda(*a, **kw), "kda", cases=["grad/*"], printer=None)
    assert len(rep.results) == 7 and [r.kind for r in rep.results] == ["not applicable"] * 7
    assert all("backward" in r.detail for r in rep.results)
