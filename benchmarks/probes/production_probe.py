"""Where the production suite's slow rows lose (issue 34), on a GPU, the portable kernels only.

1. ``softcap``: the plain FA2 kernel against the softcap through the hook (``kernels.score_mod``:
   tanh from exp2, one division per score), as it was before (two divisions per score), and with
   tanh as one PTX instruction (``tanh.approx.f32``: the hook's bfloat16 path, forced here on
   float16), at the suite's first two modifier shapes: error against the float64 oracle, forward
   and forward+backward time.
2. ``varlen``: the forward of the suite's d64/d128 pack, of the same pack cut into equal lengths,
   and of the dense kernel on the same tokens, under each of several fixed block configs (the
   production run of 2026-11-26 had the packed d128 forward at 0.72x the dense one, untuned).
   ``layout``: with the default configs, forward and forward+backward of the same four and of the
   dense kernel on (B, N, H, D) memory seen as (B, H, N, D), the layout of a projection's output
   and of the packed rows (row stride H x D).
3. ``softcap_fma``: the softcap's special-function ops moved to the FMA units (FA4's idea):
   exp2 as a cubic on the FMA pipe (``exp2_fma``) for all or half of the softmax's scores (a
   tile update through the forward's ``tile_update`` hook), and tanh's division as Newton steps
   (``tanh_softcap_newton``), forward only, against the plain forward and the library's softcaps.
   ``softcap_bounded``: bfloat16, the library's softcap (tanh.approx, no running max:
   ``tile.tile_update_bounded``) against the same with the running max and the plain kernel,
   forward and forward+backward, at the suite's three modifier shapes.
   ``fold``: bfloat16 forward and forward+backward against the plain kernel: the library's
   softcap (1 / c folded into the kernels' scale, ``ScoreMod.input_scale``) against the same
   dividing in the hook, and with the dK/dV configs that do not spill at d128 (ptxas for sm90:
   (64, 128, 8, 3) spills 248 bytes with a softcap); ALiBi's bias from the
   distance as an int tile (the library's) against the distance in float32 and a difference of
   per-row and per-column products (fewer instructions, rounded products). The log of
   2026-11-26 (h100/production_probe_fold.log) ran at 6a12855, where the library's ALiBi was
   the float32 distance, since reverted: its "alibi_int" was then this file's copy of the int form.
4. ``paged``: paged decode against contiguous at the short caches where it lost (eager, host time
   per call, CUDA graph), through ``flashlib.bench.production.paged_record``.

Every timed call is first checked against the oracle (``production.oracle_check``).

    FLASHLIB_FA3=0 FLASHLIB_AUTOTUNE=0 python benchmarks/probes/production_probe.py [softcap varlen layout layout_profile softcap_fma softcap_bounded fold paged]
"""
import os
import sys

os.environ.setdefault("FLASHLIB_FA3", "0")        # FA2 against FA2
os.environ.setdefault("FLASHLIB_AUTOTUNE", "0")   # the configs this probe sets

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from flashlib.bench import decode as bench_decode  # noqa: E402
from flashlib.bench import production as prod  # noqa: E402
from flashlib.bench.harness import time_ms, make_inputs, shape_for  # noqa: E402
from flashlib.kernels import config, fa2_bwd, fa2_fwd, score_mod  # noqa: E402
from flashlib.ops import FlashAttention  # noqa: E402

DTYPE = torch.float16


@triton.jit
def tanh_softcap_two_divisions(s, q_pos, k_pos, bh, args):
    """The softcap before 2026-11-26: s / cap per score, then tanh from exp2 and a division
    (Triton's f32 division is div.full.f32: a MUFU.RCP each)."""
    cap = tl.load(args + bh * score_mod.ARGS_PER_HEAD)
    y = s / cap
    e = tl.math.exp2(-2.8853900817779268 * tl.abs(y))
    t = (1.0 - e) / (1.0 + e)
    t = tl.where(y < 0, -t, t)
    return cap * t, 1.0 - t * t


