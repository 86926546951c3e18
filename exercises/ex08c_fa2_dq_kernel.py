"""Exercise 08c (lesson 08): the FlashAttention-2 backward's dQ kernel, and the autograd.Function.

Exercise 08b wrote the dK/dV kernel (key blocks outer). The backward's other kernel walks the
tiles the other way: one program owns one query block of one (batch, query head), its Q and dO
rows stay resident, dQ accumulates on chip in float32, and the key blocks stream past (FA2,
Dao 2023, section 3.1: the dQ pass that avoids atomic adds). flashlib's own version is
``_dq_kernel`` / ``dq_tile`` in ``flashlib/kernels/fa2_bwd.py`` (write yours before reading it).
Then you tie the backward together: ``FlashAttentionFn``, a ``torch.autograd.Function`` whose
forward runs a given forward kernel and whose backward launches the dK/dV kernel and yours.

**Part 1, ``dq_kernel``.** The grid (``attention_backward_dq`` below launches it, you do not
write it) is ``(cdiv(Nq, BLOCK_M), B * Hq)``: program (pid_m, bh) owns query rows
[pid_m * BLOCK_M, pid_m * BLOCK_M + BLOCK_M) of batch bh // Hq, query head bh % Hq.
Grouped-query attention: query head h reads K/V head h // GROUP (GROUP = Hq // Hkv
consecutive query heads share one K/V head).

The maths, for one (query block i, key block j) tile, S = scale * Q K^T (FA2 Algorithm 2):

    P_ij  = exp(S_ij - lse_i)              # (BM, BN) recomputed, exactly softmax's P
    dP_ij = dO_i V_j^T                     # (BM, BN)
    dS_ij = P_ij * (dP_ij - delta_i)       # (BM, BN), delta_i = rowsum(dO_i * O_i), given
    dQ_i += scale * dS_ij K_j              # (BM, D)

lse (natural log) and delta come from the forward and the launcher: contiguous (B, Hq, Nq)
float32, row r of query head h of batch b at ``Lse + (b * Hq + h) * Nq + r``.
Use exp2 (the GPU's fast exponential): exp(x) = exp2(x * LOG2E), for S and lse alike.

What the kernel must get right:

- **offsets**: element [b, h, n, d] of Q lies at ``Q + b * stride_qb + h * stride_qh +
  n * stride_qm + d`` (the last dim is contiguous); K, V, dO, dQ have their own strides. Do the
  batch and head part in int64 (``off_b.to(tl.int64) * stride_qb``), as in exercise 07b.
- **masks**: Nq and Nk need not be multiples of the blocks, and D is padded to BLOCK_D (a power
  of two >= 16): every load is masked (rows < N, dims < D, ``other=0.0``), every store too.
  BLOCK_M and BLOCK_N need not be equal: the key loop steps by BLOCK_N.
- **causal** (when CAUSAL): bottom-right aligned, as in the forward: query i sees key j iff
  j <= i + Nk - Nq; P is 0 for every other pair. Key blocks that no row of this block sees
  should be skipped (end the loop after the last key the block's last row sees); the blocks that
  straddle the diagonal need the mask. A query row that sees no key at all (Nq > Nk) has
  lse = -inf: its dQ row is exactly 0, no NaN.
- **stores**: dQ (BM, BD) in dQ's dtype (``.to(dQ.dtype.element_ty)``) at its own strides, rows
  < Nq and dims < D only. Accumulate in float32; cast a tile to the inputs' dtype before
  ``tl.dot`` if you like (``ds.to(k.dtype)``), as flashlib does.

**Part 2, ``FlashAttentionFn``.** ``FlashAttentionFn.apply(q, k, v, causal, scale, forward,
backward_dkdv)`` returns attention's output and makes ``.backward()`` run your kernel:

- ``forward(q, k, v, *, causal, scale) -> (out, lse)``: the forward to run (flashlib's
  ``fa2_forward``, or exercise 07b's ``attention_forward``); out like q, lse (B, Hq, Nq) float32;
- ``backward_dkdv(q, k, v, out, dout, lse, *, causal, scale) -> (dk, dv)``: the dK/dV launcher
  (exercise 08b's ``attention_backward_dkdv``, or one around flashlib's backward);
- q (B, Hq, Nq, D), k and v (B, Hkv, Nk, D) may be any views (transposed, sliced); the launchers
  need a contiguous last dim. ``scale`` None means 1/sqrt(D), for every launch.

The forward saves what the backward needs, q, k, v, out and lse (``ctx.save_for_backward``),
never P and never a second run of the forward. The backward receives dout = dL/dout with
whatever strides autograd gives it (``out.sum()`` sends an expanded tensor, every stride 0);
it computes delta = rowsum(dout * out) in float32, launches ``attention_backward_dq`` and
``backward_dkdv``, and returns one gradient per input of forward: dq, dk, dv (shaped and typed
like q, k, v) and None for the four others. An input that does not require grad may get None.

Triton notes: ``tl.dot(a, b, input_precision=DOT_PRECISION)`` multiplies a (M, K) by b (K, N)
(add a third argument ``acc`` to accumulate into it); ``tl.trans(x)`` transposes a 2-D tile.
``tl.math.exp2``, ``tl.where``, ``tl.maximum``, ``tl.minimum``, ``tl.cdiv``; ``for start_n in
range(lo, hi, BLOCK_N):`` is a loop the kernel runs. Index a row vector as ``x[:, None]``, a
column vector as ``x[None, :]``.

Check it: ``flashlib check ex08c`` (your kernel through Triton's interpreter on a CPU: small
shapes, a few seconds; on a GPU also compiled at a real size).
"""
import math

