"""Exercise 08b (lesson 08): the FlashAttention-2 backward's dK/dV kernel, in Triton.

Exercise 08 was one tile of the backward, in NumPy. Here you write the whole GPU kernel that
walks the tiles: FlashAttention-2's Algorithm 2 (Dao 2023), key/value blocks outer. One program
owns one key block of one (batch, K/V head): its K and V rows stay resident, dK and dV
accumulate on chip in float32, and the query blocks stream past. flashlib's own version is
``_dkdv_kernel`` in ``flashlib/kernels/fa2_bwd.py`` (write yours before reading it: it splits the loop in three runs
for speed, you need not).

The grid (``attention_backward_dkdv`` below launches it, you do not write it) is
``(cdiv(Nk, BLOCK_N), B * Hkv)``: program (pid_n, bkv) owns key rows
[pid_n * BLOCK_N, pid_n * BLOCK_N + BLOCK_N) of batch bkv // Hkv, K/V head bkv % Hkv.
Grouped-query attention: the GROUP query heads hkv * GROUP, ..., hkv * GROUP + GROUP - 1 share
this K/V head, so its dK and dV are sums over all of them (the kernel loops over them too: no
atomics, one program writes each dK/dV row).

The maths, for one (key block j, query block i) tile, S = scale * Q K^T (FA2 Algorithm 2):

    P_ij  = exp(S_ij - lse_i)              # (BM, BN) recomputed, exactly softmax's P
    dV_j += P_ij^T dO_i                    # (BN, D)
    dP_ij = dO_i V_j^T                     # (BM, BN)
    dS_ij = P_ij * (dP_ij - delta_i)       # (BM, BN), delta_i = rowsum(dO_i * O_i), given
    dK_j += scale * dS_ij^T Q_i            # (BN, D)

lse (natural log) and delta come from the forward and the launcher: contiguous (B, Hq, Nq)
float32, row r of query head h of batch b at ``Lse + (b * Hq + h) * Nq + r`` (Hq = Hkv * GROUP).
Use exp2 (the GPU's fast exponential): exp(x) = exp2(x * LOG2E), for S and lse alike.

What the kernel must get right:

- **offsets**: element [b, h, n, d] of Q lies at ``Q + b * stride_qb + h * stride_qh +
  n * stride_qm + d`` (the last dim is contiguous); K, V, dO, dK, dV have their own strides. Do
  the batch and head part in int64 (``off_b.to(tl.int64) * stride_qb``), as in exercise 07b.
- **masks**: Nq and Nk need not be multiples of the blocks, and D is padded to BLOCK_D (a power
  of two >= 16): every load is masked (rows < N, dims < D, ``other=0.0``), every store too.
  A query row past Nq must add nothing to dK and dV (what do its P and dS come to?).
- **causal** (when CAUSAL): bottom-right aligned, as in the forward: query i sees key j iff
  j <= i + Nk - Nq; P is 0 for every other pair. Query blocks whose every row sees none of this
  program's keys should be skipped (start the loop at the first query block that can see a key
  of this block); the blocks that straddle the diagonal need the mask. A query row that sees no
  key at all (Nq > Nk) has lse = -inf: it must add exactly nothing, and no NaN.
- **the loops**: for each query head of the group, for each query block: load Q, dO, lse and
  delta of its rows, recompute P, accumulate dV and dK. Accumulate in float32
  (``tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)``); cast a tile to the inputs' dtype before
  ``tl.dot`` if you like (``p.to(q.dtype)``), as flashlib does.
- **stores**: dK and dV (BN, BD) in dK's dtype (``.to(dK.dtype.element_ty)``) at their own
  strides, rows < Nk and dims < D only.

Triton notes: ``tl.dot(a, b, input_precision=DOT_PRECISION)`` multiplies a (M, K) by b (K, N)
(add a third argument ``acc`` to accumulate into it); ``tl.trans(x)`` transposes a 2-D tile; a
tile can also be loaded transposed by swapping the roles of its row and column offsets in the
pointers. ``tl.math.exp2``, ``tl.where``, ``tl.sum(x, axis)``, ``tl.maximum``, ``tl.minimum``,
``tl.cdiv``; ``for g in range(GROUP):`` is a loop the kernel runs. Index a row vector as
``x[:, None]``, a column vector as ``x[None, :]``.

Check it: ``flashlib check ex08b`` (your kernel through Triton's interpreter on a CPU: small
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
def dkdv_kernel(Q, K, V, dO, Lse, Delta, dK, dV,
                stride_qb, stride_qh, stride_qm,
                stride_kb, stride_kh, stride_kn,
                stride_vb, stride_vh, stride_vn,
                stride_dob, stride_doh, stride_dom,
                stride_dkb, stride_dkh, stride_dkn,
                stride_dvb, stride_dvh, stride_dvn,
                Hkv, Nq, Nk, D, scale, GROUP,
                CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """dK and dV of key block ``tl.program_id(0)`` of (batch, K/V head) ``tl.program_id(1)``.

    Q, dO (B, Hkv * GROUP, Nq, D); K, V, dK, dV (B, Hkv, Nk, D): pointers to element [0, 0, 0, 0];
    stride_xb, stride_xh, stride_xm/xn: elements between consecutive batches, heads and rows of
    tensor x (its last dim is contiguous). Lse (natural log; -inf on a row that sees no key) and
    Delta (rowsum(dO * O)): contiguous (B, Hkv * GROUP, Nq) float32. scale: the softmax scale.
    BLOCK_D: a power of two >= D. Writes dK[b, hkv, rows] and dV[b, hkv, rows] for this block's
    rows < Nk (summed over the GROUP query heads of K/V head hkv); reads and writes nothing else.
    """
    raise NotImplementedError('ex08b: your code goes here, then run `flashlib check ex08b`')


def attention_backward_dkdv(q, k, v, out, dout, lse, *, causal=False, scale=None, block_m=64,
                            block_n=64, num_warps=4, num_stages=2, kernel=dkdv_kernel):
    """Launch ``kernel`` (yours by default): returns ``(dk, dv)``, attention's gradients.

    q, out, dout: (B, Hq, Nq, D); k, v: (B, Hkv, Nk, D) with Hq % Hkv == 0 and D <= 256, last dim
    contiguous; lse: (B, Hq, Nq) from the forward (natural log, e.g. ``flashlib.flash_attention(
    ..., return_lse=True)`` or exercise 07b's ``attention_forward``). delta = rowsum(dout * out)
    is computed here, in float32. dk, dv: like k, v.
    """
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != (B, Hkv, Nk, D) or v.shape != k.shape or Hq % Hkv != 0:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected "
                         "(B, Hq, Nq, D) and (B, Hkv, Nk, D) with Hq % Hkv == 0")
    if any(t.stride(-1) != 1 for t in (q, k, v, dout)):
        raise ValueError("q, k, v and dout need a contiguous last dim (stride 1)")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    lse = lse.float().contiguous()
    delta = (dout.float() * out.float()).sum(-1).contiguous()                  # (B, Hq, Nq)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    if B * Hkv > 65535:  # CUDA caps grid axes 1 and 2
        raise ValueError(f"batch x heads_kv = {B * Hkv} exceeds 65535, the grid's axis-1 limit")
    kernel[(triton.cdiv(Nk, block_n), B * Hkv)](
        q, k, v, dout, lse, delta, dk, dv, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
        *dout.stride()[:3], *dk.stride()[:3], *dv.stride()[:3], Hkv, Nq, Nk, D, scale, Hq // Hkv,
        CAUSAL=bool(causal), BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=max(16, triton.next_power_of_2(D)), DOT_PRECISION="ieee",
        num_warps=num_warps, num_stages=1 if runtime.INTERPRET else num_stages)
    return dk, dv
