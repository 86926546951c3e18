"""FlashAttention-1 forward in Triton, as in the paper: the loop order FA2 later reversed.

Follows Dao et al., "FlashAttention" (arXiv 2205.14135), Algorithm 1:
- one program per (batch, head): the grid is only B * H programs, whatever the sequence length;
- line 2: O, l, m are initialised in HBM (O as float32 scratch, l and m as float32 vectors);
- lines 5-6: the OUTER loop walks the key/value blocks K_j, V_j, held on chip;
- lines 7-13: the INNER loop walks the query blocks: it loads Q_i, O_i, l_i, m_i from HBM, folds
  the tile S_ij = Q_i K_j^T in, and stores O_i, l_i, m_i back. O is kept normalised (line 12), so
  every step un-normalises it (diag(l) O), rescales, adds P~ V_j and divides by the new l.
So O, l and m cross HBM twice per tile: that traffic, and the small grid, are what FA2 removes
(lesson 07). ``scratch_bytes`` counts it.

The online step is ``kernels.tile.tile_update`` (un-normalise O, call it, re-normalise); lesson
06's exercise plugs in the paper's lines 11-13 instead through ``rescale``. Scores are base 2
(``scale * log2(e)`` folded in, m in log2 units) as everywhere in flashlib.
Conventions as ``fa2_forward``: (B, H, N, D) with any strides (last dim contiguous or copied),
grouped-query heads, bottom-right causal (query blocks above the diagonal are skipped), head dims
padded to a power of two (>= 16) and masked, rows with no key -> out 0 and lse -inf.
Limits: a teaching kernel, slow by design; no backward (use ``flash_attention``).
"""

import torch
import triton
import triton.language as tl

from . import launch
from .config import padded_headdim, prologue, size_bucket, tuned
from .tile import LN2, LOG2E, tile_update


@triton.jit
def _tile_update_step(o, l, m, s, v, DOT_PRECISION: tl.constexpr):
    """Lines 9-13 through the shared online step: acc = diag(l) O, update, O = diag(l_new)^-1 acc."""
    acc, m, l = tile_update(o * l[:, None], m, l, s, v, DOT_PRECISION)
    return acc / tl.where(l == 0.0, 1.0, l)[:, None], l, m


@triton.jit
def _paper_step(o, l, m, s, v, DOT_PRECISION: tl.constexpr, RESCALE: tl.constexpr):
    """Lines 9-13 as written: block statistics m~, l~, P~ V_j, then RESCALE (lines 11-13)."""
    m_tilde = tl.max(s, 1)                                              # (BM,) line 10
    m_ref = tl.where(m_tilde == float("-inf"), 0.0, m_tilde)            # a row masked in this tile
    p_tilde = tl.math.exp2(s - m_ref[:, None])                          # (BM, BN)
    l_tilde = tl.sum(p_tilde, 1)                                        # (BM,)
    pv = tl.dot(p_tilde.to(v.dtype), v, input_precision=DOT_PRECISION)  # (BM, BD)
    return RESCALE(o, l, m, m_tilde, l_tilde, pv)


