"""Exercise 12 (lesson 12): FP8 as FlashAttention-3 feeds it to the tensor cores, in NumPy.

Hopper's tensor cores multiply FP8 at twice the fp16 rate. FlashAttention-3 (section 3.3) keeps
attention accurate in FP8 with two tricks: block quantization (one scale per block of rows, not
one per tensor) and incoherent processing (q and k multiplied by the same random orthogonal
matrix M first, which leaves q k^T unchanged, since M M^T = I, and spreads an outlier feature
over every column). Write the five steps, each on float64 NumPy arrays, returning float64.

(a) ``round_e4m3(x)``: every entry rounded to the nearest e4m3 value (torch.float8_e4m3fn's
    format: a sign, 4 exponent bits with bias 7, 3 mantissa bits). Its values >= 0 are

        normal      2**(e - 7) * (1 + m / 8)   e = 1 .. 15, m = 0 .. 7, not (e, m) = (15, 7)
        subnormal   2**-6 * m / 8              e = 0, m = 0 .. 7

    from 0 and 2**-9 up to 448 = 2**8 * 1.75. Between 2**p and 2**(p + 1) (p >= -6) the values
    are 2**(p - 3) apart; below 2**-6 they are 2**-9 apart. Round to the nearest; a tie (exactly
    half-way) goes to the value with the even m; |x| > 448 gives 448 with x's sign (saturation:
    never inf or NaN). The sign is kept (0 may come back as -0.0). PyTorch's cast
    (torch.float8_e4m3fn, after clipping to +-448) is allowed: it rounds through float32, so the
    grader accepts either neighbour within 2**-23 (relative) of a midpoint.

(b) ``quantize_e4m3(x, block)``: x (..., N, d), its rows cut into blocks of ``block`` rows (the
    last block may be shorter). For each block, descale = amax / 448 with amax the block's
    largest |x|, and x_q = round_e4m3(x / descale): the block's largest entry becomes +-448 and
    x ~ x_q * descale. A block of zeros has no amax to divide by: its x_q is 0 and its descale 1.
    Returns (x_q (..., N, d), descale (..., ceil(N / block))).

(c) ``hadamard_rotate(x, signs)``: x (..., d) with d a power of two, signs (d,) of +1.0 and -1.0.
    Returns x @ M with M = diag(signs) @ H / sqrt(d), H the d x d Hadamard matrix of Sylvester's
    construction (H_1 = [1], H_2n = [[H_n, H_n], [H_n, -H_n]]): multiply by the signs first, then
    the fast Walsh-Hadamard transform, log2(d) rounds of butterflies (a, b) -> (a + b, a - b) on
    the entries h apart in each group of 2h (h = 1, 2, 4, ..., d / 2), then divide by sqrt(d).
    O(d log d) per row: never build a d x d matrix.

(d) ``fp8_scores(q, k, block, signs=None)``: S = q k^T as an FP8 forward computes it: rotate q
    and k by the same M (when signs is given), quantize each (b) in blocks of ``block`` rows,
    multiply the FP8 values (exact in float64) and scale by the descales:
    S[i, j] = (q_q k_q^T)[i, j] * descale_q[i // block] * descale_k[j // block].
    q (..., Nq, d), k (..., Nk, d); returns (..., Nq, Nk).

(e) ``fp8_attention(q, k, v, block, signs=None)``: attention's output O as an FP8 forward computes
    it, the quantity whose error FA3 reports (section 4.3, Table 3). q (..., Nq, d), k and v
    (..., Nk, d). The scores are (d)'s (q and k rotated when signs is given; v is never rotated)
    times 1/sqrt(d); v is quantized in blocks of ``block`` rows like q and k (its descales scale
    its rows back); P = exp(S - the row's max), each entry in [0, 1], and l = P's row sums, taken
    before P is rounded (a kernel keeps them in float32); then P goes to e4m3 scaled so that 1
    maps to 448: P_8 = round_e4m3(448 P) / 448. Returns O = P_8 @ v_dequantized / l, (..., Nq, d).
    With ``block`` = N (one descale per tensor) and no signs it is FA3's FP8 baseline.

Check it: ``flashlib check ex12``.
"""
import numpy as np

E4M3_MAX = 448.0


