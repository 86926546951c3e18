"""flashlib.teach.fp8_error (lesson 12): attention's output with q, k, v and P through e4m3.

The rotation is the dense Hadamard matrix with random signs; quantization keeps each block to
e4m3's relative precision and a block of zeros at zero; the FP8 output is within FP8's error of
float64 attention and exactly it when every value is on the grid; with outlier channels shared by
q and k, the rotation cuts the error of one descale per tensor (FA3 section 3.3, Table 3's
ordering).
"""
import numpy as np

from flashlib.teach import fp8_error


def _attention(q, k, v):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return p @ v / p.sum(axis=-1, keepdims=True)


def test_rotation_is_the_hadamard_matrix():
    rng = np.random.default_rng(1)
    d = 32
    h = np.ones((1, 1))
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    x, signs = rng.standard_normal((3, 5, d)), rng.choice([-1.0, 1.0], d)
    np.testing.assert_allclose(fp8_error.hadamard_rotate(x, signs), x @ (signs[:, None] * h) / np.sqrt(d),
                               atol=1e-12)


def test_quantize_blocks_keeps_each_block():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 37, 8)) * 10.0 ** rng.uniform(-4, 4, (2, 37, 1))
    x[0, 16:32] = 0.0                                             # a block of zeros
    x_q, descale = fp8_error.quantize_blocks(x, 16)
    assert descale.shape == (2, 3) and descale[0, 1] == 1.0 and np.all(x_q[0, 16:32] == 0)
    back = x_q * np.repeat(descale, 16, axis=-1)[..., :37, None]
    for b in range(3):
        rows = slice(16 * b, 16 * (b + 1))
        amax = np.abs(x[:, rows]).max(axis=(-2, -1), keepdims=True)
        assert np.all(np.abs(back[:, rows] - x[:, rows]) <= np.maximum(np.abs(x[:, rows]) / 16,
                                                                       2.0 ** -10 * amax))


def test_fp8_attention_errors():
    rng = np.random.default_rng(3)
    q, k, v = fp8_error.outlier_inputs(rng, (2, 64, 32))
    exact = _attention(q, k, v)
    got = fp8_error.fp8_attention(q, k, v, 16, rng.choice([-1.0, 1.0], 32))
    assert got.shape == exact.shape and np.all(np.isfinite(got))
    assert 1e-4 < np.sqrt(((got - exact) ** 2).mean()) < 0.1 * np.sqrt((exact ** 2).mean())
    on_grid = [np.round(x * 4) / 4 for x in (q, k, v)]            # multiples of 1/4, |x| < 448
    on_grid = [np.clip(x, -4, 4) for x in on_grid]
    p_exact = fp8_error.fp8_attention(*on_grid, 64)               # only P is rounded
    assert np.abs(p_exact - _attention(*on_grid)).max() < 0.07 * np.abs(on_grid[2]).max()


def test_rotation_beats_one_descale_per_tensor_on_outlier_channels():
    rng = np.random.default_rng(4)
    q, k, v = rng.standard_normal((3, 256, 64))
    q[:, [3, 40]] *= 60.0
    k[:, [3, 40]] *= 60.0
    exact = _attention(q, k, v)
    rmse = {name: np.sqrt(((fp8_error.fp8_attention(q, k, v, **how) - exact) ** 2).mean())
            for name, how in (("per tensor", dict(block=256)),
                              ("rotated", dict(block=64, signs=rng.choice([-1.0, 1.0], 64))))}
    assert rmse["rotated"] < rmse["per tensor"] / 2
