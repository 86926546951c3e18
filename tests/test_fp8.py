"""FP8 attention (flashlib.fp8, kernels/fa3_fwd.fa3_forward_fp8): quantisation, incoherent
processing and the input checks on the CPU; the Hopper kernel against the float64 oracle on a GPU.

The kernel's error has a known source: P is rounded to e4m3 (3 mantissa bits) before O = P V.
``p_rounding_model`` computes attention on the dequantised inputs in float64 with only that
rounding, and the kernel's error against the oracle must stay within a small multiple of the
model's (the kernel rounds P at its running maximum, the model at the row's final one: the same
relative precision, different roundings). A wrong mask, head or scale gives errors far larger.
"""
import math

import pytest
import torch

import flashlib
from flashlib import fp8, runtime
from flashlib.reference import attention_ref, causal_mask

gpu = pytest.mark.skipif(runtime.DEVICE.type != "cuda", reason="needs a CUDA GPU")


def p_rounding_model(q, k, v, causal=False):
    """Attention in float64 with P = exp(S - max) rounded to e4m3, normalised by the exact sum;
    q, k, v float (B, H, N, D), k and v with Hkv heads."""
    q, k, v = (t.double() for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(g, dim=1) for t in (k, v))
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(~causal_mask(q.shape[2], k.shape[2], s.device), float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    l = p.sum(-1, keepdim=True)
    p8 = p.float().to(torch.float8_e4m3fn).double()
    return torch.where(l > 0, p8 @ v / l.clamp_min(1e-300), torch.zeros_like(q))


def quantized(q, k, v):
    Hkv = k.shape[1]
    return [fp8.quantize(t, Hkv) for t in (q, k, v)]


def rms(x):
    return x.double().pow(2).mean().sqrt().item()


def test_quantize_round_trip_and_scales():
    torch.manual_seed(0)
    x = torch.randn(2, 6, 33, 40) * torch.tensor([0.01, 1, 100]).repeat(2)[None, :, None, None]
    x8, descale = fp8.quantize(x, 3)                 # groups of two heads share a scale
    assert x8.dtype == torch.float8_e4m3fn and descale.shape == (2, 3) and descale.dtype == torch.float32
    groups = x.reshape(2, 3, -1)
    torch.testing.assert_close(descale, groups.abs().amax(-1) / fp8.E4M3_MAX)
    back = fp8.dequantize(x8, descale)
    # e4m3: 3 mantissa bits, so a normal number is off by at most 1/16 of itself; below 2^-6
    # (subnormals) by at most half a step of 2^-9, in units of the group's descale
    step = descale.repeat_interleave(2, 1)[:, :, None, None]
    assert bool(((back - x).abs() <= x.abs() / 16 + step * 2.0 ** -10).all())
    assert (back.abs().amax() - x.abs().amax()).abs() <= 1e-6 * x.abs().amax()   # 448 is exact


def test_quantize_zeros_and_empty_and_bad_arguments():
    x8, descale = fp8.quantize(torch.zeros(1, 2, 5, 8), 2)
    assert descale.tolist() == [[1.0, 1.0]] and not x8.float().any()
    x8, descale = fp8.quantize(torch.zeros(1, 2, 0, 8), 1)
    assert x8.shape == (1, 2, 0, 8) and descale.tolist() == [[1.0]]
    with pytest.raises(ValueError, match="heads_kv"):
        fp8.quantize(torch.zeros(1, 4, 5, 8), 3)
    with pytest.raises(ValueError, match="x must be"):
        fp8.quantize(torch.zeros(4, 5, 8), 1)


def test_hadamard_rotation_is_orthogonal_and_keeps_scores():
    for D in (1, 2, 64, 128):
        R = fp8.hadamard_rotation(D, seed=3).double()
        torch.testing.assert_close(R @ R.T, torch.eye(D, dtype=torch.float64), atol=1e-6, rtol=0)
    q, k = torch.randn(2, 3, 10, 64, dtype=torch.float64), torch.randn(2, 3, 7, 64, dtype=torch.float64)
    R = fp8.hadamard_rotation(64).double()
    torch.testing.assert_close((q @ R) @ (k @ R).transpose(-1, -2), q @ k.transpose(-1, -2))
    assert not torch.equal(fp8.hadamard_rotation(64, seed=1), fp8.hadamard_rotation(64, seed=2))
    for bad in (0, 48, 2.0):
        with pytest.raises(ValueError, match="power of two"):
            fp8.hadamard_rotation(bad)


def outlier_inputs(B=1, H=4, N=384, D=128, seed=0, device="cpu"):
    """q, k with one large channel shared by every token (as trained LLMs have), v plain."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, D, generator=g) for _ in range(3))
    q[..., 5] += 30.0
    k[..., 5] += 3.0
    return [t.to(device) for t in (q, k, v)]


def test_rotation_cuts_the_fp8_error_on_outlier_features():
    """The model of the FP8 forward on quantised inputs: the rotation of q and k before
    quantising cuts the RMS error against the exact result (measured 2.3x here)."""
    q, k, v = outlier_inputs()
    ref, _ = attention_ref(q, k, v)
    R = fp8.hadamard_rotation(q.shape[-1], seed=1)

    def model_error(q, k):
        deq = [fp8.dequantize(*qt) for qt in quantized(q, k, v)]
        return rms(p_rounding_model(*deq) - ref)

    plain, rotated = model_error(q, k), model_error(q @ R, k @ R)
    assert rotated * 1.5 < plain, (plain, rotated)


@pytest.mark.parametrize("shape", [(2, 3, 100, 64), (1, 2, 7, 128), (2, 1, 129, 80), (1, 1, 0, 64)])
def test_v_transpose_kernel_matches_torch(shape):
    """The FP8 forward's V^T (kernels/fa3_fwd.transpose_rows, a Triton kernel, here through the
    interpreter on a CPU): every byte of every head in place, ragged lengths, strided heads."""
    from flashlib.kernels.fa3_fwd import transpose_rows
    g = torch.Generator().manual_seed(0)
    v = torch.randint(0, 256, shape, dtype=torch.uint8, generator=g).view(torch.float8_e4m3fn)
    strided = v.transpose(1, 2).contiguous().transpose(1, 2)        # heads not adjacent
    width = -(-shape[2] // 16) * 16
    for x in (v, strided):
        out = transpose_rows(x.to(runtime.DEVICE), width)
        assert out.shape == (*shape[:2], shape[3], width)
        assert torch.equal(out[..., :shape[2]].view(torch.uint8).cpu(), v.transpose(2, 3).view(torch.uint8))


def key_at(col):
    """fa3_fwd.fp8_key_at in Python: the key whose row column col of V^T holds."""
    r = col % 32
    return col - r + (r & 17) + ((r >> 1) & 1) * 8 + ((r >> 2) & 3) * 2


def test_fp8_key_order_puts_each_threads_p_in_its_own_fragment():
    """The key order of the FP8 forward's V^T (fa3_fwd._p_operand): in each 32 columns, the
    columns lane q's 8-bit wgmma A fragment holds (4q ... 4q + 3 and 4q + 16 ... 4q + 19: PTX ISA,
    the .e4m3 A register fragment) hold the keys whose P lane q of the S accumulator holds (2q,
    2q + 1, then + 8, + 16, + 24: wgmma's 64xNxK f32 accumulator fragment), register by register,
    so the A operand is P's registers as they are. A bijection on every 32 columns."""
    for group in range(3):
        keys = [key_at(32 * group + c) - 32 * group for c in range(32)]
        assert sorted(keys) == list(range(32))
        for q in range(4):
            a_fragment_cols = [4 * q + i + 16 * h for h in range(2) for i in range(4)]
            accumulator_keys = [2 * q + b + 8 * j for j in range(4) for b in range(2)]
            assert [keys[c] for c in a_fragment_cols] == accumulator_keys


@pytest.mark.parametrize("shape", [(2, 3, 100, 64), (1, 2, 7, 128), (1, 1, 64, 64), (1, 1, 0, 64),
                                   (0, 2, 40, 64)])
def test_v_transpose_kernel_in_key_order(shape):
    """transpose_rows(key_order=True) through the interpreter: column n holds key fp8_key_at(n)'s
    row, zeros for the padding keys up to the width (their P is 0; garbage there could be NaN
    and 0 * NaN is NaN)."""
    from flashlib.kernels.fa3_fwd import transpose_rows
    g = torch.Generator().manual_seed(1)
    v = torch.randint(1, 256, shape, dtype=torch.uint8, generator=g)  # no zero byte: zeros are padding
    N, width = shape[2], -(-shape[2] // 32) * 32
    out = transpose_rows(v.view(torch.float8_e4m3fn).to(runtime.DEVICE), width, key_order=True)
    assert out.shape == (*shape[:2], shape[3], width)
    padded = torch.cat([v, torch.zeros(*shape[:2], width - N, shape[3], dtype=torch.uint8)], dim=2)
    expect = padded[:, :, [key_at(c) for c in range(width)]].transpose(2, 3)
    assert torch.equal(out.view(torch.uint8).cpu(), expect)
    with pytest.raises(ValueError, match="width 48 must be a multiple of 32"):
        transpose_rows(v.view(torch.float8_e4m3fn), 48, key_order=True)


def test_flash_attention_fp8_input_errors():
    q, k, v = (torch.randn(1, 2, 16, 64) for _ in range(3))
    (q8, qd), (k8, kd), (v8, vd) = quantized(q, k, v)
    with pytest.raises(ValueError, match="q_descale is required"):
        flashlib.flash_attention(q8, k8, v8)
    with pytest.raises(TypeError, match="float8_e4m3fn q, k and v"):
        flashlib.flash_attention(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd)
    with pytest.raises(TypeError, match="got torch.float8_e4m3fn, torch.float8_e4m3fn, torch.float32"):
        flashlib.flash_attention(q8, k8, v, q_descale=qd, k_descale=kd, v_descale=vd)
    with pytest.raises(ValueError, match=r"k_descale must be a float32 tensor of shape \(batch, heads_kv\)"):
        flashlib.flash_attention(q8, k8, v8, q_descale=qd, k_descale=kd[:, :0], v_descale=vd)
    with pytest.raises(ValueError, match="v_descale must be finite"):
        flashlib.flash_attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd * float("nan"))
    with pytest.raises(ValueError, match="k_descale must be finite and >= 0"):
        flashlib.flash_attention(q8, k8, v8, q_descale=qd, k_descale=-kd, v_descale=vd)
    with pytest.raises(ValueError, match="softcap"):
        flashlib.flash_attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, softcap=5.0)
    if runtime.DEVICE.type != "cuda":
        with pytest.raises(RuntimeError, match="Hopper GPU"):
            flashlib.flash_attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)


