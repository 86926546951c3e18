"""Exercise 09b (lesson 09): the block-sparse FlashAttention forward kernel, in Triton.

Exercise 09 built the tables; exercise 07b was the dense FA2 forward kernel. Here the two meet:
write the forward kernel that walks a mask's visit lists, Dao et al. 2022, section 3.3
(block-sparse FlashAttention) with FlashAttention-2's query-block grid. Each program computes
exact attention under the mask for its query block, loading only the key blocks its list names.
flashlib's own version is ``_bs_fwd_kernel`` in ``flashlib/kernels/block_sparse.py`` (write yours
before reading it: for speed it walks the full and the partial blocks in two loops and computes a
band mask's partial tiles instead of reading their bitmaps; you need neither).

The grid (``block_sparse_forward`` below launches it, you do not write it) is
``(cdiv(Nq, BLOCK), B * Hq)``: program (pid_m, bh) owns query rows
[pid_m * BLOCK, pid_m * BLOCK + BLOCK) of batch bh // Hq, query head bh % Hq, whose K/V head is
(bh % Hq) // GROUP (grouped-query attention). BLOCK is the mask's block size: a query block of
the mask is one program's tile, a key block one step of its loop.

The mask, as ``flashlib.masks.BlockMask`` stores it (lesson 09, section 2), one row of the tables
per (batch, query head, query block): with nQ = cdiv(Nq, BLOCK) and nK = cdiv(Nk, BLOCK) =
``n_kblocks``, program (pid_m, bh) reads row r = bh * nQ + pid_m of

    KvCount  (B, Hq, nQ) int32       how many key blocks to visit (0: nothing to attend to)
    KvFull   (B, Hq, nQ) int32       how many of them are full; they come first in the list
    KvIndex  (B, Hq, nQ, nK) int32   the list: entry t of row r at KvIndex + r * nK + t, the
                                     key block to visit (keys [index * BLOCK, index * BLOCK +
                                     BLOCK)); full blocks first, then partial ones. Entries
                                     t >= KvCount[r] are not to be visited.
    KvBitmap (B, Hq, nQ, nK) int32   for a partial entry t: which tile of Bitmaps holds its
                                     element mask (-1 for full entries: they have none)
    Bitmaps  (n, BLOCK, BLOCK) uint8 element masks: Bitmaps[m, a, c] != 0 iff query row
                                     pid_m * BLOCK + a may attend key index * BLOCK + c

all contiguous (the launcher expands a mask that broadcasts over batch and heads). A **full**
block is attended whole, with no element mask: every pair in it is allowed, and it lies wholly
inside [0, Nk). A **partial** block needs its bitmap: scores of pairs whose bit is 0 are -inf
before the softmax (the bitmap is 0 for keys past Nk; a partial block may run past Nk).

What the kernel must get right:

- **offsets**, as in exercise 07b: element [b, h, n, d] of Q lies at ``Q + b * stride_qb +
  h * stride_qh + n * stride_qm + d``; K, V and Out have their own strides. Batch and head
  offsets in int64 (``off_b.to(tl.int64) * stride_qb``).
- **masks**: Nq and Nk need not be multiples of BLOCK, and D is padded to BLOCK_D (a power of
  two >= 16): every load is masked (rows < N, dims < D, ``other=0.0``), every store too.
- **the walk**: for each listed key block, load its K and V rows (the block index comes from the
  list: an indirect load), scores s = (q @ k^T) * qk_scale (base 2: qk_scale = softmax scale *
  log2(e), done by the launcher), the bitmap's mask if the block is partial, then the online
  softmax with ``exp2``: running max m, sum l and unnormalised acc (float32), rescaled by
  exp2(m_old - m_new) when the max grows. A row may have seen no key yet (its scores all -inf):
  its max is still -inf, and exp2(-inf - (-inf)) is NaN, so guard it.
- **finalisation**: out = acc / l; lse = ln(sum_j exp(scale q.k_j)) in natural log (m and l are
  in base 2). A row with no visible key (an empty list, or a row that every bitmap masks) gets
  out = 0 and lse = -inf, never NaN.
- **stores**: out in Out's dtype (``.to(Out.dtype.element_ty)``) at Out's strides, lse (float32)
  at ``Lse + bh * Nq + row`` (Lse is a contiguous (B, Hq, Nq) tensor), rows < Nq only.

Triton notes: ``tl.load(ptr)`` of one address gives a scalar (a table entry), usable in
arithmetic, in ``range(0, n)`` and in ``if``; ``for t in range(a, b):`` with runtime bounds is a
loop the kernel runs. ``tl.dot(a, b, input_precision=DOT_PRECISION)`` (a (M, K) by b (K, N); a third
argument accumulates into it), ``tl.trans``, ``tl.math.exp2``, ``tl.math.log2``, ``tl.where``,
``tl.max``/``tl.sum(x, axis)``, ``tl.maximum``, ``tl.cdiv``. Cast p to V's dtype before the dot
(``p.to(v.dtype)``), as flashlib does. Index a row vector as ``x[:, None]``, a column vector as
``x[None, :]``. Apply a partial block's bitmap with ``tl.where`` on the scores rather than by
assigning a mask variable inside a runtime ``if`` (``if t >= n_full: allowed = ...``): Triton for
older GPUs (sm75, Colab's T4) has failed to compile a boolean tensor reassigned inside such a
branch, which the interpreter accepts.

Check it: ``flashlib check ex09b`` (your kernel through Triton's interpreter on a CPU: small
shapes, a few seconds; on a GPU also compiled at a real size).
"""
import math

