"""flashlib.teach.softmax: the naive form overflows; the (max, sum) state algebra (lessons 01-02)."""
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from flashlib.teach.softmax import (merge_states, naive_softmax, online_normalizer, online_softmax,
                              safe_softmax)
from flashlib.testing import assert_close

DTYPES = [np.float32, np.float64]


def rows(dtype, max_len=60):
    """(rows, n) arrays of moderate values, large enough to overflow a naive float32 softmax."""
    return hnp.arrays(dtype, hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=max_len),
                      elements=st.floats(-200, 200, width=np.finfo(dtype).bits))


def sequential_softmax(x):
    """The textbook loop: safe softmax with a left-to-right sum (np.cumsum), as online's is.

    The baseline for online_softmax: NumPy's x.sum() adds pairwise, which is more accurate than
    any one-pass running sum; 1 + 1e-16 + 1e-16 + ... shows the difference.
    """
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / np.cumsum(e, axis=-1)[..., -1:]


def state(x):
    """(m, d) of the chunk x along the last axis, in float64; (-inf, 0) for an empty chunk."""
    if x.shape[-1] == 0:
        return np.full(x.shape[:-1], -np.inf), np.zeros(x.shape[:-1])
    m = x.max(axis=-1)
    return m, np.exp(x - m[..., None]).sum(axis=-1)


def sequential_sum(x):
    """d of the whole row summed left to right: the baseline for merged / online sums."""
    return np.cumsum(np.exp(x - x.max(axis=-1, keepdims=True)), axis=-1)[..., -1]


def test_naive_overflows_above_88_72_in_float32():
    rng = np.random.default_rng()
    below = np.concatenate([[88.0], rng.uniform(-5, 5, 16)]).astype(np.float32)
    above = np.concatenate([[89.0], rng.uniform(-5, 5, 16)]).astype(np.float32)
    assert np.isfinite(naive_softmax(below)).all()   # exp(88) = 1.65e38 < float32 max
    with np.errstate(over="ignore", invalid="ignore"):
        bad = naive_softmax(above)
    assert not np.isfinite(bad).all()                # exp(89) = inf, inf / inf = nan
    expected = safe_softmax(above.astype(np.float64))
    for actual in (safe_softmax(above), online_softmax(above), online_softmax(above, 5)):
        assert actual.dtype == np.float32
        assert_close(actual, expected, baseline=safe_softmax(above), name="softmax near 89")


@pytest.mark.parametrize("dtype", DTYPES)
def test_safe_and_online_agree_with_float64_on_large_inputs(dtype):
    x = np.random.default_rng().normal(0, 300, size=(9, 130)).astype(dtype)
    expected = safe_softmax(x.astype(np.float64).astype(np.longdouble))
    for block in (1, 17, 97, 130, 500):
        y = online_softmax(x, block)
        assert np.isfinite(y).all()
        assert_close(y, expected, baseline=safe_softmax(x), name=f"online block {block}")


@settings(max_examples=60, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES))
def test_online_softmax_equals_safe_for_any_block_size(data, dtype):
    x = data.draw(rows(dtype))
    block = data.draw(st.integers(1, x.shape[-1] + 3))
    expected = safe_softmax(x.astype(np.longdouble))  # extended precision where the CPU has it
    assert_close(online_softmax(x, block), expected, baseline=sequential_softmax(x),
                 name=f"online_softmax(block_size={block})")


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_merging_any_chunking_gives_the_whole_rows_state(data):
    x = data.draw(rows(np.float64))
    n = x.shape[-1]
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=6)))  # empty chunks allowed
    m, d = np.full(x.shape[:-1], -np.inf), np.zeros(x.shape[:-1])
    for start, stop in zip([0] + cuts, cuts + [n]):
        m, d = merge_states(m, d, *state(x[:, start:stop]))
    m_all = x.max(axis=-1)
    np.testing.assert_array_equal(m, m_all)          # a max is exact whatever the order
    exact = state(x.astype(np.longdouble))[1]
    assert_close(d, exact, baseline=sequential_sum(x), name="merged sum")
    m_online, d_online = online_normalizer(x, data.draw(st.integers(1, n)))
    np.testing.assert_array_equal(m_online[..., 0], m_all)
    assert_close(d_online[..., 0], exact, baseline=sequential_sum(x), name="online_normalizer sum")


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_merge_is_commutative_and_associative(data):
    x = data.draw(rows(np.float64, max_len=30))
    n = x.shape[-1]
    a, b = sorted(data.draw(st.lists(st.integers(0, n), min_size=2, max_size=2)))
    s1, s2, s3 = state(x[:, :a]), state(x[:, a:b]), state(x[:, b:])
    for m_d in (merge_states(*s1, *s2), merge_states(*s2, *s1)):   # commutative: bit for bit
        np.testing.assert_array_equal(m_d[0], merge_states(*s1, *s2)[0])
        np.testing.assert_array_equal(m_d[1], merge_states(*s1, *s2)[1])
    left = merge_states(*merge_states(*s1, *s2), *s3)
    right = merge_states(*s1, *merge_states(*s2, *s3))
    np.testing.assert_array_equal(left[0], right[0])
    exact, baseline = state(x.astype(np.longdouble))[1], sequential_sum(x)
    assert_close(left[1], exact, baseline=baseline, name="(s1 + s2) + s3")
    assert_close(right[1], exact, baseline=baseline, name="s1 + (s2 + s3)")


def test_merge_with_empty_states_is_exact_and_warning_free():
    x = np.random.default_rng().normal(0, 50, size=(9, 17))
    m, d = state(x)
    empty = (np.full(9, -np.inf), np.zeros(9))
    with warnings.catch_warnings():
        warnings.simplefilter("error")             # no RuntimeWarning may leak to a learner
        for merged in (merge_states(m, d, *empty), merge_states(*empty, m, d)):
            np.testing.assert_array_equal(merged[0], m)
            np.testing.assert_array_equal(merged[1], d)
        m_e, d_e = merge_states(*empty, *empty)
    assert np.isneginf(m_e).all() and (d_e == 0).all()
