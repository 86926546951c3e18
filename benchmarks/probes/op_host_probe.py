"""Probe: host time of flashlib's custom ops, what a ``torch.compile``d model calls (issue 54).

The model suite's compiled GPT-2 step at B32 T256 keeps the GPU as busy as SDPA's (16.5 ms of
kernels a step) but takes 2.6 ms longer (``model_step_profile.py``): the step is host-bound and
flashlib's 24 calls a step cost more host time than SDPA's. This times, at that shape (B32 H12
T256 d64, bfloat16, causal) and at a tiny one, host microseconds per call (1000 calls without a
sync, best of 7, autograd off as in compiled code) of each layer of the compiled path: the
custom op through the dispatcher, the launchers behind it (``dispatch.forward``/``backward``),
and SDPA's aten ops that inductor calls, then a cProfile of the ops' calls.

    PYTHONPATH=$PWD python benchmarks/probes/op_host_probe.py
"""
import cProfile
import pstats

import torch
import torch.nn.functional as F

import flashlib
from flashlib import runtime
from flashlib.bench.decode import host_time
from flashlib.kernels import dispatch, score_mod
from flashlib.kernels.score_mod import NO_MODIFIERS


def host_us(fn):
    return host_time(fn, calls=1000, repeats=7)


def main():
    opts = runtime.OPTIONS
    op_opts = opts.op_args()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, flashlib {flashlib.__file__}")
    for B, H, N, D in ((32, 12, 256, 64), (1, 2, 64, 64)):
        q, k, v, dout = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        scale = D ** -0.5
        out, lse = dispatch.forward(q, k, v, True, scale, score_mod.IDENTITY, opts)
        fwd_op = torch.ops.flashlib.fa2_forward.default
        bwd_op = torch.ops.flashlib.fa2_backward.default
        cudnn_fwd = torch.ops.aten._scaled_dot_product_cudnn_attention.default
        rows = [
            ("op fa2_forward (dispatcher)", lambda: fwd_op(q, k, v, True, scale, [], [], op_opts)),
            ("dispatch.forward (launcher)", lambda: dispatch.forward(q, k, v, True, scale, score_mod.IDENTITY, opts)),
            ("score_mod.make + from_op_args", lambda: (score_mod.make(q, NO_MODIFIERS), runtime.from_op_args(op_opts))),
            ("op fa2_backward (dispatcher)", lambda: bwd_op(q, k, v, out, lse, dout, True, scale, [], [], op_opts)),
            ("dispatch.backward (launcher)", lambda: dispatch.backward(q, k, v, out, lse, dout, True, scale,
                                                                        score_mod.IDENTITY, opts)),
            ("SDPA default forward", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
            ("aten cudnn forward (lse)", lambda: cudnn_fwd(q, k, v, None, True, 0.0, True, False, scale=scale)),
            ("torch.empty_like x3 (for scale)", lambda: (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))),
        ]
        try:
            o, l, *rest = cudnn_fwd(q, k, v, None, True, 0.0, True, False, scale=scale)
            cudnn_bwd = torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default
            rows.append(("aten cudnn backward", lambda: cudnn_bwd(dout, q, k, v, o, l, rest[4], rest[5], None,
                                                                  rest[0], rest[1], rest[2], rest[3], 0.0, True,
                                                                  scale=scale)))
        except Exception as e:   # the aten signature moves between releases: say so, go on
            print(f"  (no aten cudnn backward row: {type(e).__name__}: {str(e)[:120]})")
        print(f"\n## B{B} H{H} N{N} d{D} bfloat16 causal: host us per call")
        for name, fn in rows:
            try:
                print(f"  {name:34s} {host_us(fn):7.1f}")
            except Exception as e:
                print(f"  {name:34s} failed: {type(e).__name__}: {str(e)[:160]}")
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    with torch.no_grad():
        prof.enable()
        for _ in range(500):
            fwd_op(q, k, v, True, scale, [], [], op_opts)
            bwd_op(q, k, v, out, lse, dout, True, scale, [], [], op_opts)
        prof.disable()
    torch.cuda.synchronize()
    print("\n## cProfile of 500 forward + 500 backward op calls (B1 H2 N64), by own time")
    pstats.Stats(prof).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