@triton.jit
def exp2_fma(x):
    """2^x for x <= 0 on the FMA units: x = n + f (n = round(x) from adding 1.5 * 2^23), 2^f a
    quartic on [-0.5, 0.5] (relative error 2.7e-6, fitted here: a cubic's 7.5e-5 put the lse past
    the float32 tolerance), n added to the exponent bits; 0 below -127 (-inf: masked scores stay
    exactly 0)."""
    xc = tl.maximum(x, -127.0)
    t = xc + 12582912.0                                   # round(xc) in the low mantissa bits
    f = xc - (t - 12582912.0)                             # [-0.5, 0.5]
    p = (((0.00956999 * f + 0.05591754) * f + 0.24024744) * f + 0.69312185) * f + 0.99999928
    bits = p.to(tl.int32, bitcast=True) + (t.to(tl.int32, bitcast=True) << 23)
    return tl.where(x > -127.0, bits.to(tl.float32, bitcast=True), 0.0)


@triton.jit
def _tile_update_exp2(acc, m_i, l_i, s, v, DOT_PRECISION: tl.constexpr, HALF: tl.constexpr):
    """``tile.tile_update`` with exp2_fma for every score (HALF=False) or for every second column."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_safe)
    x = s - m_safe[:, None]                                               # (BM, BN)
    if HALF:
        a, b = tl.split(tl.reshape(x, (x.shape[0], x.shape[1] // 2, 2)))  # (BM, BN/2) each
        p = tl.reshape(tl.join(tl.math.exp2(a), exp2_fma(b)), (x.shape[0], x.shape[1]))
    else:
        p = exp2_fma(x)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def tile_update_exp2_fma(acc, m_i, l_i, s, v, DOT_PRECISION: tl.constexpr):
    return _tile_update_exp2(acc, m_i, l_i, s, v, DOT_PRECISION, False)


@triton.jit
def tile_update_exp2_half_fma(acc, m_i, l_i, s, v, DOT_PRECISION: tl.constexpr):
    return _tile_update_exp2(acc, m_i, l_i, s, v, DOT_PRECISION, True)


@triton.jit
def tanh_softcap_newton(s, q_pos, k_pos, bh, args):
    """The exp2 formula with 1 / (1 + e) as a linear guess and three Newton steps on the FMA units
    instead of a division (two left 1.2e-5: times the cap, past the lse's float32 tolerance):
    one special-function op per score, not two."""
    cap = tl.load(args + bh * score_mod.ARGS_PER_HEAD)
    y = s * (1.0 / cap)
    e = tl.math.exp2(-2.8853900817779268 * tl.abs(y))    # (0, 1]
    d = 1.0 + e                                           # (1, 2]
    r = 1.4117647058823530 - 0.47058823529411764 * d     # 24/17 - 8/17 d: 1/d within 1/17
    r = r + r * (1.0 - d * r)
    r = r + r * (1.0 - d * r)
    r = r + r * (1.0 - d * r)
    t = (1.0 - e) * r
    t = tl.where(y < 0, -t, t)
    return cap * t, 1.0 - t * t


def softcap_fma_part():
    print("\n# softcap_fma: FA2 forward, ms (TFLOP/s), ratio to plain, max error vs float64")
    update = fa2_fwd.tile_update_fn
    for D, N, causal in prod.MOD_SHAPES[:2]:
        B, H = shape_for(D, N)["B"], prod.WIDTH // D
        flops = prod.attention_flops(B, H, N, N, D, causal=causal)
        q, k, v = make_inputs(B, H, H, N, N, D, DTYPE, "cuda")
        mod = score_mod.make(q, score_mod.Modifiers(prod.SOFTCAP))
        approx = mod._replace(fn=score_mod.tanh_softcap_approx)
        newton = score_mod.ScoreMod(tanh_softcap_newton, mod.args)   # divides by the cap itself
        variants = {"plain": (score_mod.IDENTITY, update), "softcap_exp2_div": (mod, update),
                    "softcap_tanh_approx": (approx, update), "softcap_newton": (newton, update),
                    "tanh_approx+exp2_fma": (approx, tile_update_exp2_fma),
                    "tanh_approx+half_fma": (approx, tile_update_exp2_half_fma),
                    "newton+half_fma": (newton, tile_update_exp2_half_fma),
                    "newton+exp2_fma": (newton, tile_update_exp2_fma),
                    "plain+half_fma": (score_mod.IDENTITY, tile_update_exp2_half_fma)}
        base = None
        for name, (mod_, tile) in variants.items():
            options = {} if mod_ is score_mod.IDENTITY else {"softcap": prod.SOFTCAP}
            call = lambda q, k, v, m=mod_, t=tile: fa2_fwd.fa2_forward(  # noqa: E731
                q, k, v, causal=causal, score_mod=m, tile_update=t)[0]
            check = lambda out, o=options: prod.oracle_check(  # noqa: E731
                [tuple(t[:1, :2] for t in (out, q, k, v))], DTYPE, causal=causal, **o)
            try:
                err, fwd, _ = timed(call, (q, k, v), check, grad=False)
            except Exception as e:   # a variant that does not compile
                print(f"d{D} N{N} causal={causal} {name:22} {type(e).__name__}: {str(e)[:200]}")
                continue
            if fwd is None:
                print(f"d{D} N{N} causal={causal} {name:22} WRONG: error {err:.3g}")
                continue
            base = base or fwd
            print(f"d{D} N{N} causal={causal} {name:22} fwd {fwd:.3f} ms ({flops / fwd / 1e9:.0f}) "
                  f"{base / fwd:.3f}x plain; error {err:.3g}", flush=True)


def softcap_bounded_part():
    print("\n# softcap_bounded: bfloat16 FA2, ms (TFLOP/s), ratio to plain, max error vs float64")
    dtype = torch.bfloat16
    for D, N, causal in prod.MOD_SHAPES:
        B, H = shape_for(D, N)["B"], prod.WIDTH // D
        flops = prod.attention_flops(B, H, N, N, D, causal=causal)
        q, k, v = make_inputs(B, H, H, N, N, D, dtype, "cuda", requires_grad=True)
        mod = score_mod.make(q, score_mod.Modifiers(prod.SOFTCAP))
        # forward only: an explicit tile_update keeps the running max
        running_max = lambda q, k, v: fa2_fwd.fa2_forward(  # noqa: E731
            q, k, v, causal=causal, score_mod=mod, tile_update=fa2_fwd.tile_update_fn)[0]
        variants = {"plain": (lambda q, k, v: FlashAttention.apply(q, k, v, causal, D ** -0.5, score_mod.IDENTITY)[0], {}),
                    "softcap_bounded": (lambda q, k, v: FlashAttention.apply(q, k, v, causal, D ** -0.5, mod)[0],
                                        {"softcap": prod.SOFTCAP}),
                    "softcap_running_max": (running_max, {"softcap": prod.SOFTCAP})}
        base = None
        for name, (call, options) in variants.items():
            check = lambda out, o=options: prod.oracle_check(  # noqa: E731
                [tuple(t[:1, :2] for t in (out, q, k, v))], dtype, causal=causal, **o)
            err, fwd, fb = timed(call, (q, k, v), check, grad=name != "softcap_running_max")
            if fwd is None:
                print(f"d{D} N{N} causal={causal} {name:20} WRONG: error {err:.3g}")
                continue
            base = base or (fwd, fb)
            both = "" if fb is None else f"; fwd+bwd {fb:.3f} ms ({3.5 * flops / fb / 1e9:.0f}) {base[1] / fb:.3f}x plain"
            print(f"d{D} N{N} causal={causal} {name:20} fwd {fwd:.3f} ms ({flops / fwd / 1e9:.0f}) "
                  f"{base[0] / fwd:.3f}x plain{both}; error {err:.3g}", flush=True)


def timed(call, inputs, check, grad=True):
    """(error, fwd ms, fwd_bwd ms) of call(*inputs), checked first."""
    with torch.no_grad():
        err, ok = check(call(*inputs))
    if not ok:
        return err, None, None
    with torch.no_grad():
        fwd = time_ms(lambda: call(*inputs))
    if not grad:
        return err, fwd, None
    dout = torch.randn_like(call(*inputs))
    return err, fwd, time_ms(lambda: torch.autograd.grad(call(*inputs), inputs, dout))


def print_row(label, err, fwd, fb, base, flops):
    """One variant's line: forward and forward+backward ms, TFLOP/s and ratio to ``base`` (the
    first variant's (fwd, fwd_bwd) times, which this returns, set by the first correct one)."""
    if fwd is None:
        print(f"{label} WRONG: error {err:.3g}")
        return base
    base = base or (fwd, fb)
    print(f"{label} fwd {fwd:.3f} ms ({flops / fwd / 1e9:.0f}) {base[0] / fwd:.3f}x plain; fwd+bwd "
          f"{fb:.3f} ms ({3.5 * flops / fb / 1e9:.0f}) {base[1] / fb:.3f}x plain; error {err:.3g}", flush=True)
    return base


def softcap_part():
    print("\n# softcap: FA2 forward / forward+backward, ms (TFLOP/s), max error vs float64")
    for D, N, causal in prod.MOD_SHAPES[:2]:
        B, H = shape_for(D, N)["B"], prod.WIDTH // D
        flops = prod.attention_flops(B, H, N, N, D, causal=causal)
        q, k, v = make_inputs(B, H, H, N, N, D, DTYPE, "cuda", requires_grad=True)
        mod, cap = score_mod.make(q, score_mod.Modifiers(prod.SOFTCAP)), {"softcap": prod.SOFTCAP}
        variants = {"plain": (score_mod.IDENTITY, {}), "softcap": (mod, cap),
                    "softcap_two_divisions": (score_mod.ScoreMod(tanh_softcap_two_divisions, mod.args), cap),
                    "softcap_tanh_approx": (mod._replace(fn=score_mod.tanh_softcap_approx), cap)}
        base = None
        for name, (mod, options) in variants.items():
            call = lambda q, k, v, mod=mod: FlashAttention.apply(q, k, v, causal, D ** -0.5, mod)[0]  # noqa: E731
            check = lambda out, o=options: prod.oracle_check(  # noqa: E731
                [tuple(t[:1, :2] for t in (out, q, k, v))], DTYPE, causal=causal, **o)
            base = print_row(f"d{D} N{N} causal={causal} {name:22}", *timed(call, (q, k, v), check), base, flops)


VARLEN_CONFIGS = [(128, 64, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 3), (64, 128, 4, 3),
                  (128, 32, 4, 3)]


def varlen_part():
    print("\n# varlen forward, causal, 32k tokens: TFLOP/s per fixed config (BLOCK_M, BLOCK_N, warps, stages)")
    lengths = prod.document_lengths(prod.PACK_TOKENS, prod.PACK_DOCS)
    equal = [prod.PACK_TOKENS // prod.PACK_DOCS] * prod.PACK_DOCS
    kernel, chosen = fa2_fwd._fa2_fwd_kernel, fa2_fwd._choose
    for D in prod.PACK_DIMS:
        H = prod.WIDTH // D
        for bm, bn, warps, stages in VARLEN_CONFIGS:
            fa2_fwd._choose = lambda *a, **k: (kernel, dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps,  # noqa: B023
                                                             num_stages=stages))
            fa2_fwd._plans.clear()
            row = []
            for name, impl, lens in (("dense", "flashlib_dense", equal), ("pack", "flashlib_varlen", lengths),
                                     ("equal_pack", "flashlib_varlen", equal)):
                flops = prod.packed_flops(lens, H, D, causal=True)
                try:
                    call, inputs, check = prod.varlen_setup(impl, lens, H, D, DTYPE)
                    err, fwd, _ = timed(call, inputs, check, grad=False)
                    row.append(f"{name} {'WRONG %.3g' % err if fwd is None else '%.0f' % (flops / fwd / 1e9)}")
                except Exception as e:   # a config that does not compile or fit
                    row.append(f"{name} {type(e).__name__}")
            print(f"d{D} ({bm}, {bn}, {warps}, {stages}): " + ", ".join(row), flush=True)
    fa2_fwd._choose = chosen       # the launcher's own choice again for the parts after this one
    fa2_fwd._plans.clear()


def layout_part():
    print("\n# layout: forward, forward+backward of the default configs, causal, 32k tokens; ms (TFLOP/s)")
    lengths = prod.document_lengths(prod.PACK_TOKENS, prod.PACK_DOCS)
    equal = [prod.PACK_TOKENS // prod.PACK_DOCS] * prod.PACK_DOCS
    for D in prod.PACK_DIMS:
        H, B, N = prod.WIDTH // D, len(equal), equal[0]
        for name, lens in (("dense", equal), ("dense_bshd", equal), ("pack", lengths), ("equal_pack", equal)):
            flops = prod.packed_flops(lens, H, D, causal=True)
            if name == "dense_bshd":   # (B, N, H, D) in memory, seen as (B, H, N, D): a projection's layout
                leaves = [t.detach().transpose(1, 2).contiguous().requires_grad_()
                          for t in make_inputs(B, H, H, N, N, D, DTYPE, "cuda")]
                inputs = tuple(t.transpose(1, 2) for t in leaves)
                call = lambda q, k, v: prod.flash_attention(q, k, v, causal=True)  # noqa: E731
                check = lambda out, i=inputs: prod.oracle_check(  # noqa: E731
                    [tuple(t[:1, :2] for t in (out, *i))], DTYPE, causal=True)
            else:
                call, inputs, check = prod.varlen_setup(
                    "flashlib_dense" if name == "dense" else "flashlib_varlen", lens, H, D, DTYPE)
            err, fwd, fb = timed(call, inputs, check)
            if fwd is None:
                print(f"d{D} {name:11} WRONG: error {err:.3g}")
                continue
            print(f"d{D} {name:11} fwd {fwd:.3f} ms ({flops / fwd / 1e9:.0f}), fwd+bwd {fb:.3f} ms "
                  f"({3.5 * flops / fb / 1e9:.0f})", flush=True)


@triton.jit
def tanh_softcap_approx_divide(s, q_pos, k_pos, bh, args):
    """The bfloat16 softcap before the fold: the scores divided by the cap here, a multiply each."""
    cap = tl.load(args + bh * score_mod.ARGS_PER_HEAD)
    return score_mod._softcap(s * (1.0 / cap), cap, True)


@triton.jit
def alibi_bias_float(s, q_pos, k_pos, bh, args):
    """ALiBi with the positions made float32 per row and per column (exact below 2^24, and so is
    their difference): a subtraction and a multiply-add per score, against the library's integer
    subtraction, absolute value, conversion and multiply (SASS for sm90)."""
    slope = tl.load(args + bh * score_mod.ARGS_PER_HEAD + 1)
    return tl.fma(-slope, tl.abs(q_pos.to(tl.float32) - k_pos.to(tl.float32)), s), 1.0


@triton.jit
def alibi_bias_products(s, q_pos, k_pos, bh, args):
    """ALiBi as |slope q_pos - slope k_pos|: one instruction per score fewer than the library's
    exact distance, but the products round (absolute error ~ slope x position x 2^-24)."""
    slope = tl.load(args + bh * score_mod.ARGS_PER_HEAD + 1)
    return s - tl.abs(slope * q_pos.to(tl.float32) - slope * k_pos.to(tl.float32)), 1.0


def fold_part():
    print("\n# fold: bfloat16 FA2, ms (TFLOP/s), ratio to plain, max error vs float64")
    dtype, library_dkdv = torch.bfloat16, fa2_bwd._choose_dkdv
    for D, N, causal in prod.MOD_SHAPES:
        B, H = shape_for(D, N)["B"], prod.WIDTH // D
        flops = prod.attention_flops(B, H, N, N, D, causal=causal)
        q, k, v = make_inputs(B, H, H, N, N, D, dtype, "cuda", requires_grad=True)
        cap, alibi = {"softcap": prod.SOFTCAP}, {"alibi_slopes": prod.alibi_slopes(H).cuda()}
        mod, bias = score_mod.make(q, score_mod.Modifiers(**cap)), score_mod.make(q, score_mod.Modifiers(**alibi))
        divide = score_mod.ScoreMod(tanh_softcap_approx_divide, mod.args, mod.bound, 1.0)
        variants = [("plain", score_mod.IDENTITY, None, {}), ("softcap_divide", divide, None, cap),
                    ("softcap_fold", mod, None, cap)]
        variants += [(f"softcap_fold dkdv{c}", mod, c, cap) for c in ((64, 64, 8, 3), (32, 128, 8, 3))]
        variants += [("alibi_int", bias, None, alibi), ("alibi_float", bias._replace(fn=alibi_bias_float), None, alibi),
                     ("alibi_products", bias._replace(fn=alibi_bias_products), None, alibi)]
        base = None
        for name, mod_, dkdv, options in variants:
            fa2_bwd._plans.clear()
            fa2_bwd._choose_dkdv = library_dkdv if dkdv is None else config.tuned(
                fa2_bwd._dkdv_kernel, [], lambda bm, bn: (2 * bn, 2 * bm), prefer=lambda _, c=dkdv: c)
            call = lambda q, k, v, m=mod_: FlashAttention.apply(q, k, v, causal, D ** -0.5, m)[0]  # noqa: E731
            check = lambda out, o=options: prod.oracle_check(  # noqa: E731
                [tuple(t[:1, :2] for t in (out, q, k, v))], dtype, causal=causal,
                **{n: x[:2] if n == "alibi_slopes" else x for n, x in o.items()})
            base = print_row(f"d{D} N{N} causal={causal} {name:32}", *timed(call, (q, k, v), check), base, flops)
        fa2_bwd._choose_dkdv = library_dkdv
        fa2_bwd._plans.clear()


def layout_profile_part():
    """The layout part's dense and equal-length packed calls under torch.profiler: GPU time per
    kernel (the fwd+bwd times above include the host's, and the varlen call's sync)."""
    from launch_breakdown_probe import kernel_times
    print("\n# layout_profile: GPU us per call of each kernel, causal, 32k tokens, 16 x 2048")
    equal = [prod.PACK_TOKENS // prod.PACK_DOCS] * prod.PACK_DOCS
    for D in prod.PACK_DIMS:
        H = prod.WIDTH // D
        for name in ("flashlib_dense", "flashlib_varlen"):
            call, inputs, check = prod.varlen_setup(name, equal, H, D, DTYPE)
            err, ok = check(call(*inputs).detach())
            dout = torch.randn_like(call(*inputs))
            step = lambda: torch.autograd.grad(call(*inputs), inputs, dout)  # noqa: E731
            times = kernel_times(step, calls=10, warmup=3)
            top = sorted(times.items(), key=lambda x: -x[1])[:5]
            print(f"d{D} {name:16} {'ok' if ok else 'WRONG'} " + ", ".join(f"{k[:28]} {v:.0f}" for k, v in top), flush=True)


def paged_part():
    print("\n# paged decode at short caches: eager ms, host us, graph ms; ratio to contiguous")
    for label, shape, seqlens, ragged in bench_decode.cases(quick=False):
        if ragged or max(seqlens) > 4096:
            continue
        base = None
        for page, impl in ((None, "flashlib_contiguous"), (16, "flashlib_paged16"), (256, "flashlib_paged256")):
            r = prod.paged_record(f"{label} L{max(seqlens)}", impl, shape, tuple(seqlens), page, DTYPE)[0]
            if r.get("ms") is None:
                print(f"{r['case']:10} {impl:20} {r.get('note')}")
                continue
            base = base or r
            graph, base_graph = r["ms_graph"] or float("nan"), base["ms_graph"] or float("nan")
            print(f"{r['case']:10} {impl:20} eager {r['ms'] * 1e3:6.1f} us ({base['ms'] / r['ms']:.3f}x), host "
                  f"{r['host_us']:5.1f} us, graph {graph * 1e3:6.1f} us "
                  f"({base_graph / graph:.3f}x)", flush=True)


if __name__ == "__main__":
    parts = sys.argv[1:] or ["softcap", "varlen", "layout", "softcap_fma", "softcap_bounded", "paged"]
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    for part in parts:
        globals()[f"{part}_part"]()