@triton.jit
def _fa1_fwd_kernel(Q, K, V, Out, Lse, O, L, M,
                    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                    stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
                    Hq, Nq, Nk, D, qk_scale, n_bucket, GROUP, CAUSAL: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    DOT_PRECISION: tl.constexpr, RESCALE: tl.constexpr):
    off_bh = tl.program_id(0)                     # one program per (batch, head)
    off_b = off_bh // Hq
    off_h = off_bh % Hq
    off_hkv = off_h // GROUP                      # grouped-query: GROUP query heads share K/V
    offs_m = tl.arange(0, BLOCK_M)                # (BM,)
    offs_n = tl.arange(0, BLOCK_N)                # (BN,)
    offs_d = tl.arange(0, BLOCK_D)                # (BD,)
    d_ok = offs_d < D
    q_base = Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
    k_base = K + off_b.to(tl.int64) * stride_kb + off_hkv.to(tl.int64) * stride_kh
    v_base = V + off_b.to(tl.int64) * stride_vb + off_hkv.to(tl.int64) * stride_vh
    out_base = Out + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh
    o_base = O + off_bh.to(tl.int64) * Nq * D     # scratch (B*Hq, Nq, D), contiguous
    lm_off = off_bh.to(tl.int64) * Nq             # l, m scratch (B*Hq, Nq)

    # line 2: O = 0, l = 0, m = -inf, in HBM
    for start_m in range(0, Nq, BLOCK_M):
        rows = start_m + offs_m
        tl.store(o_base + rows[:, None] * D + offs_d[None, :], tl.zeros([BLOCK_M, BLOCK_D], tl.float32),
                 mask=(rows[:, None] < Nq) & d_ok[None, :])
        tl.store(L + lm_off + rows, tl.zeros([BLOCK_M], tl.float32), mask=rows < Nq)
        tl.store(M + lm_off + rows, tl.full([BLOCK_M], float("-inf"), tl.float32), mask=rows < Nq)

    causal_offset = Nk - Nq                       # query i sees key j iff j <= i + causal_offset
    for start_n in range(0, Nk, BLOCK_N):         # line 5: outer loop over key/value blocks
        cols = start_n + offs_n                   # (BN,)
        kt = tl.load(k_base + cols[None, :] * stride_kn + offs_d[:, None],
                     mask=(cols[None, :] < Nk) & d_ok[:, None], other=0.0)    # (BD, BN): K_j^T
        v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :],
                    mask=(cols[:, None] < Nk) & d_ok[None, :], other=0.0)     # (BN, BD): V_j
        lo = 0
        if CAUSAL:  # query blocks whose last row sees none of these keys are skipped
            lo = tl.maximum(start_n - causal_offset, 0) // BLOCK_M * BLOCK_M
        for start_m in range(lo, Nq, BLOCK_M):    # line 7: inner loop over query blocks
            # O_i, l_i, m_i were stored by other threads of this program: wait for them
            tl.debug_barrier()
            rows = start_m + offs_m               # (BM,)
            row_ok = rows < Nq
            o_ptrs = o_base + rows[:, None] * D + offs_d[None, :]              # (BM, BD)
            o_mask = row_ok[:, None] & d_ok[None, :]
            q = tl.load(q_base + rows[:, None] * stride_qm + offs_d[None, :], mask=o_mask, other=0.0)
            o = tl.load(o_ptrs, mask=o_mask, other=0.0)                         # line 8: from HBM
            l = tl.load(L + lm_off + rows, mask=row_ok, other=0.0)
            m = tl.load(M + lm_off + rows, mask=row_ok, other=float("-inf"))
            s = tl.dot(q, kt, input_precision=DOT_PRECISION) * qk_scale         # (BM, BN) line 9
            visible = (cols[None, :] < Nk) & row_ok[:, None]
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None] + causal_offset)
            s = tl.where(visible, s, float("-inf"))
            if RESCALE is None:
                o, l, m = _tile_update_step(o, l, m, s, v, DOT_PRECISION)
            else:
                o, l, m = _paper_step(o, l, m, s, v, DOT_PRECISION, RESCALE)
            tl.store(o_ptrs, o, mask=o_mask)                                    # lines 12-13: to HBM
            tl.store(L + lm_off + rows, l, mask=row_ok)
            tl.store(M + lm_off + rows, m, mask=row_ok)

    # O is already normalised: cast it to the output dtype and write lse = ln(sum exp(s))
    for start_m in range(0, Nq, BLOCK_M):
        tl.debug_barrier()
        rows = start_m + offs_m
        row_ok = rows < Nq
        o_mask = row_ok[:, None] & d_ok[None, :]
        o = tl.load(o_base + rows[:, None] * D + offs_d[None, :], mask=o_mask, other=0.0)
        l = tl.load(L + lm_off + rows, mask=row_ok, other=0.0)
        m = tl.load(M + lm_off + rows, mask=row_ok, other=0.0)
        lse = tl.where(l == 0.0, float("-inf"), (m + tl.math.log2(tl.where(l == 0.0, 1.0, l))) * LN2)
        tl.store(out_base + rows[:, None] * stride_om + offs_d[None, :], o.to(Out.dtype.element_ty),
                 mask=o_mask)
        tl.store(Lse + lm_off + rows, lse, mask=row_ok)