def hopper():
    from flashlib.kernels import fa3_fwd
    x = torch.zeros(1, 1, 16, 64, device=runtime.DEVICE).to(torch.float8_e4m3fn)
    return fa3_fwd.supported_fp8(x, x, x)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 4, 2, 1000, 1531, 128, True), (1, 2, 2, 1, 700, 64, False),
                                   (1, 4, 1, 777, 300, 64, True), (2, 8, 8, 4096, 4096, 128, False),
                                   (1, 2, 1, 333, 333, 128, False)])
@pytest.mark.parametrize("logit_scale", [1.0, 20.0])
def test_gpu_fp8_forward_against_the_oracle(shape, logit_scale):
    """The FP8 forward's error against the float64 oracle on the dequantised inputs stays within
    3x the P-rounding model's (RMS and max), rows with no key give 0 and lse -inf, lse is close."""
    if not hopper():
        pytest.skip("FP8 attention needs an sm90 GPU and Triton 3.6's Gluon")
    B, Hq, Hkv, Nq, Nk, D, causal = shape
    g = torch.Generator(device="cuda").manual_seed(Nq + Nk)
    q = torch.randn(B, Hq, Nq, D, device="cuda", generator=g) * logit_scale
    k, v = (torch.randn(B, Hkv, Nk, D, device="cuda", generator=g) for _ in range(2))
    (q8, qd), (k8, kd), (v8, vd) = quantized(q, k, v)
    out, lse = flashlib.flash_attention(q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd,
                                        v_descale=vd, return_lse=True)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape and lse.shape == q.shape[:3]
    err, model_err = check_against_oracle(out, lse, (q8, qd), (k8, kd), (v8, vd), causal=causal)
    print(f"{shape} x{logit_scale}: rms error {err:.2e} (P-rounding model {model_err:.2e})")