import flashlib  # noqa: F401  (first: on a machine without a GPU it turns Triton's interpreter on)
import torch
import triton
import triton.language as tl

from flashlib import runtime

LOG2E = tl.constexpr(1.4426950408889634)  # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = tl.constexpr(0.6931471805599453)    # ln(2): ln(x) = log2(x) * LN2


@triton.jit
def block_sparse_kernel(Q, K, V, Out, Lse, KvCount, KvFull, KvIndex, KvBitmap, Bitmaps,
                        stride_qb, stride_qh, stride_qm,
                        stride_kb, stride_kh, stride_kn,
                        stride_vb, stride_vh, stride_vn,
                        stride_ob, stride_oh, stride_om,
                        Hq, Nq, Nk, D, n_kblocks, qk_scale, GROUP,
                        BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Block-sparse forward for query block ``tl.program_id(0)`` of (batch, head) ``tl.program_id(1)``.

    Q (B, Hq, Nq, D), K and V (B, Hq // GROUP, Nk, D), Out like Q: pointers to element
    [0, 0, 0, 0]; stride_xb, stride_xh, stride_xm/xn: elements between consecutive batches,
    heads and rows of tensor x (its last dim is contiguous). Lse: contiguous (B, Hq, Nq) float32.
    KvCount, KvFull, KvIndex, KvBitmap, Bitmaps: the mask's tables (module docstring);
    n_kblocks = cdiv(Nk, BLOCK). qk_scale: softmax scale * log2(e). BLOCK: the mask's block size
    (a power of two >= 16); BLOCK_D: a power of two >= D. Writes Out[b, h, rows] and
    Lse[b, h, rows] for this block's rows < Nq (out 0 and lse -inf on rows with no visible key);
    reads only the key blocks of its list, and writes nothing else.
    """
    # BEGIN SOLUTION
    pid_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = off_bh // Hq
    off_h = off_bh % Hq
    off_hkv = off_h // GROUP                                   # grouped-query: GROUP heads share K/V
    offs_m = pid_m * BLOCK + tl.arange(0, BLOCK)               # (BM,) this block's query rows
    offs_r = tl.arange(0, BLOCK)                               # (BN,) positions inside a block
    offs_d = tl.arange(0, BLOCK_D)                             # (BD,)
    d_ok = offs_d < D
    q = tl.load(Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
                + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=(offs_m[:, None] < Nq) & d_ok[None, :], other=0.0)          # (BM, BD)
    k_base = K + off_b.to(tl.int64) * stride_kb + off_hkv.to(tl.int64) * stride_kh
    v_base = V + off_b.to(tl.int64) * stride_vb + off_hkv.to(tl.int64) * stride_vh

    row = off_bh.to(tl.int64) * tl.cdiv(Nq, BLOCK) + pid_m    # this program's row of the tables
    n_full = tl.load(KvFull + row)
    n_all = tl.load(KvCount + row)
    acc = tl.zeros([BLOCK, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK], dtype=tl.float32)
    for t in range(0, n_all):                                  # full blocks first, then partial
        cols = tl.load(KvIndex + row * n_kblocks + t) * BLOCK + offs_r          # (BN,) keys
        kv_ok = (cols[:, None] < Nk) & d_ok[None, :]           # a partial block may pass Nk
        k = tl.load(k_base + cols[:, None] * stride_kn + offs_d[None, :], mask=kv_ok, other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :], mask=kv_ok, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale   # (BM, BN) base 2
        if t >= n_full:                                        # partial: its bitmap masks it
            tile = tl.load(KvBitmap + row * n_kblocks + t).to(tl.int64)
            bits = tl.load(Bitmaps + tile * (BLOCK * BLOCK) + offs_r[:, None] * BLOCK
                           + offs_r[None, :])                  # (BM, BN) uint8
            s = tl.where(bits != 0, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))                  # (BM,)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet: no NaN
        alpha = tl.math.exp2(m_i - m_safe)                     # (BM,) rescale of the old state
        p = tl.math.exp2(s - m_safe[:, None])                  # (BM, BN)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new

    empty = l_i == 0.0                                         # no visible key: out 0, lse -inf
    out = acc / tl.where(empty, 1.0, l_i)[:, None]                              # (BM, BD)
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * LN2)
    tl.store(Out + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh
             + offs_m[:, None] * stride_om + offs_d[None, :], out.to(Out.dtype.element_ty),
             mask=(offs_m[:, None] < Nq) & d_ok[None, :])
    tl.store(Lse + off_bh.to(tl.int64) * Nq + offs_m, lse, mask=offs_m < Nq)
    # END SOLUTION


def block_sparse_forward(q, k, v, mask, *, scale=None, num_warps=4, num_stages=2,
                         kernel=block_sparse_kernel):
    """Launch ``kernel`` (yours by default): returns ``(out, lse)`` like
    ``flashlib.block_sparse_attention(q, k, v, mask, return_lse=True)``.

    q: (B, Hq, Nq, D); k, v: (B, Hkv, Nk, D) with Hq % Hkv == 0 and D <= 256, last dim contiguous.
    mask: a ``flashlib.masks.BlockMask`` for (Nq, Nk) whose (Bm, Hm) broadcast over (B, Hq)
    (e.g. ``flashlib.masks.sliding_window(Nq, Nk, 256, block_size=64)``); the kernel's tile is its
    block_size. out: like q; lse: (B, Hq, Nq) float32, natural log.
    """
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != (B, Hkv, Nk, D) or v.shape != k.shape or Hq % Hkv != 0:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected "
                         "(B, Hq, Nq, D) and (B, Hkv, Nk, D) with Hq % Hkv == 0")
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        raise ValueError("q, k and v need a contiguous last dim (stride 1)")
    if (mask.seqlen_q, mask.seqlen_k) != (Nq, Nk):
        raise ValueError(f"the mask is for seqlen_q={mask.seqlen_q}, seqlen_k={mask.seqlen_k}; "
                         f"q and k have Nq={Nq}, Nk={Nk}")
    Bm, Hm, n_qblocks, n_kblocks = mask.shape
    if Bm not in (1, B) or Hm not in (1, Hq):
        raise ValueError(f"the mask's (batch, heads) ({Bm}, {Hm}) do not broadcast over ({B}, {Hq})")
    if B * Hq > 65535:  # CUDA caps grid axes 1 and 2
        raise ValueError(f"batch x heads_q = {B * Hq} exceeds 65535, the grid's axis-1 limit")
    mask = mask.to(q.device)
    tables = [t.expand(B, Hq, *t.shape[2:]).contiguous()                        # (B, Hq, nQ[, nK])
              for t in (mask.kv_count, mask.kv_full, mask.kv_index, mask.kv_bitmap)]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
    kernel[(n_qblocks, B * Hq)](
        q, k, v, out, lse, *tables, mask.bitmaps.contiguous(), *q.stride()[:3], *k.stride()[:3],
        *v.stride()[:3], *out.stride()[:3], Hq, Nq, Nk, D, n_kblocks, scale * math.log2(math.e), Hq // Hkv,
        BLOCK=mask.block_size, BLOCK_D=max(16, triton.next_power_of_2(D)), DOT_PRECISION="ieee",
        num_warps=num_warps, num_stages=1 if runtime.INTERPRET else num_stages)
    return out, lse
