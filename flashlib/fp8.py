"""FP8 attention's host side: quantising q, k, v to e4m3 with per-(batch, kv-head) scales, and
FlashAttention-3's incoherent processing (Shah et al. 2024, section 3.3).

``quantize(x, heads_kv)`` returns ``(x8, descale)``: x8 float8_e4m3fn, descale float32
``(B, heads_kv)`` with x ~= x8 * descale (per head group: the query heads of one K/V head share a
factor, FA3's interface). ``flash_attention(q8, k8, v8, q_descale=, k_descale=, v_descale=)``
runs the FP8 forward on Hopper (``kernels/fa3_fwd.fa3_forward_fp8``) and returns bfloat16.

e4m3 keeps 3 mantissa bits: each entry is off by up to 1/16 of itself. Per-block scales keep
the grid where the values are, but one outlier channel (a large feature that every token shares,
common in trained LLMs) sets the scale of its whole head and pushes the other channels into
few levels. ``hadamard_rotation(D)`` is a random orthogonal matrix R (a Hadamard matrix with
random signs): ``(q R)(k R)^T = q k^T`` exactly, while the rotation spreads an outlier over all
channels before quantising, so the scale fits every channel. Lesson 12 measures the effect.
"""
import math

import torch

from .inputs import all_once, capturing

E4M3_MAX = 448.0      # the largest finite float8_e4m3fn


def quantize(x, heads_kv):
    """x (B, H, N, D) float -> (x8 float8_e4m3fn like x, descale float32 (B, heads_kv)): each
    group of H // heads_kv heads scaled so its largest |entry| maps to e4m3's 448."""
    if not isinstance(x, torch.Tensor) or x.ndim != 4 or not x.is_floating_point():
        raise ValueError(f"x must be a (batch, heads, seqlen, headdim) float tensor, got "
                         f"{type(x).__name__} {tuple(getattr(x, 'shape', ()))}")
    B, H, N, D = x.shape
    if not isinstance(heads_kv, int) or heads_kv <= 0 or H % heads_kv:
        raise ValueError(f"heads_kv must be a positive divisor of x's {H} heads, got {heads_kv!r}")
    groups = x.float().reshape(B, heads_kv, -1)                               # (B, Hkv, G N D)
    amax = groups.abs().amax(-1) if groups.shape[-1] else groups.new_zeros(B, heads_kv)
    descale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))    # 0 stays 0
    x8 = (groups / descale[..., None]).reshape(x.shape).to(torch.float8_e4m3fn)
    return x8, descale.contiguous()


def dequantize(x8, descale):
    """x8 (B, H, N, D) float8_e4m3fn, descale (B, heads_kv) -> float32 x8 * descale per group."""
    B, H = x8.shape[:2]
    g = H // descale.shape[1]
    return x8.float() * descale.repeat_interleave(g, dim=1)[:, :, None, None]


def hadamard_rotation(D, *, seed=0, device=None):
    """A random orthogonal (D, D) float32 matrix: a Sylvester-Hadamard matrix / sqrt(D), its
    rows with random signs. D a power of two."""
    if not isinstance(D, int) or D <= 0 or D & (D - 1):
        raise ValueError(f"D must be a positive power of two, got {D!r}")
    h = torch.ones(1, 1)
    while h.shape[0] < D:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    signs = torch.randint(0, 2, (D,), generator=torch.Generator().manual_seed(seed)) * 2 - 1
    return (signs[:, None] * h / math.sqrt(D)).to(device)


def check_descales(q, k, v, q_descale, k_descale, v_descale):
    """Validate FP8 inputs for flash_attention: all three float8_e4m3fn, descales float32
    (B, heads_kv) on q's device, finite and >= 0. Errors name the argument. Returns the three
    stacked, (3, B, heads_kv), as the kernel takes them. Their values are read back from the GPU
    once (a synchronisation: the kernel waits behind it), not once per test and descale."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype != torch.float8_e4m3fn:
            raise TypeError(f"{name} has dtype {t.dtype}: FP8 attention takes float8_e4m3fn q, "
                            "k and v (flashlib.fp8.quantize makes them)")
    B, Hkv = q.shape[0], k.shape[1]
    for name, d in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if d is None:
            raise ValueError(f"{name} is required with float8 inputs: float32 (batch, heads_kv) "
                             f"= ({B}, {Hkv}), e.g. from flashlib.fp8.quantize")
        if not isinstance(d, torch.Tensor) or d.dtype != torch.float32 or tuple(d.shape) != (B, Hkv):
            raise ValueError(f"{name} must be a float32 tensor of shape (batch, heads_kv) = "
                             f"({B}, {Hkv}), got {getattr(d, 'dtype', type(d).__name__)} "
                             f"{tuple(getattr(d, 'shape', ()))}")
        if d.device != q.device:
            raise ValueError(f"{name} is on {d.device} but q is on {q.device}")
    # read once per version of each tensor (a layer's static scales: a sync on the first call
    # only), not while a CUDA graph is captured (no sync allowed: the eager warm-up checked them)
    named = (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))
    if not capturing(q) and not all_once([d for _, d in named], _valid_descales):
        raise ValueError(" and ".join(name for name, d in named if not _valid_descales(d))
                         + " must be finite and >= 0")
    return torch.stack([q_descale, k_descale, v_descale])


def _valid_descales(d):
    return bool((torch.isfinite(d) & (d >= 0)).all())
