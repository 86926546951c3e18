"""flashlib.reference: the float64 oracle against a direct formula, its conventions and errors."""
import math
import warnings

import numpy as np
import pytest
import torch

from flashlib import reference
from flashlib.inputs import check_qkv
from flashlib.reference import attention_naive, attention_ref, causal_mask
from flashlib.testing import assert_close, attention_magnitudes

SHAPES = [(1, 17), (17, 1), (97, 130), (130, 97), (17, 17)]  # (Nq, Nk), Nq > Nk included


def randn(*shape, dtype=np.float64):
    return np.random.default_rng().standard_normal(shape).astype(dtype)


def direct(q, k, v, *, allowed=None, scale=None):
    """Textbook attention in extended precision, one query row at a time with explicit loops
    over heads: exp(s_j - max) / sum, out = sum_j p_j v_j. Empty rows: out 0, lse -inf."""
    q, k, v = (np.asarray(t, dtype=np.longdouble) for t in (q, k, v))
    B, H, Nq, D = q.shape
    group = H // k.shape[1]
    scale = 1 / math.sqrt(D) if scale is None else scale
    out = np.zeros(q.shape, dtype=np.longdouble)
    lse = np.full(q.shape[:-1], -np.inf, dtype=np.longdouble)
    for b in range(B):
        for h in range(H):
            kh, vh = k[b, h // group], v[b, h // group]                  # (Nk, D)
            for i in range(Nq):
                seen = np.ones(k.shape[2], bool) if allowed is None else allowed[b, h, i]
                if not seen.any():
                    continue
                s = (kh[seen] @ q[b, h, i]) * scale                       # (n_seen,)
                w = np.exp(s - s.max())
                out[b, h, i] = (w / w.sum()) @ vh[seen]
                lse[b, h, i] = s.max() + np.log(w.sum())
    return out, lse


def naive(q, k, v, *, allowed=None, scale=None):
    """The naive baseline in float64 (torch): softmax of masked scores, empty rows set to 0."""
    q, k, v = (torch.from_numpy(t) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if allowed is not None:
        s = s.masked_fill(~torch.from_numpy(np.ascontiguousarray(allowed)), -math.inf)
    out = torch.softmax(s, dim=-1).nan_to_num(0.0) @ v
    return out.numpy(), torch.logsumexp(s, dim=-1).numpy()


def check_against_direct(q, k, v, *, causal=False, scale=None, mask=None, allowed=None):
    out, lse = attention_ref(q, k, v, causal=causal, scale=scale, mask=mask)
    expected_out, expected_lse = direct(q, k, v, allowed=allowed, scale=scale)
    baseline_out, baseline_lse = naive(q, k, v, allowed=allowed, scale=scale)
    # the shared rule's floor too: float64 against float64 (or a long double that is float64 on
    # some CPUs) errs by whole ulps; 2x the naive error alone came to 0.97 of it in 20000 draws
    mags = attention_magnitudes(q, k, v, scale=scale,
                                mask=None if allowed is None else np.ascontiguousarray(allowed))
    assert_close(out, expected_out, baseline=baseline_out, name="out", magnitude=mags["out"])
    assert_close(lse, expected_lse, baseline=baseline_lse, name="lse", magnitude=mags["lse"])
    return out, lse


@pytest.mark.parametrize("Nq, Nk", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_matches_direct_formula(Nq, Nk, causal):
    q, k, v = randn(1, 3, Nq, 80), randn(1, 3, Nk, 80), randn(1, 3, Nk, 80)
    allowed = np.broadcast_to(causal_mask(Nq, Nk).numpy(), (1, 3, Nq, Nk)) if causal else None
    check_against_direct(q, k, v, causal=causal, allowed=allowed)


def test_attention_naive_is_the_same_attention_in_the_inputs_dtype():
    q, k, v = (torch.randn(2, 9, n, 80) for n in (130, 97, 97))
    k, v = k[:, :3], v[:, :3]
    out = attention_naive(q, k, v, causal=True)
    assert out.dtype == torch.float32 and not out.isnan().any()
    expected, _ = attention_ref(q, k, v, causal=True)
    baseline, _ = naive(*(t.numpy() for t in (q, k, v)), scale=None,
                        allowed=np.broadcast_to(causal_mask(130, 97).numpy(), (2, 9, 130, 97)))
    assert_close(out, expected, baseline=torch.from_numpy(baseline).float(), name="naive out")


def test_chunks_of_query_rows_give_the_same_result(monkeypatch):
    q, k, v = randn(2, 9, 97, 80), randn(2, 3, 130, 80), randn(2, 3, 130, 80)
    whole = attention_ref(q, k, v, causal=True)
    monkeypatch.setattr(reference, "CHUNK_ELEMENTS", 7 * 2 * 9 * 130)   # 7 rows per chunk
    chunked = attention_ref(q, k, v, causal=True)
    # float64 both ways, but BLAS may block a matmul of 7 rows differently from one of 97: the
    # sums round in another order, so allow the first-order rounding bound of the terms summed
    magnitude = attention_magnitudes(q, k, v, causal=True)
    for a, b, name in zip(chunked, whole, ("out", "lse")):
        assert_close(a, b, baseline=b, name=name, magnitude=magnitude[name])


def test_causal_is_bottom_right():
    # the module docstring's picture: seqlen_q=2, seqlen_k=4
    assert causal_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]
    assert causal_mask(4, 2).tolist() == [[False, False], [False, False], [True, False],
                                          [True, True]]
    assert torch.equal(causal_mask(5, 5), torch.ones(5, 5, dtype=torch.bool).tril())


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_rows_with_nothing_to_attend_are_zero_with_lse_minus_inf(kind):
    Nq, Nk = 130, 97                        # bottom-right: the first 33 query rows see no key
    q, k, v = randn(2, 9, Nq, 80), randn(2, 3, Nk, 80), randn(2, 3, Nk, 80)
    if kind == "torch":
        q, k, v = (torch.from_numpy(t) for t in (q, k, v))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, lse = attention_ref(q, k, v, causal=True)
    out, lse = np.asarray(out), np.asarray(lse)
    empty = Nq - Nk
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    assert (out[:, :, :empty] == 0).all() and np.isneginf(lse[:, :, :empty]).all()
    assert np.isfinite(lse[:, :, empty:]).all() and (np.abs(out[:, :, empty:]).sum(-1) > 0).all()


def test_grouped_query_heads_equal_repeated_heads():
    q, k, v = randn(2, 9, 17, 80), randn(2, 3, 97, 80), randn(2, 3, 97, 80)
    for causal in (False, True):
        out, lse = attention_ref(q, k, v, causal=causal)
        # query head h reads key/value head h // 3: repeat_interleave, not tile
        rep = [np.repeat(t, 3, axis=1) for t in (k, v)]
        out_rep, lse_rep = attention_ref(q, *rep, causal=causal)
        np.testing.assert_array_equal(out, out_rep)
        np.testing.assert_array_equal(lse, lse_rep)
        tiled_wrong, _ = attention_ref(q, *(np.tile(t, (1, 3, 1, 1)) for t in (k, v)))
        assert not np.allclose(out, tiled_wrong)


def test_mask_argument():
    rng = np.random.default_rng()
    Nq, Nk = 17, 97
    q, k, v = randn(2, 9, Nq, 80), randn(2, 3, Nk, 80), randn(2, 3, Nk, 80)
    mask = rng.random((2, 9, Nq, Nk)) < 0.3
    mask[0, 0, 5] = False                                    # one row with nothing to attend
    out, lse = check_against_direct(q, k, v, mask=mask, allowed=mask)
    assert (out[0, 0, 5] == 0).all() and np.isneginf(lse[0, 0, 5])
    # a (Nq, Nk) mask broadcasts over batch and heads, and combines with causal
    small = rng.random((Nq, Nk)) < 0.5
    both = np.broadcast_to(small & causal_mask(Nq, Nk).numpy(), (2, 9, Nq, Nk))
    check_against_direct(q, k, v, mask=small, causal=True, allowed=both)
    with pytest.raises(TypeError, match="mask must be a bool"):
        attention_ref(q, k, v, mask=small.astype(np.float32))


def test_scale():
    q, k, v = randn(1, 9, 17, 80), randn(1, 9, 97, 80), randn(1, 9, 97, 80)
    check_against_direct(q, k, v, scale=0.3)
    default, _ = attention_ref(q, k, v)
    explicit, _ = attention_ref(q, k, v, scale=1 / math.sqrt(80))
    np.testing.assert_array_equal(default, explicit)
    other, _ = attention_ref(q, k, v, scale=0.3)
    assert not np.allclose(default, other)


def test_numpy_in_numpy_out_torch_in_torch_out():
    q, k, v = randn(2, 9, 17, 80, dtype=np.float32), randn(2, 3, 97, 80), randn(2, 3, 97, 80)
    out, lse = attention_ref(q, k.astype(np.float32), v.astype(np.float32))
    assert isinstance(out, np.ndarray) and isinstance(lse, np.ndarray)
    assert out.dtype == lse.dtype == np.float64
    assert out.shape == (2, 9, 17, 80) and lse.shape == (2, 9, 17)
    qt, kt, vt = (torch.from_numpy(t).float() for t in (q, k, v))
    out_t, lse_t = attention_ref(qt, kt, vt)
    assert isinstance(out_t, torch.Tensor) and out_t.dtype == lse_t.dtype == torch.float64
    np.testing.assert_array_equal(out_t.numpy(), out)


@pytest.mark.parametrize("shapes, match", [
    (((9, 17, 80), (2, 3, 97, 80), (2, 3, 97, 80)), r"^q must have 4 dims"),
    (((2, 9, 17, 80), (2, 3, 97, 80, 1), (2, 3, 97, 80)), r"^k must have 4 dims"),
    (((2, 9, 17, 80), (2, 3, 97, 80), (3, 97, 80)), r"^v must have 4 dims"),
    (((2, 9, 17, 80), (2, 3, 97, 80), (2, 3, 96, 80)), r"k and v must have the same shape"),
    (((2, 9, 17, 80), (1, 3, 97, 80), (1, 3, 97, 80)), r"k has batch 1 but q has batch 2"),
    (((2, 9, 17, 80), (2, 3, 97, 64), (2, 3, 97, 64)), r"k has headdim 64 but q has headdim 80"),
    (((2, 9, 17, 80), (2, 4, 97, 80), (2, 4, 97, 80)), r"heads_q=9 .* heads_kv=4"),
    (((2, 9, 17, 80), (2, 0, 97, 80), (2, 0, 97, 80)), r"heads_q=9 .* heads_kv=0"),
])
def test_check_qkv_errors_name_the_argument(shapes, match):
    q, k, v = (torch.empty(s) for s in shapes)
    with pytest.raises(ValueError, match=match):
        check_qkv(q, k, v)
    with pytest.raises(ValueError, match=match):       # attention_ref checks before computing
        attention_ref(*(t.numpy() for t in (q, k, v)))


def test_check_qkv_returns_dims():
    q, k = torch.empty(2, 9, 17, 80), torch.empty(2, 3, 97, 80)
    assert check_qkv(q, k, k) == (2, 9, 3, 17, 97, 80)