def check_against_oracle(out, lse, *quantized_qkv, causal):
    """Assert that an FP8 forward's (out, lse) are within 3x the P-rounding model's error of the
    float64 oracle on the dequantised inputs (RMS and max), rows with no key give 0 and lse -inf,
    and lse is close; return (RMS error, the model's)."""
    deq = [fp8.dequantize(x8, xd) for x8, xd in quantized_qkv]
    ref, ref_lse = attention_ref(*deq, causal=causal)
    model = p_rounding_model(*deq, causal=causal)
    err, model_err = (out.double() - ref), (model - ref)
    assert not out.isnan().any()
    assert rms(err) <= 3 * rms(model_err) + 1e-4, (rms(err), rms(model_err))
    assert err.abs().max() <= 3 * model_err.abs().max() + 2e-3, (err.abs().max(), model_err.abs().max())
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse), empty) and not out[empty].any()
    # FP8 wgmma accumulates S with fewer bits than float32: relative lse differences up to 8.1e-4
    # at scores near 70 (q x 20) on an H100
    torch.testing.assert_close(lse[~empty].double(), ref_lse[~empty], atol=2e-3, rtol=2e-3)
    return rms(err), rms(model_err)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["simple", "2wg", "2wg_overlap", "2wg_pingpong"])
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_fp8_every_variant_against_the_oracle(variant, D):
    """Each of the FP8 forward's variants (kernels/fa3_fwd.VARIANTS; the launcher picks one per
    head dim and mask), ragged and with grouped heads, causal where the variant runs it."""
    if not hopper():
        pytest.skip("FP8 attention needs an sm90 GPU and Triton 3.6's Gluon")
    from flashlib.kernels import fa3_fwd
    causal = fa3_fwd.VARIANTS[variant].num_wg > 1
    g = torch.Generator(device="cuda").manual_seed(D)
    q = torch.randn(2, 4, 1000, D, device="cuda", generator=g) * 3
    k, v = (torch.randn(2, 2, 1531, D, device="cuda", generator=g) for _ in range(2))
    (q8, qd), (k8, kd), (v8, vd) = quantized(q, k, v)
    out, lse = fa3_fwd.fa3_forward_fp8(q8, k8, v8, torch.stack([qd, kd, vd]), causal=causal,
                                       variant=variant)
    check_against_oracle(out, lse, (q8, qd), (k8, kd), (v8, vd), causal=causal)


