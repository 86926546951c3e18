"""Score modifiers in the Hopper kernels against the portable ones, on a GPU (issues 31 and 34).

At the production suite's modifier shapes (``flashlib.bench.production.MOD_SHAPES``), for the
plain scores, the softcap and ALiBi: the forward of each kernel (``fa2_fwd.fa2_forward``,
``fa3_fwd.fa3_forward``) called directly, and ``flash_attention``'s forward+backward with the
Hopper kernels on and off (the ``fa3`` kernel option: which backward runs follows the dispatcher's choice).
Every call is first checked against the float64 oracle on a slice of its own inputs
(``production.oracle_check``); a wrong one is reported and not timed.

    FLASHLIB_AUTOTUNE=0 python benchmarks/probes/fa3_score_mod_probe.py [bfloat16] [float16]

Prints per row ms, TFLOP/s and the ratio to the same kernel's plain scores, and the Hopper
kernel's ratio to the portable one with the same modifier. ``softcap_max``: the softcap with the
softmax's running max, forward only (in bfloat16 FA2's forward drops it, ``tile.bounded_offset``;
FA3's keeps it: dropping it there gained 0-1.5%, h100/fa3_score_mod_probe_bounded.log).
A wrong result is reported on its own line.
"""
import sys

import torch
import triton

import flashlib
from flashlib import ops
from flashlib.bench import production as prod
from flashlib.bench.harness import time_ms, make_inputs, shape_for
from flashlib.kernels import fa2_fwd, fa3_fwd, score_mod


def check(out, q, k, v, causal, dtype, options):
    sliced = {n: (o[:2] if isinstance(o, torch.Tensor) else o) for n, o in options.items()}
    return prod.oracle_check([tuple(t[:1, :2] for t in (out, q, k, v))], dtype, causal=causal, **sliced)


def forward_backward(q, k, v, causal, options, dout):
    out = ops.flash_attention(q, k, v, causal=causal, **options)
    return torch.autograd.grad(out, (q, k, v), dout)


def probe(dtype):
    every_head_dim = {"fa3_fwd_mod_head_dims": (64, 128)}   # FA3's forward with a modifier wherever it runs
    print(f"\n# {dtype}: ms (TFLOP/s), ratio to the same kernel's plain scores; fa3/fa2: same modifier")
    for D, N, causal in prod.MOD_SHAPES:
        B, H = shape_for(D, N)["B"], prod.WIDTH // D
        flops = prod.attention_flops(B, H, N, N, D, causal=causal)
        q, k, v = make_inputs(B, H, H, N, N, D, dtype, "cuda", requires_grad=True)
        dout = torch.randn_like(q)
        mods = {"plain": {}, "softcap": dict(softcap=prod.SOFTCAP), "softcap_max": dict(softcap=prod.SOFTCAP),
                "alibi": dict(alibi_slopes=prod.alibi_slopes(H).to("cuda"))}
        plain = {}
        for name, options in mods.items():
            mod = score_mod.make(q, score_mod.Modifiers(**options))
            if name == "softcap_max":   # with the running max (FA2 in bfloat16 drops it otherwise)
                mod = mod._replace(bound=None)
            row = {}
            for kernel, fwd in (("fa2", fa2_fwd.fa2_forward), ("fa3", fa3_fwd.fa3_forward)):
                call = lambda fwd=fwd, mod=mod: fwd(q, k, v, causal=causal, score_mod=mod)[0]  # noqa: E731
                with torch.no_grad():
                    err, ok = check(call(), q, k, v, causal, dtype, options)
                    row[f"{kernel} fwd"] = time_ms(call) if ok else None
                kernels_on = dict(every_head_dim, fa3=kernel == "fa3")
                if name == "softcap_max":   # flash_attention takes the library's softcap: forward only
                    row[f"{kernel} fwd+bwd"], ok2, err2 = None, True, 0.0
                else:
                    with torch.no_grad():
                        with flashlib.kernel_options(**kernels_on):
                            err2, ok2 = check(ops.flash_attention(q, k, v, causal=causal, **mods[name]), q,
                                              k, v, causal, dtype, mods[name])
                    with flashlib.kernel_options(**kernels_on):
                        row[f"{kernel} fwd+bwd"] = (time_ms(lambda: forward_backward(q, k, v, causal, mods[name],
                                                                                   dout)) if ok2 else None)
                if not (ok and ok2):
                    print(f"d{D} N{N} causal={causal} {name} {kernel}: WRONG (error {max(err, err2):.3g})")
            plain = plain or row
            cells = []
            for op, mult in (("fwd", 1.0), ("fwd+bwd", 3.5)):
                for kernel in ("fa2", "fa3"):
                    ms, base = row[f"{kernel} {op}"], plain[f"{kernel} {op}"]
                    cells.append(f"{kernel} {op} " + ("-" if ms is None else
                                 f"{ms:.3f} ({mult * flops / ms / 1e9:.0f}) {base / ms:.3f}x"))
                a, b = row[f"fa2 {op}"], row[f"fa3 {op}"]
                cells.append(f"fa3/fa2 {a / b:.3f}x" if a and b else "fa3/fa2 -")
            print(f"d{D} N{N} causal={causal} {name:8} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    for dtype_name in sys.argv[1:] or ["bfloat16", "float16"]:
        probe(getattr(torch, dtype_name))
