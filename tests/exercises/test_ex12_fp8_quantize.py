"""Grader of exercise 12 (lesson 12): round_e4m3, quantize_e4m3, hadamard_rotate and fp8_scores,
FlashAttention-3's FP8 steps in NumPy.

round_e4m3 is held exactly to a table of the 127 e4m3 values >= 0 built here from the format's
definition (nearest by search, ties to the even mantissa): every value of the table, exact
midpoints, random values over the whole range and the subnormals, and values past 448 up to 1e300
(saturation: never inf or NaN). quantize_e4m3 is compared with the float64 definition on
irregular shapes with leading dims and a short last block, blocks of very different magnitudes,
all-zero blocks and blocks of 1e30 and 1e-30 (descale = amax / 448 to 1e-12, x_q exactly). Where a
value lies within 2**-23 of a midpoint, either neighbour is accepted (PyTorch's cast from float64
rounds through float32; x * (448 / amax) may differ from x / descale in the last bit).
hadamard_rotate is compared with x @ diag(signs) @ H / sqrt(d), Sylvester's H applied as its
Kronecker factors H_2, for d = 1 to 2048; norms and q k^T must be preserved; at d = 2048 its
memory must stay far below one d x d matrix. fp8_scores is compared with the same steps done here
in float64, or with the learner's own rotate and quantize put together. fp8_attention (the output O
with q, k, v and P in e4m3, the quantity of FA3's Table 3) is compared with the same steps done
here, or with the learner's own fp8_scores, quantize_e4m3 and round_e4m3 put together, on inputs
with rare large entries (Table 3's kind) and outlier channels; probes name P left unrounded or
rounded unscaled, v not quantized or rotated, the scale 1/sqrt(d) missing and the row sums taken
after rounding. Probes name the mistake: round
toward zero, ties away from zero, subnormals flushed or too fine, 4 mantissa bits, the wrong
maximum (240, 57344) or none, per-tensor scale, descale inverted, zero blocks giving NaN, blocks of
columns, the last block dropped, x / descale not rounded, no 1/sqrt(d) or 1/d, signs after the
transform or ignored, only q rotated, a descale left out. All NumPy: a few milliseconds a check.
"""
import numpy as np
import pytest

from flashlib.course import checks, grading

pytestmark = pytest.mark.ex12
# what a learner's file may use of flashlib (the stub imports none of it); anything else is
# "not accepted: write it yourself" (flashlib.course.integrity.borrowed)
FLASHLIB_ALLOWED = ()
# flashlib's own answers (lesson 12's measurement uses them until the exercise is solved)
FLASHLIB_ANSWERS = ("flashlib.teach.fp8_error.round_e4m3", "flashlib.teach.fp8_error.quantize_blocks",
                    "flashlib.teach.fp8_error.hadamard_rotate", "flashlib.teach.fp8_error.fp8_attention")

MAX = 448.0
SLACK = 2.0 ** -23

HINT_NEAREST = ("round to the nearest e4m3 value, not toward zero: 1.12 lies between 1.0 and 1.125 "
                "and is nearer 1.125 (np.round(a / step) * step, not np.floor or np.trunc)")
HINT_TIES = ("a tie goes to the value with the even mantissa (ties to even, as np.round does): "
             "1.0625 -> 1.0 and 1.1875 -> 1.25, not always away from zero")
HINT_FLUSH = ("values below 2**-6 are subnormals, 2**-9 apart, not 0: 3 * 2**-9 is an e4m3 value "
              "(keep the spacing at 2**-9 below 2**-6 instead of flushing to zero)")
HINT_FINE = ("below 2**-6 the subnormals are 2**-9 apart, no finer: clamp the exponent at -6 "
             "(1.125 * 2**-7 rounds to 2**-7)")
HINT_BITS = ("e4m3 has 3 mantissa bits: between 2**p and 2**(p+1) the values are 2**(p-3) apart "
             "(1.0, 1.125, 1.25, ...), not 2**(p-4)")
HINT_240 = ("the largest e4m3 value (float8_e4m3fn) is 448 = 2**8 * 1.75, not 240 (that is "
            "e4m3fnuz's, AMD's variant)")
HINT_57344 = "the largest e4m3 value is 448, not 57344 (that is e5m2's, the other FP8 format)"
HINT_SATURATE = ("saturate: |x| > 448 gives 448 with x's sign (clip before or after rounding), "
                 "never 480, 512, inf or NaN")