@gpu
@pytest.mark.gpu
def test_gpu_fp8_zero_descale_gives_uniform_weights():
    """A k_descale of 0 makes every score of that head 0: its output is the mean of the visible
    values, under a causal mask too (the kernel keeps a folded scale of 0 at 1e-30, so that masked
    keys stay -inf and not -inf * 0 = NaN; fa3_fwd._fa3_fwd_kernel)."""
    if not hopper():
        pytest.skip("FP8 attention needs an sm90 GPU and Triton 3.6's Gluon")
    g = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.randn(2, 4, 300, 64, device="cuda", generator=g) for _ in range(3))
    (q8, qd), (k8, kd), (v8, vd) = quantized(q, k, v)
    kd = kd.clone()
    kd[:, 1] = 0.0
    out, lse = flashlib.flash_attention(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd,
                                        v_descale=vd, return_lse=True)
    deq = [fp8.dequantize(q8, qd), fp8.dequantize(k8, kd), fp8.dequantize(v8, vd)]
    ref, ref_lse = attention_ref(*deq, causal=True)
    assert not out.isnan().any() and not lse.isnan().any()
    model_err = (p_rounding_model(*deq, causal=True) - ref).abs().max().item()
    assert (out.double() - ref).abs().max() <= 3 * model_err + 2e-3
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=2e-3)
    # the zeroed head: uniform weights, the running mean of v (e4m3 P of 1 is exact)
    mean = deq[2][:, 1].cumsum(1) / torch.arange(1, 301, device="cuda")[:, None]
    torch.testing.assert_close(out[:, 1].float(), mean, atol=1e-2, rtol=1e-2)


@gpu
@pytest.mark.gpu
def test_gpu_fp8_rotation_cuts_the_kernel_error_on_outlier_features():
    if not hopper():
        pytest.skip("FP8 attention needs an sm90 GPU and Triton 3.6's Gluon")
    q, k, v = outlier_inputs(B=2, N=1024, device="cuda")
    ref, _ = attention_ref(q, k, v)
    R = fp8.hadamard_rotation(q.shape[-1], seed=1, device="cuda")
    errors = []
    for qr, kr in ((q, k), (q @ R, k @ R)):
        (q8, qd), (k8, kd), (v8, vd) = quantized(qr, kr, v)
        out = flashlib.flash_attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)
        errors.append(rms(out.double() - ref))
    fp16 = rms(flashlib.flash_attention(q.half(), k.half(), v.half()).double() - ref)
    print(f"rms error: fp8 {errors[0]:.2e}, fp8 rotated {errors[1]:.2e}, fp16 {fp16:.2e}")
    assert errors[1] * 1.5 < errors[0], errors


def test_descales_are_read_once_per_version(monkeypatch):
    """The descales' check reads them on the host (a device sync): a layer's static scales are
    read on the first call only, all three in one read, and again after an in-place change. The
    check runs before the kernel, so this holds on a CPU too (the kernel then refuses)."""
    reads, valid = [], fp8._valid_descales
    monkeypatch.setattr(fp8, "_valid_descales", lambda d: reads.append(d.numel()) or valid(d))
    q8, qd = fp8.quantize(torch.randn(2, 4, 8, 64), 2)
    (k8, kd), (v8, vd) = (fp8.quantize(torch.randn(2, 2, 8, 64), 2) for _ in range(2))
    for _ in range(2):
        assert torch.equal(fp8.check_descales(q8, k8, v8, qd, kd, vd), torch.stack([qd, kd, vd]))
    assert reads == [12]                              # one read of the three (B, Hkv) = (2, 2)
    kd[1, 0] = float("inf")                           # in place: read again, the culprit named
    with pytest.raises(ValueError, match="^k_descale must be finite and >= 0$"):
        fp8.check_descales(q8, k8, v8, qd, kd, vd)
    assert reads == [12, 4, 4, 4, 4]   # k_descale alone was due a read; then the error names it
    kd[1, 0] = 1.0
    fp8.check_descales(q8, k8, v8, qd, kd, vd)
    assert reads[5:] == [4]            # the failed read kept nothing: k_descale read again
