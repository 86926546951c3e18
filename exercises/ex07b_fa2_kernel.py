"""Exercise 07b (lesson 07): the whole FlashAttention-2 forward kernel, in Triton.

Exercise 07 was the inner step (``tile_update``); here you write everything around it: which
query block and head a program owns, the offsets and masks, the loop over key blocks with its
pointer advances and bounds, the causal mask, the final normalisation and the stores. Dao 2023,
"FlashAttention-2", Algorithm 1 and section 3.1 (the query-block grid); flashlib's own version is
``flashlib/kernels/fa2_fwd.py`` (try first: it splits the loop in two for speed, you need not).

The grid (``attention_forward`` below launches it, you do not write it) is
``(cdiv(Nq, BLOCK_M), B * Hq)``: program (pid_m, bh) owns query rows
[pid_m * BLOCK_M, pid_m * BLOCK_M + BLOCK_M) of batch bh // Hq, query head bh % Hq. Its key/value
head is (bh % Hq) // GROUP (grouped-query attention: GROUP query heads share one K/V head).

What the kernel must get right:

- **offsets**: tensor element [b, h, n, d] of Q lies at ``Q + b * stride_qb + h * stride_qh +
  n * stride_qm + d`` (the last dim is contiguous); K, V and Out have their own strides, which
  may differ from Q's. Do the batch and head part in int64 (``off_b.to(tl.int64) * stride_qb``):
  program ids and strides are int32, and b * stride_qb passes 2**31 elements at large
  batch x heads x seqlen x headdim, where an int32 product wraps round to a wrong address.
- **masks**: Nq and Nk need not be multiples of the blocks, and the head dim D is padded to
  BLOCK_D (a power of two >= 16, e.g. 128 for D = 80): every load is masked (rows < N and
  dims < D, ``other=0.0``), every store too; nothing past the tensors is read or written.
- **the loop** over key blocks: start_n = 0, BLOCK_N, ... up to ``hi``; advance the K and V
  pointers by BLOCK_N rows each step (or recompute them from start_n). Scores s = (q @ k^T) *
  qk_scale (base 2: qk_scale = softmax scale * log2(e), done by the launcher), -inf for keys
  >= Nk, then ``acc, m_i, l_i = tile_update(acc, m_i, l_i, s, v, DOT_PRECISION)`` (exercise 07,
  imported below). State before the loop: acc 0 (BLOCK_M, BLOCK_D) float32, m_i -inf, l_i 0.
- **causal** (when CAUSAL): bottom-right aligned, as flash-attn and flashlib: query i sees key j
  iff j <= i + Nk - Nq (the last query sees every key; with Nq > Nk the first Nq - Nk queries see
  none). Scores of other keys are -inf. Key blocks above the diagonal for every row of the block
  may be skipped: end the loop at hi = min(Nk, max(0, (pid_m + 1) * BLOCK_M + Nk - Nq)).
- **finalisation**: out = acc / l_i; lse = ln(sum_j exp(scale q.k_j)) in natural log:
  (m_i + log2(l_i)) * ln(2) (m_i and l_i are in base 2). A row with no visible key (l_i = 0)
  gets out = 0 and lse = -inf, never NaN.
- **stores**: out in Out's dtype (``.to(Out.dtype.element_ty)``) at Out's strides; lse (float32)
  at ``Lse + bh * Nq + row`` (Lse is a contiguous (B, Hq, Nq) tensor).

Triton notes: ``tl.program_id(0)``, ``tl.arange(0, BLOCK)``, ``tl.cdiv``, ``tl.minimum``,
``tl.maximum``, ``tl.where``, ``tl.math.log2``, ``tl.load(ptrs, mask=..., other=0.0)``,
``tl.store(ptrs, x, mask=...)``, ``tl.dot(q, kt, input_precision=DOT_PRECISION)`` (q (BM, BD)
times kt (BD, BN)). Index a row vector as ``x[:, None]``, a column vector as ``x[None, :]``.

Check it: ``flashlib check ex07b`` (your kernel through Triton's interpreter on a CPU: small
shapes, a few seconds).
"""
import math

import flashlib  # noqa: F401  (first: on a machine without a GPU it turns Triton's interpreter on)
import torch
import triton
import triton.language as tl

from flashlib import runtime
from flashlib.kernels.tile import LOG2E, tile_update

LN2 = tl.constexpr(0.6931471805599453)  # ln(2): ln(x) = log2(x) * LN2


@triton.jit
def fa2_kernel(Q, K, V, Out, Lse,
               stride_qb, stride_qh, stride_qm,
               stride_kb, stride_kh, stride_kn,
               stride_vb, stride_vh, stride_vn,
               stride_ob, stride_oh, stride_om,
               Hq, Nq, Nk, D, qk_scale, GROUP,
               CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """FA2 forward for query block ``tl.program_id(0)`` of (batch, head) ``tl.program_id(1)``.

    Q (B, Hq, Nq, D), K and V (B, Hq // GROUP, Nk, D), Out like Q: pointers to element
    [0, 0, 0, 0]; stride_xb, stride_xh, stride_xm/xn: elements between consecutive batches,
    heads and rows of tensor x (its last dim is contiguous). Lse: contiguous (B, Hq, Nq) float32.
    qk_scale: softmax scale * log2(e). BLOCK_D: a power of two >= D. Writes Out[b, h, rows] and
    Lse[b, h, rows] for this block's rows < Nq (out 0 and lse -inf on rows with no visible key);
    reads and writes nothing else.
    """
    raise NotImplementedError('ex07b: your code goes here, then run `flashlib check ex07b`')


def attention_forward(q, k, v, *, causal=False, scale=None, block_m=64, block_n=64,
                      num_warps=4, num_stages=2, kernel=fa2_kernel):
    """Launch ``kernel`` (yours by default): returns ``(out, lse)`` like ``flashlib.flash_attention``.

    q: (B, Hq, Nq, D); k, v: (B, Hkv, Nk, D) with Hq % Hkv == 0 and D <= 256, last dim
    contiguous. out: like q; lse: (B, Hq, Nq) float32. One fixed block config (no autotuning):
    block_m x block_n, num_warps, num_stages (lesson 07 explains them).
    """
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != (B, Hkv, Nk, D) or v.shape != k.shape or Hq % Hkv != 0:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected "
                         "(B, Hq, Nq, D) and (B, Hkv, Nk, D) with Hq % Hkv == 0")
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        raise ValueError("q, k and v need a contiguous last dim (stride 1)")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)
    if B * Hq > 65535:  # CUDA caps grid axes 1 and 2 (flashlib's kernels use one flat axis)
        raise ValueError(f"batch x heads_q = {B} x {Hq} = {B * Hq} exceeds 65535, the grid's "
                         "axis-1 limit of this exercise's launcher; use fewer sequences per call")
    kernel[grid](q, k, v, out, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
                 *out.stride()[:3], Hq, Nq, Nk, D, scale * LOG2E, Hq // Hkv,
                 CAUSAL=bool(causal), BLOCK_M=block_m, BLOCK_N=block_n,
                 BLOCK_D=max(16, triton.next_power_of_2(D)),
                 DOT_PRECISION="ieee",
                 num_warps=num_warps, num_stages=1 if runtime.INTERPRET else num_stages)
    return out, lse