HINT_PER_BLOCK = ("one descale per block of `block` rows (amax over that block only), not one for "
                  "the whole tensor: a block of small values keeps its precision")
HINT_INVERTED = ("your descale looks inverted: descale = amax / 448, the factor that takes x_q back "
                 "to x (x ~ x_q * descale); x_q = round_e4m3(x / descale)")
HINT_ZEROS = ("a block of zeros has amax 0: divide by a descale of 1 there (np.where(amax > 0, "
              "amax / 448, 1.0)), so its x_q is 0, not 0 / 0 = NaN")
HINT_ROWS = ("the blocks are of rows (axis -2, the sequence): rows [i * block, (i + 1) * block) "
             "share a descale, over all d columns; descale has shape (..., ceil(N / block))")
HINT_LAST = ("the last block may be shorter than `block`: there are ceil(N / block) blocks "
             "(-(-N // block)), and its rows get a descale too")
HINT_ROUND = ("x_q must be e4m3 values: round x / descale with round_e4m3 (the scaled values "
              "themselves are not on the grid)")
HINT_SQRT = ("divide by sqrt(d): H / sqrt(d) is orthogonal (H H^T = d I), so the rotation keeps "
             "norms and q k^T")
HINT_BEFORE = ("multiply by the signs before the transform: x @ diag(signs) @ H, i.e. "
               "(x * signs) then the butterflies, not after")
HINT_SIGNS = "multiply x by the random signs (x * signs) before the transform"
HINT_ORDER = ("x @ H with Sylvester's H (H_2n = [[H_n, H_n], [H_n, -H_n]]): butterflies "
              "(a, b) -> (a + b, a - b) on entries h apart, h = 1, 2, ..., d / 2")
HINT_FAST = ("the transform is O(d log d): log2(d) rounds of butterflies on x itself, never a "
             "d x d matrix (at d = 2048 that is 32 MB per call)")
HINT_BOTH = ("rotate both q and k by the same M (hadamard_rotate with the same signs): only then "
             "(q M)(k M)^T = q k^T")
HINT_DESCALES = ("scale the FP8 product by both descales: row i by descale_q[i // block] and "
                 "column j by descale_k[j // block]")
HINT_PARTS = "fp8_scores builds on quantize_e4m3 and hadamard_rotate: make those pass first"
HINT_P_ROUND = ("P goes through e4m3 too, as the second matmul reads it in FP8: P_8 = "
                "round_e4m3(448 * P) / 448")
HINT_P_SCALE = ("scale P by 448 before rounding and divide by 448 after: P's entries are at most 1, "
                "and unscaled they would use only e4m3's lowest values (below 2**-6, 2**-9 apart)")
HINT_V = ("quantize v in blocks of rows like q and k (quantize_e4m3) and scale its rows back by "
          "their descales: the second matmul reads V in FP8")
HINT_V_ROTATED = ("rotate q and k only: (q M)(k M)^T = q k^T, but v M would come out in O as O M, "
                  "a different output")
HINT_SCALE = "the scores are multiplied by 1/sqrt(d) before the softmax, as in any attention"
HINT_SUM = ("take the row sums l from P before it is rounded (a kernel sums the float32 P), then "
            "divide P_8 @ v by them")
HINT_ATT_PARTS = ("fp8_attention builds on fp8_scores, quantize_e4m3 and round_e4m3: make those "
                  "pass first")


# ---------------------------------------------------------------------------------------------
# the definitions, written here from the format (not from the reference answer)

def _grid():
    """The 127 e4m3 values >= 0, sorted: index 8 e + m for exponent field e and mantissa m."""
    values = [m / 8 * 2.0 ** -6 for m in range(8)]                      # subnormals, with 0
    values += [2.0 ** (e - 7) * (1 + m / 8) for e in range(1, 16) for m in range(8)
               if (e, m) != (15, 7)]
    return np.array(values)


GRID = _grid()
MIDPOINTS = (GRID[1:] + GRID[:-1]) / 2


def _round(x):
    """Nearest e4m3 value by search in GRID, ties to the even index (= even mantissa)."""
    x = np.asarray(x, dtype=np.float64)
    a = np.minimum(np.abs(x), MAX)
    i = np.clip(np.searchsorted(GRID, a), 1, len(GRID) - 1)
    lo, hi = GRID[i - 1], GRID[i]
    up = (hi - a < a - lo) | ((hi - a == a - lo) & (i % 2 == 0))
    return np.copysign(np.where(up, hi, lo), x)


