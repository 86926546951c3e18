"""Where the packed (varlen) Hopper forward loses to the dense one: the pack, the layout, or the empty programs.

The production suite's varlen part (``flashlib.bench.production``: 16 log-normal documents, 32k
tokens, H x D = 2048, causal) against the same tokens as 16 equal documents, both through
``fa3_fwd.fa3_forward`` with ``cu_seqlens`` and dense (also in the packed tensors' memory layout,
(B, N, H, D), whose rows of one head lie H x D apart). The grid covered ``max_seqlen`` query
blocks per (sequence, head) and the programs past a sequence's end returned at once: a larger
``max_seqlen`` (x2, x4) added only such programs, so its time was their cost
(``h100/varlen_grid_probe.log``). Since the programs are numbered over the pack's blocks
(``fa3_fwd._packed_block``), ``max_seqlen`` no longer changes the grid. Every call's output is
first compared with the float64 oracle on two documents (``production.oracle_check``).

    PYTHONPATH=$PWD python benchmarks/probes/varlen_grid_probe.py     (on an sm90 GPU)
"""
import torch

from flashlib import runtime
from flashlib.bench import production as prod
from flashlib.bench.harness import time_ms, make_inputs
from flashlib.kernels import fa3_fwd

D, DTYPE, TOKENS, DOCS = 128, torch.float16, 32768, 16


def packed_call(lengths, H, max_scale=1):
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in make_inputs(1, H, H, TOKENS, TOKENS, D, DTYPE,
                                                                        runtime.DEVICE))
    cu, longest = prod.cu_seqlens(lengths, runtime.DEVICE), max(lengths) * max_scale
    call = lambda: fa3_fwd.fa3_forward(q, k, v, causal=True, cu_seqlens=(cu, cu),  # noqa: E731
                                       max_seqlen=(longest, longest))
    out, _ = call()
    docs = prod.checked_documents(lengths)[:2]
    rows = lambda t, s, e: t[s:e, :2].transpose(0, 1).unsqueeze(0)                # noqa: E731
    err, ok = prod.oracle_check([tuple(rows(t, s, e) for t in (out, q, k, v)) for s, e in docs], DTYPE,
                                causal=True)
    assert ok, f"packed forward (max_seqlen x{max_scale}) off the oracle by {err:.3g}"
    return call


def main():
    H = prod.WIDTH // D
    pack = prod.document_lengths(TOKENS, DOCS)
    equal = [TOKENS // DOCS] * DOCS
    q, k, v = make_inputs(DOCS, H, H, TOKENS // DOCS, TOKENS // DOCS, D, DTYPE, runtime.DEVICE)
    dense = lambda: fa3_fwd.fa3_forward(q, k, v, causal=True)                      # noqa: E731
    err, ok = prod.oracle_check([tuple(t[:1, :2] for t in (dense()[0], q, k, v))], DTYPE, causal=True)
    assert ok, f"dense forward off the oracle by {err:.3g}"
    print(f"{runtime.gpu_name()}, d{D} H{H} causal fp16, pack {sorted(pack)}")
    # the same dense problem in the packed tensors' memory layout: rows of a head H x D apart
    qt, kt, vt = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))   # (B, N, H, D)
    dense_rows = lambda: fa3_fwd.fa3_forward(qt, kt, vt, causal=True)              # noqa: E731
    assert torch.equal(dense_rows()[0], dense()[0])
    cases = [("dense, equal docs", dense, prod.packed_flops(equal, H, D, causal=True)),
             ("dense, equal docs, (B, N, H, D) layout", dense_rows, prod.packed_flops(equal, H, D, causal=True))]
    for name, lengths in (("packed, equal docs", equal), ("packed, log-normal docs", pack)):
        for scale in (1, 2, 4):
            cases.append((f"{name}, max_seqlen x{scale}", packed_call(lengths, H, scale),
                          prod.packed_flops(lengths, H, D, causal=True)))
    for _ in range(2):   # two rounds: the spread between them is the run's noise
        for name, call, flops in cases:
            ms = time_ms(call)
            print(f"{name:40} {ms:8.3f} ms {flops / ms * 1e-9:8.1f} TFLOP/s")


if __name__ == "__main__":
    main()
