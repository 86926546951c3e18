"""Mutant of ex09b: a torch one-liner behind the kernel. block_sparse_kernel's body is the stub's
with the raise removed (it computes nothing), and its ``run`` (what ``kernel[grid](...)`` calls)
is replaced by attention in torch under the dense mask its tables describe (full blocks whole,
partial ones by their bitmaps; out 0 and lse -inf on rows with no key): every result is right, no
Triton program runs. A grader that launches ``kernel[grid]`` itself passes it."""
EXPECTED_HINT = "does not run its body"

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
    pass
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


def _torch_block_sparse_kernel(q, k, v, out, lse, count, full, index, bitmap, bitmaps, *args, grid,
                               warmup, BLOCK, **kwargs):
    """block_sparse_kernel's launch replaced: the same out and lse from torch, whatever the grid."""
    if warmup:
        return
    n_kblocks, qk_scale, group = args[-3], args[-2], args[-1]
    B, Hq, Nq, D = q.shape
    Nk, nQ = k.shape[2], -(-Nq // BLOCK)
    allowed = torch.zeros(B, Hq, nQ * BLOCK, n_kblocks * BLOCK, dtype=torch.bool, device=q.device)
    for b in range(B):
        for h in range(Hq):
            for i in range(nQ):
                for t in range(int(count[b, h, i])):
                    j = int(index[b, h, i, t])
                    tile = allowed[b, h, i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
                    tile[:] = True if t < int(full[b, h, i]) else bitmaps[int(bitmap[b, h, i, t])].bool()
    kk, vv = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    s = q.double() @ kk.transpose(-1, -2) * (qk_scale / LOG2E.value)
    s = s.masked_fill(~allowed[:, :, :Nq, :Nk], float("-inf"))
    m = torch.logsumexp(s, dim=-1)                                        # -inf on empty rows
    out.copy_((torch.exp(s - m[..., None]).nan_to_num(0.0) @ vv).to(out.dtype))
    lse.copy_(m.float())


block_sparse_kernel.run = _torch_block_sparse_kernel
