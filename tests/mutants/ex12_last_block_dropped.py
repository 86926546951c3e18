"""Mutant of ex12: counts N // block blocks: the short last block takes the previous descale."""
import numpy as np

EXPECTED_HINT = 'last block'

E4M3_MAX = 448.0


def round_e4m3(x):
    """x (any shape) rounded to the nearest e4m3 value, ties to even, saturating at +-448."""
    x = np.asarray(x, dtype=np.float64)
    a = np.minimum(np.abs(x), E4M3_MAX)                # saturate first: 448 is on the grid
    _, e = np.frexp(a)                                 # a = f * 2**e, f in [0.5, 1): 2**(e-1) <= a
    step = np.exp2(np.maximum(e - 1, -6) - 3)          # the spacing near a (2**-9 below 2**-6)
    return np.copysign(np.round(a / step) * step, x)   # np.round: half to even (a / step is exact)


def quantize_e4m3(x, block):
    """Per-block e4m3 quantization of the rows of x (..., N, d): returns (x_q, descale)."""
    x = np.asarray(x, dtype=np.float64)
    *lead, N, d = x.shape
    n_blocks = max(N // block, 1)                      # whole blocks only
    amax = np.abs(x[..., :n_blocks * block, :]).reshape(*lead, n_blocks, -1).max(axis=-1)
    descale = np.where(amax > 0, amax / E4M3_MAX, 1.0)                  # (..., n_blocks)
    rows = np.repeat(descale, block, axis=-1)                           # the tail: the last one's
    rows = np.concatenate([rows, np.repeat(rows[..., -1:], max(N - rows.shape[-1], 0), axis=-1)],
                          axis=-1)[..., :N]
    return round_e4m3(x / rows[..., None]), descale


def hadamard_rotate(x, signs):
    """x (..., d) @ diag(signs) @ H / sqrt(d), by the fast Walsh-Hadamard transform."""
    x = np.asarray(x, dtype=np.float64)
    *lead, d = x.shape
    y = x * signs                                      # the signs first: x diag(signs)
    h = 1
    while h < d:
        pairs = y.reshape(*lead, d // (2 * h), 2, h)   # (..., groups, 2, h): entries h apart
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        y = np.stack([a + b, a - b], axis=-2).reshape(*lead, d)
        h *= 2
    return y / np.sqrt(d)


def fp8_scores(q, k, block, signs=None):
    """q k^T through FP8: rotated (if signs), quantized per block of rows, descaled."""
    q, k = np.asarray(q, dtype=np.float64), np.asarray(k, dtype=np.float64)
    if signs is not None:
        q, k = hadamard_rotate(q, signs), hadamard_rotate(k, signs)
    q_q, dq = quantize_e4m3(q, block)                  # (..., Nq, d), (..., ceil(Nq / block))
    k_q, dk = quantize_e4m3(k, block)                  # (..., Nk, d), (..., ceil(Nk / block))
    rows = np.repeat(dq, block, axis=-1)[..., :q.shape[-2]]             # (..., Nq)
    cols = np.repeat(dk, block, axis=-1)[..., :k.shape[-2]]             # (..., Nk)
    s = q_q @ np.swapaxes(k_q, -1, -2)                                  # (..., Nq, Nk) exact
    return s * rows[..., :, None] * cols[..., None, :]


def fp8_attention(q, k, v, block, signs=None):
    """softmax(q k^T / sqrt(d)) v as an FP8 forward computes it: q, k, v and P through e4m3."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    s = fp8_scores(q, k, block, signs) / np.sqrt(q.shape[-1])          # (..., Nq, Nk)
    v_q, dv = quantize_e4m3(v, block)                                  # (..., Nk, d)
    v_back = v_q * np.repeat(dv, block, axis=-1)[..., :v.shape[-2], None]
    p = np.exp(s - s.max(axis=-1, keepdims=True))                      # (..., Nq, Nk) in [0, 1]
    l = p.sum(axis=-1, keepdims=True)                                  # before rounding
    return round_e4m3(448.0 * p) / 448.0 @ v_back / l                  # (..., Nq, d)