import flashlib  # noqa: F401  (first: on a machine without a GPU it turns Triton's interpreter on)
import torch
import triton
import triton.language as tl

from flashlib import runtime

LOG2E = tl.constexpr(1.4426950408889634)  # log2(e): exp(x) = exp2(x * LOG2E)


@triton.jit
def dq_kernel(Q, K, V, dO, Lse, Delta, dQ,
              stride_qb, stride_qh, stride_qm,
              stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn,
              stride_dob, stride_doh, stride_dom,
              stride_dqb, stride_dqh, stride_dqm,
              Hq, Nq, Nk, D, scale, GROUP,
              CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """dQ of query block ``tl.program_id(0)`` of (batch, query head) ``tl.program_id(1)``.

    Q, dO, dQ (B, Hq, Nq, D); K, V (B, Hq // GROUP, Nk, D): pointers to element [0, 0, 0, 0];
    stride_xb, stride_xh, stride_xm/xn: elements between consecutive batches, heads and rows of
    tensor x (its last dim is contiguous). Lse (natural log; -inf on a row that sees no key) and
    Delta (rowsum(dO * O)): contiguous (B, Hq, Nq) float32. scale: the softmax scale.
    BLOCK_D: a power of two >= D. Writes dQ[b, h, rows] for this block's rows < Nq; reads and
    writes nothing else.
    """
    raise NotImplementedError('ex08c: your code goes here, then run `flashlib check ex08c`')


def attention_backward_dq(q, k, v, dout, lse, delta, *, causal=False, scale=None, block_m=64,
                          block_n=64, num_warps=4, num_stages=2, kernel=dq_kernel):
    """Launch ``kernel`` (yours by default): returns dq, attention's gradient for q (like q).

    q, dout: (B, Hq, Nq, D) of one dtype; k, v: (B, Hkv, Nk, D) with Hq % Hkv == 0 and D <= 256,
    last dims contiguous; lse: (B, Hq, Nq) from the forward (natural log); delta: (B, Hq, Nq),
    rowsum(dout * out) in float32. scale None means 1/sqrt(D).
    """
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != (B, Hkv, Nk, D) or v.shape != k.shape or Hq % Hkv != 0:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected "
                         "(B, Hq, Nq, D) and (B, Hkv, Nk, D) with Hq % Hkv == 0")
    if dout.shape != q.shape or dout.dtype != q.dtype:
        raise ValueError(f"dout {tuple(dout.shape)} {dout.dtype}: expected q's shape and dtype "
                         f"{tuple(q.shape)} {q.dtype}")
    for name, t in (("lse", lse), ("delta", delta)):
        if t.shape != (B, Hq, Nq):
            raise ValueError(f"{name} has shape {tuple(t.shape)}: expected (B, Hq, Nq) = {(B, Hq, Nq)}")
    for name, t in (("q", q), ("k", k), ("v", v), ("dout", dout)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} needs a contiguous last dim (stride 1), got strides "
                             f"{tuple(t.stride())}: pass {name}.contiguous()")
    if B * Hq > 65535:  # CUDA caps grid axes 1 and 2
        raise ValueError(f"batch x heads_q = {B * Hq} exceeds 65535, the grid's axis-1 limit")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    lse, delta = lse.float().contiguous(), delta.float().contiguous()
    dq = torch.empty_like(q)
    kernel[(triton.cdiv(Nq, block_m), B * Hq)](
        q, k, v, dout, lse, delta, dq, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
        *dout.stride()[:3], *dq.stride()[:3], Hq, Nq, Nk, D, scale, Hq // Hkv,
        CAUSAL=bool(causal), BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=max(16, triton.next_power_of_2(D)), DOT_PRECISION="ieee",
        num_warps=num_warps, num_stages=1 if runtime.INTERPRET else num_stages)
    return dq


class FlashAttentionFn(torch.autograd.Function):
    """Attention whose backward is FlashAttention-2's: saves q, k, v, out, lse; recomputes P."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, forward, backward_dkdv):
        """Run ``forward`` on q, k, v (made last-dim contiguous), save what the backward needs
        and return out."""
        raise NotImplementedError('ex08c: your code goes here, then run `flashlib check ex08c`')

    @staticmethod
    def backward(ctx, dout):
        """dout (like out) -> (dq, dk, dv, None, None, None, None)."""
        raise NotImplementedError('ex08c: your code goes here, then run `flashlib check ex08c`')


def attention(q, k, v, *, causal=False, scale=None, forward, backward_dkdv):
    """``FlashAttentionFn.apply`` with keywords: attention's output, differentiable."""
    return FlashAttentionFn.apply(q, k, v, causal, scale, forward, backward_dkdv)
