"""Lesson 12's FP8 error measurement: attention's output as FlashAttention-3's FP8 forward computes
it, in float64 NumPy, so the error can be measured the way FA3 measures it (Shah et al., 2024,
section 4.3, Table 3: the RMSE of O with Q, K, V and P in FP8).

``fp8_attention(q, k, v, block, signs)``: q and k rotated by the same random Hadamard matrix when
``signs`` is given (incoherent processing, section 3.3); q, k and v quantized to e4m3 with one
descale per block of ``block`` rows (block quantization, section 3.3; ``block`` = N is one descale
per tensor, the paper's baseline); S from the FP8 values times both descales and 1/sqrt(d); the
softmax's P in [0, 1] rounded to e4m3 after scaling by 448, its row sums taken before rounding (a
kernel keeps them in float32); O = P V / l. ``outlier_inputs`` draws q, k, v with rare large
entries, the kind of inputs Table 3 uses.

Limits: rounding by PyTorch's float8_e4m3fn cast (through float32); no tiling or online softmax
(the FP8 rounding, not the loop, is what is measured); the same answer as exercise 12's
``fp8_attention``, which the lesson uses instead once it is solved.
"""
import numpy as np
import torch

E4M3_MAX = 448.0


def round_e4m3(x):
    """x rounded to e4m3 by PyTorch's cast, saturating at +-448 (float64 in and out)."""
    x = np.clip(np.asarray(x, dtype=np.float64), -E4M3_MAX, E4M3_MAX)
    return torch.from_numpy(x).to(torch.float8_e4m3fn).double().numpy()


def quantize_blocks(x, block):
    """x (..., N, d) -> (x_q, descale (..., ceil(N / block))), descale = a block's amax / 448."""
    N = x.shape[-2]
    starts = range(0, N, block)
    amax = np.stack([np.abs(x[..., s:s + block, :]).max(axis=(-2, -1)) for s in starts], axis=-1)
    descale = np.where(amax > 0, amax / E4M3_MAX, 1.0)
    rows = np.repeat(descale, block, axis=-1)[..., :N, None]                  # (..., N, 1)
    return round_e4m3(x / rows), descale


def hadamard_rotate(x, signs):
    """x (..., d) @ diag(signs) @ H / sqrt(d), Sylvester's H, by the fast Walsh-Hadamard transform."""
    *lead, d = x.shape
    y = x * signs
    h = 1
    while h < d:
        pairs = y.reshape(*lead, d // (2 * h), 2, h)
        y = np.stack([pairs[..., 0, :] + pairs[..., 1, :], pairs[..., 0, :] - pairs[..., 1, :]],
                     axis=-2).reshape(*lead, d)
        h *= 2
    return y / np.sqrt(d)


def _dequantized(x, block):
    x_q, descale = quantize_blocks(x, block)
    return x_q * np.repeat(descale, block, axis=-1)[..., :x.shape[-2], None]


def fp8_attention(q, k, v, block, signs=None):
    """softmax(q k^T / sqrt(d)) v with q, k, v and P through e4m3 (see the module docstring).
    q (..., Nq, d), k and v (..., Nk, d); returns O (..., Nq, d), float64."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    if signs is not None:
        q, k = hadamard_rotate(q, signs), hadamard_rotate(k, signs)
    q, k, v = (_dequantized(x, block) for x in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])                      # (..., Nq, Nk)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    l = p.sum(axis=-1, keepdims=True)                                         # before rounding
    return round_e4m3(E4M3_MAX * p) / E4M3_MAX @ v / l                        # (..., Nq, d)


def outlier_inputs(rng, shape, *, fraction=0.001, scale=10.0):
    """q, k, v of ``shape``: standard normal, plus a term of standard deviation ``scale`` in a
    ``fraction`` of the entries, anywhere."""
    out = []
    for _ in range(3):
        x = rng.standard_normal(shape)
        hit = rng.random(shape) < fraction
        x[hit] += scale * rng.standard_normal(int(hit.sum()))
        out.append(x)
    return out