def _amax(x, block):
    """The largest |x| of each block of rows: (..., ceil(N / block))."""
    n = -(-x.shape[-2] // block)
    return np.stack([np.abs(x[..., b * block:(b + 1) * block, :]).max(axis=(-2, -1))
                     for b in range(n)], axis=-1)


def _quantize(x, block):
    """(x_q, descale, x / descale), the definition: descale = amax / 448 (1 if amax is 0)."""
    amax = _amax(x, block)
    descale = np.where(amax > 0, amax / MAX, 1.0)
    rows = np.repeat(descale, block, axis=-1)[..., :x.shape[-2], None]           # (..., N, 1)
    return _round(x / rows), descale, x / rows


def _hadamard(d):
    h = np.ones((1, 1))
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return h


def _rotate(x, signs):
    """x @ diag(signs) @ H / sqrt(d) without the d x d matrix: Sylvester's H_d is the Kronecker
    power H_2 (x) ... (x) H_2, one factor per bit of the index, so it acts on x reshaped to
    (..., 2, ..., 2) by H_2 along each of those axes."""
    lead, d = x.shape[:-1], x.shape[-1]
    bits = d.bit_length() - 1
    y = (x * signs).reshape(*lead, *([2] * bits))
    for axis in range(len(lead), len(lead) + bits):
        y = np.moveaxis(np.tensordot(y, _hadamard(2), axes=([axis], [0])), -1, axis)
    return y.reshape(x.shape) / np.sqrt(d)


def _scores(q, k, block, signs=None):
    if signs is not None:
        q, k = _rotate(q, signs), _rotate(k, signs)
    (q_q, dq, _), (k_q, dk, _) = _quantize(q, block), _quantize(k, block)
    rows = np.repeat(dq, block, axis=-1)[..., :q.shape[-2], None]
    cols = np.repeat(dk, block, axis=-1)[..., None, :k.shape[-2]]
    return (q_q @ np.swapaxes(k_q, -1, -2)) * rows * cols


# ---------------------------------------------------------------------------------------------
# calling the learner's functions

def _call(impl, name, *args, returns=1):
    fn = checks.function(impl, name)
    copies = [np.copy(a) if isinstance(a, np.ndarray) else a for a in args]
    result = fn(*copies)
    for before, after in zip(args, copies):
        if isinstance(before, np.ndarray) and not np.array_equal(before, after, equal_nan=True):
            checks.fail(f"{name} changed its argument in place: compute into new arrays; the "
                        "caller still needs it")
    if returns == 1:
        return checks.as_array(result, f"what {name} returned")
    if not isinstance(result, (tuple, list)) or len(result) != returns:
        checks.fail(f"{name} returned {type(result).__name__}; it should return {returns} arrays")
    return [checks.as_array(r, f"what {name} returned") for r in result]


def _round_hint(impl):
    """The first mistake the probes of round_e4m3 show, or None."""
    def r(v):
        return float(np.ravel(_call(impl, "round_e4m3", np.array([v])))[0])

    big = r(1000.0)
    if big == 240.0 or r(300.0) == 240.0:
        return HINT_240
    if big == 57344.0 or big > 1e4 and big < 6e4:
        return HINT_57344
    if big != MAX or r(460.0) != MAX or r(-1e300) != -MAX:
        return HINT_SATURATE
    if r(1.0625 + 1e-9) == 1.0625:
        return HINT_BITS
    if r(1.12) == 1.0 or r(1.24) == 1.125:
        return HINT_NEAREST
    if r(1.0625) == 1.125 or r(1.3125) == 1.375:
        return HINT_TIES
    if r(3 * 2.0 ** -9) == 0.0 or r(0.01) == 0.0:
        return HINT_FLUSH
    if r(1.125 * 2.0 ** -7) != 2.0 ** -7:
        return HINT_FINE
    return None


def _neighbours(y):
    """Where y lies within float32's precision (2**-23) of a midpoint, either rounding is
    accepted: PyTorch's cast from float64 to float8 goes through float32, rounding twice."""
    return _round(y * (1 - SLACK)), _round(y * (1 + SLACK))


def _expect_round(impl, x, what, default, *, slack=True):
    got = _call(impl, "round_e4m3", x)
    want = _round(x)
    if got.shape != x.shape:
        checks.fail(f"round_e4m3 of an array {x.shape} returned shape {got.shape}: round every "
                    "entry, keep the shape")
    bad = ~(got == want)
    if slack:
        below, above = _neighbours(x)
        bad &= (got != below) & (got != above)
    if bad.any():
        i = np.unravel_index(int(np.flatnonzero(bad)[0]), x.shape)
        checks.fail(f"{what}: {int(bad.sum())} of {x.size} entries wrong; round_e4m3({float(x[i])!r}) "
                    f"returned {float(got[i])!r}, expected {float(want[i])!r}",
                    _round_hint(impl) or default)


# ---------------------------------------------------------------------------------------------
# (a) round_e4m3

def check_round_grid(impl, rng):
    """every e4m3 value, both signs (subnormals, 448 and 0 included), rounds to itself"""
    x = np.concatenate([GRID, -GRID[1:]])[rng.permutation(2 * len(GRID) - 1)]
    _expect_round(impl, x.reshape(11, 23), "e4m3 values", "an e4m3 value is its own nearest value")


def check_round_nearest(impl, rng):
    """random values from 2**-12 to 448, both signs, any shape: the nearest e4m3 value"""
    x = np.exp2(rng.uniform(-12, np.log2(MAX), (7, 13, 11))) * rng.choice([-1.0, 1.0], (7, 13, 11))
    _expect_round(impl, x, "random values", HINT_NEAREST)


def check_round_ties(impl, rng):
    """values exactly half-way between two e4m3 values go to the one with the even mantissa"""
    x = np.concatenate([MIDPOINTS, -MIDPOINTS])[rng.permutation(2 * len(MIDPOINTS))]
    _expect_round(impl, x, "midpoints (ties)", HINT_TIES, slack=False)


def check_round_subnormals(impl, rng):
    """below 2**-6 the e4m3 values are 2**-9 apart (subnormals): values from 0 to 2**-6"""
    x = rng.uniform(-2.0 ** -6, 2.0 ** -6, (5, 40))
    x[0, :8] = np.arange(8) * 2.0 ** -9 + 2.0 ** -11                     # just above each value
    _expect_round(impl, x, "values below 2**-6", HINT_FINE)


def check_round_saturates(impl, rng):
    """|x| > 448, up to 1e300, gives +-448: never 480, inf or NaN"""
    x = np.concatenate([[449.0, 463.9, 464.0, 464.1, 479.0, 480.0, 500.0, 57344.0, 1e38,
                         np.finfo(np.float64).max], 10.0 ** rng.uniform(2.66, 300, 30)])
    x = x * rng.choice([-1.0, 1.0], x.shape)
    got = _call(impl, "round_e4m3", x)
    if not np.all(np.isfinite(got)):
        checks.fail("round_e4m3 returned inf or NaN for large inputs (e.g. "
                    f"{float(x[~np.isfinite(got)][0])!r})",
                    _round_hint(impl) or HINT_SATURATE)
    _expect_round(impl, x, "values past 448", HINT_SATURATE)


# ---------------------------------------------------------------------------------------------
# (b) quantize_e4m3

def _quantize_hint(impl, x, block, got_q, got_d):
    """What the learner's descale and x_q look like, or the round_e4m3 probes' hint."""
    x_q, descale, scaled = _quantize(x, block)
    N, d = x.shape[-2:]
    if got_d.shape != descale.shape:
        if got_d.shape[-1:] == (N // block,) and N // block != -(-d // block):
            return HINT_LAST
        return HINT_ROWS
    amax = _amax(x, block)
    some = amax > 0                                   # blocks of zeros have no amax to compare
    per_slice = np.abs(x).max(axis=(-2, -1))[..., None] / MAX              # (..., 1)
    for hint, guess in ((HINT_PER_BLOCK, np.broadcast_to(np.abs(x).max() / MAX, descale.shape)),
                        (HINT_PER_BLOCK, np.broadcast_to(per_slice, descale.shape)),
                        (HINT_INVERTED, MAX / amax), (HINT_240, amax / 240),
                        (HINT_57344, amax / 57344)):
        if np.allclose(got_d[some], np.asarray(guess)[some], rtol=1e-9):
            return hint
    if np.allclose(got_d, descale, rtol=1e-9) and np.allclose(got_q, scaled, rtol=1e-9):
        return HINT_ROUND
    return _round_hint(impl)


def _expect_quantize(impl, x, block, what):
    got_q, got_d = _call(impl, "quantize_e4m3", x, block, returns=2)
    x_q, descale, scaled = _quantize(x, block)
    hint = lambda: _quantize_hint(impl, x, block, got_q, got_d)  # noqa: E731
    what = f"quantize_e4m3 of x {x.shape} in blocks of {block} rows, {what}"
    if got_d.shape != descale.shape:
        checks.fail(f"{what}: descale has shape {got_d.shape}, expected {descale.shape}", hint())
    zero = _amax(x, block) == 0                       # all-zero blocks: any finite descale will do
    off = ~(np.isclose(got_d, descale, rtol=1e-12, atol=0) | (zero & np.isfinite(got_d)))
    if off.any():
        i = tuple(int(n) for n in np.unravel_index(int(np.flatnonzero(off)[0]), descale.shape))
        checks.fail(f"{what}: descale{list(i)} is {float(got_d[i])!r}, expected "
                    f"{float(descale[i])!r} (the block's amax / 448)", hint())
    if got_q.shape != x.shape:
        checks.fail(f"{what}: x_q has shape {got_q.shape}, expected {x.shape}", hint())
    below, above = _neighbours(scaled)        # x / descale vs x * (448 / amax), torch's cast
    bad = (got_q != x_q) & (got_q != below) & (got_q != above)
    if bad.any():
        i = tuple(int(n) for n in np.unravel_index(int(np.flatnonzero(bad)[0]), x.shape))
        checks.fail(f"{what}: {int(bad.sum())} of {x.size} entries of x_q wrong; at {list(i)}, "
                    f"x = {float(x[i])!r}, x / descale = {float(scaled[i])!r}: x_q "
                    f"{float(got_q[i])!r}, expected {float(x_q[i])!r}", hint())


def check_quantize(impl, rng):
    """descale = amax / 448 per block of rows, x_q = round_e4m3(x / descale): leading dims, a
    short last block, blocks of very different magnitudes"""
    for shape, block in (((2, 3, 37, 50), 16), ((50, 8), 7), ((5, 16), 16), ((3, 1, 130, 40), 64)):
        x = rng.standard_normal(shape)
        x *= 10.0 ** rng.uniform(-3, 3, (*shape[:-1], 1))               # rows of many magnitudes
        _expect_quantize(impl, x, block, "random rows")


def check_quantize_zero_blocks(impl, rng):
    """a block of zeros quantizes to zeros with a finite descale (no 0 / 0)"""
    x = rng.standard_normal((2, 40, 12))
    x[0, 8:16] = 0.0                                                     # a whole block
    x[1, 32:] = 0.0                                                      # the short last block
    x[1, 0:8] = 0.0
    x[1, 3, 5] = 1e-3                                                    # one entry in a block
    for x, block in ((x, 8), (np.zeros((3, 4)), 2)):
        got_q, got_d = _call(impl, "quantize_e4m3", x, block, returns=2)
        if not (np.all(np.isfinite(got_q)) and np.all(np.isfinite(got_d))):
            checks.fail(f"x_q or descale has NaN or inf where a block of x {x.shape} is all zeros",
                        HINT_ZEROS)
        if got_q.shape == x.shape and np.any(got_q[x == 0] != 0):
            checks.fail(f"x_q is not 0 where x {x.shape} is 0", HINT_ZEROS)
        _expect_quantize(impl, x, block, "all-zero blocks")


def check_quantize_extremes(impl, rng):
    """blocks of 1e30 and 1e-30 beside ordinary ones: each scaled on its own, all finite"""
    x = rng.standard_normal((4, 32, 16))
    x[:, :8] *= 1e30
    x[:, 8:16] *= 1e-30
    x[:, 24:] *= 1e250
    got_q, got_d = _call(impl, "quantize_e4m3", x, 8, returns=2)
    if not (np.all(np.isfinite(got_q)) and np.all(np.isfinite(got_d))):
        checks.fail("x_q or descale has inf or NaN for blocks of 1e30, 1e-30 and 1e250",
                    _quantize_hint(impl, x, 8, got_q, got_d) or HINT_SATURATE)
    _expect_quantize(impl, x, 8, "blocks of 1e30, 1e-30 and 1e250")


# ---------------------------------------------------------------------------------------------
# (c) hadamard_rotate

def _rotate_hint(x, signs, got):
    d = x.shape[-1]
    h = _hadamard(d)
    guesses = {HINT_BEFORE: x @ h * signs / np.sqrt(d), HINT_SIGNS: x @ h / np.sqrt(d),
               HINT_SQRT: (x * signs) @ h}
    guesses[HINT_SQRT + " (not d)"] = (x * signs) @ h / d
    for hint, guess in guesses.items():
        if guess.shape == got.shape and np.allclose(got, guess, rtol=1e-9, atol=1e-12):
            return hint
    return HINT_ORDER


def _expect_rotate(impl, x, signs, what):
    got = _call(impl, "hadamard_rotate", x, signs)
    want = _rotate(x, signs)
    if got.shape != want.shape:
        checks.fail(f"hadamard_rotate of x {x.shape} returned shape {got.shape}", HINT_ORDER)
    # each output sums d terms of size |x_c| / sqrt(d): float64 rounding is ~1e-15 of that
    tol = 1e-12 * np.abs(x).sum(axis=-1, keepdims=True).max() / np.sqrt(x.shape[-1])
    if not np.all(np.abs(got - want) <= tol):
        checks.fail(f"hadamard_rotate of x {x.shape} ({what}) is off: "
                    f"{checks.where_it_differs(got, want, tol)}", _rotate_hint(x, signs, got))


def check_rotate(impl, rng):
    """hadamard_rotate(x, signs) is x @ diag(signs) @ H / sqrt(d), d = 1 to 256, leading dims"""
    for shape in ((3, 1), (5, 2), (4, 8), (2, 3, 7, 64), (9, 256)):
        signs = rng.choice([-1.0, 1.0], shape[-1])
        _expect_rotate(impl, rng.standard_normal(shape), signs, "random signs")


def check_rotate_orthogonal(impl, rng):
    """the rotation is orthogonal: every row's norm and q k^T are unchanged"""
    d = 128
    signs = rng.choice([-1.0, 1.0], d)
    q, k = rng.standard_normal((11, d)), rng.standard_normal((17, d))
    q[:, 3] *= 50.0                                                       # an outlier channel
    qr, kr = _call(impl, "hadamard_rotate", q, signs), _call(impl, "hadamard_rotate", k, signs)
    if qr.shape != q.shape or kr.shape != k.shape:
        checks.fail(f"hadamard_rotate returned shapes {qr.shape}, {kr.shape} for {q.shape}, {k.shape}")
    norms = np.linalg.norm(qr, axis=-1) / np.linalg.norm(q, axis=-1)
    if not np.allclose(norms, 1.0, rtol=1e-10):
        checks.fail(f"the rotation changes the rows' norms by a factor {norms[0]:.6g}",
                    _rotate_hint(q, signs, qr))
    s, sr = q @ k.T, qr @ kr.T
    if not np.allclose(sr, s, rtol=0, atol=1e-10 * np.abs(s).max()):
        checks.fail(f"(q M)(k M)^T differs from q k^T by {np.abs(sr - s).max():.3g}",
                    _rotate_hint(q, signs, qr))


@checks.not_under_grade
def check_rotate_fast(impl, rng):
    """O(d log d): at d = 2048 the rotation holds far less than one d x d matrix"""
    d = 2048
    x, signs = rng.standard_normal((2, d)), rng.choice([-1.0, 1.0], d)
    fn = checks.function(impl, "hadamard_rotate")
    peak = checks.peak_allocation(fn, x, signs)
    if peak > 2 * 2 ** 20:
        checks.fail(f"hadamard_rotate of x (2, {d}) holds {peak / 2 ** 20:.1f} MiB at its peak "
                    f"(x itself is {x.nbytes // 1024} KiB)", HINT_FAST)
    _expect_rotate(impl, x, signs, f"d = {d}")


# ---------------------------------------------------------------------------------------------
# (d) fp8_scores

def _scores_hint(impl, q, k, block, signs, got):
    for part, args in (("quantize_e4m3", (q, block)), ("hadamard_rotate", (q, signs))):
        if args[1] is None:
            continue
        mine = _call(impl, part, *args, returns=2 if part == "quantize_e4m3" else 1)
        want = _quantize(*args)[:2] if part == "quantize_e4m3" else [_rotate(*args)]
        if not all(np.shape(m) == np.shape(w) and np.allclose(m, w, rtol=1e-9, atol=1e-12)
                   for m, w in zip(mine if part == "quantize_e4m3" else [mine], want)):
            return HINT_PARTS
    (q_q, dq, _), (k_q, dk, _) = _quantize(q, block), _quantize(k, block)
    raw = q_q @ np.swapaxes(k_q, -1, -2)
    rows = np.repeat(dq, block, axis=-1)[..., :q.shape[-2], None]
    cols = np.repeat(dk, block, axis=-1)[..., None, :k.shape[-2]]
    guesses = [(HINT_DESCALES, raw), (HINT_DESCALES, raw * rows), (HINT_DESCALES, raw * cols)]
    if signs is not None:
        guesses += [(HINT_BOTH, _scores(q, k, block)),
                    (HINT_BOTH, _scores(_rotate(q, signs), k, block)),
                    (HINT_BOTH, _scores(q, _rotate(k, signs), block))]
    for hint, guess in guesses:
        if np.allclose(got, guess, rtol=1e-9, atol=1e-9 * np.abs(guess).max()):
            return hint
    return None


def _scores_of_parts(impl, q, k, block, signs):
    """S as the learner's own hadamard_rotate and quantize_e4m3 give it (None if they cannot):
    fp8_scores is held to how it puts the parts together, the parts to their own checks."""
    try:
        if signs is not None:
            q, k = (_call(impl, "hadamard_rotate", x, signs) for x in (q, k))
        (q_q, dq), (k_q, dk) = (_call(impl, "quantize_e4m3", x, block, returns=2) for x in (q, k))
        rows = np.repeat(dq, block, axis=-1)[..., :q.shape[-2], None]
        cols = np.repeat(dk, block, axis=-1)[..., None, :k.shape[-2]]
        return (q_q @ np.swapaxes(k_q, -1, -2)) * rows * cols
    except Exception:      # a part not done, or failing in its own checks
        return None


def _close(got, want):
    return want is not None and got.shape == want.shape and \
        np.allclose(got, want, rtol=1e-9, atol=1e-9 * np.abs(want).max())


def check_scores(impl, rng):
    """fp8_scores matches q k^T through the FP8 steps (rotate, quantize, multiply, descale),
    with and without the rotation, leading dims and short last blocks"""
    for lead, Nq, Nk, d, block, rotate in (((), 45, 70, 64, 16, False), ((), 45, 70, 64, 16, True),
                                           ((2,), 30, 19, 32, 8, True), ((2,), 13, 9, 24, 4, False)):
        q, k = rng.standard_normal((*lead, Nq, d)), rng.standard_normal((*lead, Nk, d))
        q[..., :, 1] *= 30.0                                              # an outlier channel
        k[..., :, 1] *= 30.0
        signs = rng.choice([-1.0, 1.0], d) if rotate else None
        got = _call(impl, "fp8_scores", q, k, block, signs)
        want = _scores(q, k, block, signs)
        what = f"fp8_scores of q {q.shape}, k {k.shape}, blocks of {block}, " + \
            ("rotated" if rotate else "signs=None")
        if got.shape != want.shape:
            checks.fail(f"{what}: shape {got.shape}, expected {want.shape}")
        if not (_close(got, want) or _close(got, _scores_of_parts(impl, q, k, block, signs))):
            checks.fail(f"{what}: off by up to {np.abs(got - want).max():.3g} (S up to "
                        f"{np.abs(want).max():.3g})", _scores_hint(impl, q, k, block, signs, got)
                        or ("rotate q and k (if signs is given), quantize each in blocks of rows, "
                            "multiply, then scale row i by descale_q and column j by descale_k"))


# ---------------------------------------------------------------------------------------------
# (e) fp8_attention

def _attention_from(scores, v_back, rnd, d, *, rotate_v=None, scale=True, p_scale=MAX,
                    round_p=True, sum_after=False):
    """O from given FP8 scores and dequantized v, the steps (or one of them changed) of (e)."""
    s = scores / np.sqrt(d) if scale else scores
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p8 = rnd(p_scale * p) / p_scale if round_p else p
    l = (p8 if sum_after else p).sum(axis=-1, keepdims=True)
    return p8 @ v_back / l


def _dequantized(x, block, quantize):
    x_q, descale = quantize(x, block)
    return x_q * np.repeat(descale, block, axis=-1)[..., :x.shape[-2], None]


def _learner_parts(impl, q, k, v, block, signs):
    """(S, dequantized v, round) from the learner's own fp8_scores, quantize_e4m3 and
    round_e4m3, or None if they cannot give them."""
    try:
        scores = _call(impl, "fp8_scores", q, k, block, signs)
        v_back = _dequantized(v, block, lambda x, b: _call(impl, "quantize_e4m3", x, b, returns=2))
        rnd = lambda x: _call(impl, "round_e4m3", x)  # noqa: E731
        rnd(np.array([0.5]))
        return scores, v_back, rnd
    except Exception:      # a part not done, or failing in its own checks
        return None


def _attention_hint(impl, q, k, v, block, signs, got):
    d = q.shape[-1]
    sources = [(_scores(q, k, block, signs), _dequantized(v, block, lambda x, b: _quantize(x, b)[:2]),
                _round)]
    mine = _learner_parts(impl, q, k, v, block, signs)
    if mine is not None:
        sources.append(mine)
    for scores, v_back, rnd in sources:
        guesses = [(HINT_P_ROUND, dict(round_p=False)), (HINT_P_SCALE, dict(p_scale=1.0)),
                   (HINT_SCALE, dict(scale=False)), (HINT_SUM, dict(sum_after=True))]
        for hint, change in guesses:
            if _close(got, _attention_from(scores, v_back, rnd, d, **change)):
                return hint
        if _close(got, _attention_from(scores, v, rnd, d)):
            return HINT_V
        if signs is not None:
            v_rot = _dequantized(_rotate(v, signs), block, lambda x, b: _quantize(x, b)[:2])
            if _close(got, _attention_from(scores, v_rot, rnd, d)):
                return HINT_V_ROTATED
    if mine is None or not _close(mine[0], sources[0][0]):
        return HINT_ATT_PARTS
    return None


def check_attention(impl, rng):
    """fp8_attention: O with q, k, v and P through e4m3 matches the same steps in float64, with
    and without the rotation, inputs with rare large entries and with outlier channels, leading
    dims, short last blocks, one descale per tensor"""
    for lead, Nq, Nk, d, block, rotate, kind in (((), 45, 70, 64, 16, True, "entries"),
                                                 ((2,), 30, 19, 32, 8, False, "channels"),
                                                 ((2,), 33, 40, 32, 40, True, "channels"),
                                                 ((3,), 20, 64, 16, 64, False, "entries")):
        q, k, v = (rng.standard_normal((*lead, n, d)) for n in (Nq, Nk, Nk))
        if kind == "entries":                      # rare large entries anywhere (Table 3's kind)
            for x in (q, k, v):
                hit = rng.random(x.shape) < 0.01
                x[hit] += 10.0 * rng.standard_normal(int(hit.sum()))
        else:                                      # outlier channels shared by q and k
            q[..., 1] *= 30.0
            k[..., 1] *= 30.0
        signs = rng.choice([-1.0, 1.0], d) if rotate else None
        got = _call(impl, "fp8_attention", q, k, v, block, signs)
        scores = _scores(q, k, block, signs)
        want = _attention_from(scores, _dequantized(v, block, lambda x, b: _quantize(x, b)[:2]),
                               _round, d)
        what = f"fp8_attention of q {q.shape}, k and v {k.shape}, blocks of {block}, " + \
            ("rotated" if rotate else "signs=None")
        if got.shape != want.shape:
            checks.fail(f"{what}: shape {got.shape}, expected {want.shape}")
        mine = _learner_parts(impl, q, k, v, block, signs)
        if not (_close(got, want) or (mine is not None and _close(got, _attention_from(*mine, d)))):
            checks.fail(f"{what}: off by up to {np.abs(got - want).max():.3g} (O up to "
                        f"{np.abs(want).max():.3g})", _attention_hint(impl, q, k, v, block, signs, got)
                        or ("S from fp8_scores times 1/sqrt(d), P = exp(S - row max), l its row "
                            "sums, then P_8 = round_e4m3(448 P) / 448 and O = P_8 @ v / l with v "
                            "quantized in blocks"))


CHECKS = [check_round_grid, check_round_nearest, check_round_ties, check_round_subnormals,
          check_round_saturates, check_quantize, check_quantize_zero_blocks,
          check_quantize_extremes, check_rotate, check_rotate_orthogonal, check_rotate_fast,
          check_scores, check_attention]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex12(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