def round_e4m3(x):
    """x (any shape) rounded to the nearest e4m3 value, ties to even, saturating at +-448."""
    x = np.asarray(x, dtype=np.float64)
    # BEGIN SOLUTION
    a = np.minimum(np.abs(x), E4M3_MAX)                # saturate first: 448 is on the grid
    _, e = np.frexp(a)                                 # a = f * 2**e, f in [0.5, 1): 2**(e-1) <= a
    step = np.exp2(np.maximum(e - 1, -6) - 3)          # the spacing near a (2**-9 below 2**-6)
    return np.copysign(np.round(a / step) * step, x)   # np.round: half to even (a / step is exact)
    # END SOLUTION


def quantize_e4m3(x, block):
    """Per-block e4m3 quantization of the rows of x (..., N, d): returns (x_q, descale)."""
    x = np.asarray(x, dtype=np.float64)
    # BEGIN SOLUTION
    *lead, N, d = x.shape
    n_blocks = -(-N // block)
    padded = np.zeros((*lead, n_blocks * block, d))
    padded[..., :N, :] = x                             # zero rows change no block's amax
    blocks = padded.reshape(*lead, n_blocks, block, d)                  # (..., n_blocks, block, d)
    amax = np.abs(blocks).max(axis=(-2, -1))                            # (..., n_blocks)
    descale = np.where(amax > 0, amax / E4M3_MAX, 1.0)                  # a zero block: 1
    x_q = round_e4m3(blocks / descale[..., None, None])                 # (..., n_blocks, block, d)
    return x_q.reshape(*lead, n_blocks * block, d)[..., :N, :], descale
    # END SOLUTION


def hadamard_rotate(x, signs):
    """x (..., d) @ diag(signs) @ H / sqrt(d), by the fast Walsh-Hadamard transform."""
    x = np.asarray(x, dtype=np.float64)
    # BEGIN SOLUTION
    *lead, d = x.shape
    y = x * signs                                      # the signs first: x diag(signs)
    h = 1
    while h < d:
        pairs = y.reshape(*lead, d // (2 * h), 2, h)   # (..., groups, 2, h): entries h apart
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        y = np.stack([a + b, a - b], axis=-2).reshape(*lead, d)
        h *= 2
    return y / np.sqrt(d)
    # END SOLUTION


def fp8_scores(q, k, block, signs=None):
    """q k^T through FP8: rotated (if signs), quantized per block of rows, descaled."""
    q, k = np.asarray(q, dtype=np.float64), np.asarray(k, dtype=np.float64)
    # BEGIN SOLUTION
    if signs is not None:
        q, k = hadamard_rotate(q, signs), hadamard_rotate(k, signs)
    q_q, dq = quantize_e4m3(q, block)                  # (..., Nq, d), (..., ceil(Nq / block))
    k_q, dk = quantize_e4m3(k, block)                  # (..., Nk, d), (..., ceil(Nk / block))
    rows = np.repeat(dq, block, axis=-1)[..., :q.shape[-2]]             # (..., Nq)
    cols = np.repeat(dk, block, axis=-1)[..., :k.shape[-2]]             # (..., Nk)
    s = q_q @ np.swapaxes(k_q, -1, -2)                                  # (..., Nq, Nk) exact
    return s * rows[..., :, None] * cols[..., None, :]
    # END SOLUTION


def fp8_attention(q, k, v, block, signs=None):
    """softmax(q k^T / sqrt(d)) v as an FP8 forward computes it: q, k, v and P through e4m3."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    # BEGIN SOLUTION
    s = fp8_scores(q, k, block, signs) / np.sqrt(q.shape[-1])          # (..., Nq, Nk)
    v_q, dv = quantize_e4m3(v, block)                                  # (..., Nk, d)
    v_back = v_q * np.repeat(dv, block, axis=-1)[..., :v.shape[-2], None]
    p = np.exp(s - s.max(axis=-1, keepdims=True))                      # (..., Nq, Nk) in [0, 1]
    l = p.sum(axis=-1, keepdims=True)                                  # before rounding
    return round_e4m3(E4M3_MAX * p) / E4M3_MAX @ v_back / l            # (..., Nq, d)
    # END SOLUTION
