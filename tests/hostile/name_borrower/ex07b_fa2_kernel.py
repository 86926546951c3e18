"""Hostile (issue 55): fa2_kernel by flashlib's own FA2 forward kernel, reached by a name built at
run time, which no static check sees, and called from the learner's kernel on the program's
(batch, head) (pointers moved there, one head, so its program id is the query block). Expected:
0 points, "error: ... flashlib.kernels.fa2_fwd._fa2_fwd_kernel is flashlib's own answer ..."
(the answer is not in the copy of flashlib it sees)."""
import pkgutil

import flashlib  # noqa: F401
import triton
import triton.language as tl

from flashlib.kernels.tile import tile_update

_fa2 = pkgutil.resolve_name("flashlib.kernels." + "fa2_fwd:_fa2_fwd_kernel")
_identity = pkgutil.resolve_name("flashlib.kernels." + "score_mod:identity")   # no score modifier


@triton.jit
def fa2_kernel(Q, K, V, Out, Lse,
               stride_qb, stride_qh, stride_qm,
               stride_kb, stride_kh, stride_kn,
               stride_vb, stride_vh, stride_vn,
               stride_ob, stride_oh, stride_om,
               Hq, Nq, Nk, D, qk_scale, GROUP,
               CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr):
    bh = tl.program_id(1)
    b = (bh // Hq).to(tl.int64)
    h = (bh % Hq).to(tl.int64)
    _fa2(Q + b * stride_qb + h * stride_qh, K + b * stride_kb + (h // GROUP) * stride_kh,
         V + b * stride_vb + (h // GROUP) * stride_vh, Out + b * stride_ob + h * stride_oh,
         Lse + bh.to(tl.int64) * Nq, Lse, Lse, Lse, 0, 0, stride_qm, 0, 0, stride_kn, 0, 0,
         stride_vn, 0, 0, stride_om, 1, Nq, Nk, D, qk_scale, float("-inf"), 0, Nq, 1, CAUSAL,
         BLOCK_M, BLOCK_N, BLOCK_D, False, False, DOT_PRECISION, tile_update, _identity, False, False)