# (BLOCK_M, BLOCK_N, num_warps, num_stages); the first is used when autotuning is off
CONFIGS = [(64, 64, 4, 1), (128, 64, 8, 1), (64, 128, 8, 1), (128, 128, 8, 1), (32, 64, 4, 1),
           (32, 32, 4, 1)]
# SRAM: K_j and V_j stay resident through the inner loop; Q_i and the float32 O_i stream past
_choose = tuned(_fa1_fwd_kernel, CONFIGS, lambda bm, bn: (2 * bn, 3 * bm))


def fa1_forward(q, k, v, *, causal=False, scale=None, allow_tf32=False, rescale=None):
    """Launch the FA1 forward kernel (Algorithm 1). Returns ``(out, lse)``.

    q: (B, Hq, Nq, D); k, v: (B, Hkv, Nk, D), Hq % Hkv == 0. out: like q; lse: (B, Hq, Nq)
    float32, natural log, -inf for rows with nothing to attend to. causal: bottom-right.
    rescale: a ``@triton.jit`` function ``(o, l, m, m_tilde, l_tilde, pv) -> (o, l, m)``
    implementing Algorithm 1 lines 11-13 (lesson 06's exercise); None uses ``tile_update``.
    """
    from ..inputs import check_inputs
    scale = check_inputs(q, k, v, scale=scale, causal=causal)
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    (q, k, v), scale, precision, out_dtype = prologue(q, k, v, scale=scale, allow_tf32=allow_tf32)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
    # line 2's O, l, m in HBM; the kernel initialises them (so autotuning's re-runs stay exact)
    o_scratch = torch.empty((B * Hq, Nq, D), dtype=torch.float32, device=q.device)
    l_scratch = torch.empty((B * Hq, Nq), dtype=torch.float32, device=q.device)
    m_scratch = torch.empty((B * Hq, Nq), dtype=torch.float32, device=q.device)
    block_d = padded_headdim(D)
    kernel, config = _choose(block_d, q.element_size(), B * Hq * Nq * Nk)
    launch.run(  # kernel[(B * Hq,)](...), through flashlib's one launch point
        kernel, (B * Hq,), q, k, v, out, lse, o_scratch, l_scratch, m_scratch,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        Hq, Nq, Nk, D, scale * LOG2E, size_bucket(Nq, Nk, slices=B * Hq), Hq // Hkv,
        CAUSAL=bool(causal), BLOCK_D=block_d, DOT_PRECISION=precision,
        RESCALE=rescale, **config)
    return out.to(out_dtype), lse


def scratch_bytes(Nq, Nk, D, *, block_m=64, block_n=64, causal=False, batch_heads=1):
    """HBM bytes the kernel moves for its float32 O, l, m scratch, walking its loops.

    Line 2 writes every row once; each tile the inner loop visits reads and writes its rows of
    O, l, m; the epilogue reads them once more. (FA2 instead writes O and lse once, at the end.)
    """
    row_bytes = 4 * (D + 2)                                  # one row of O, plus l and m
    visits = 0
    for start_n in range(0, Nk, block_n):
        lo = max(start_n - (Nk - Nq), 0) // block_m * block_m if causal else 0
        visits += max(Nq - lo, 0)                            # rows of the query blocks visited
    return batch_heads * row_bytes * (2 * Nq + 2 * visits)
