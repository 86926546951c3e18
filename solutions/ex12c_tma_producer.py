"""Exercise 12c (lesson 12, optional kernel part on a Hopper GPU): FlashAttention-3's producer loop.

In FlashAttention-3 (Shah et al., 2024, section 3.1) one warp of each CTA only moves data: it
issues TMA loads of K and V blocks into a ring of STAGES shared-memory stages, and the consumer
warpgroups' wgmmas read them. Write that loop, ``load_kv``, in Gluon (Triton's lower-level
language: you name the barriers and the copies yourself). Your function runs as the producer of
flashlib's FA3 forward kernel (``flashlib.kernels.fa3_fwd``), the consumers are flashlib's.

Arguments (the kernel passes them):

    k_desc, v_desc        TMA descriptors of K and V, (batch, head, row, dim); a copy moves one
                          block of BLOCK_N rows: ``k_desc.block_type.nbytes`` bytes
    k_smem, v_smem        the ring's buffers: ``k_smem.index(s)`` is stage s (0 .. STAGES - 1)
    k_ready, v_ready      per stage, an mbarrier the consumers wait on before reading the stage:
                          one arrival (yours, ``mbarrier.expect``) plus the bytes it was told to
                          expect complete its phase
    k_empty, v_empty      per stage, an mbarrier every consumer arrives on when it has finished
                          reading the stage (its phases complete once per trip round the ring)
    batch, kv_head        the descriptors' first two coordinates for this CTA
    first_row             the row of this sequence's first key (0 unless sequences are packed)
    n_blocks              how many blocks of keys to load: block j holds rows
                          first_row + j * BLOCK_N ... (+ BLOCK_N), at column 0
    BLOCK_N, STAGES       constexprs: keys per block, stages in the ring

Block j goes into stage j % STAGES, K and V each with their own barriers (so that S = Q K^T can
start before V has landed). The four Gluon calls you need (Triton 3.6, the GPU machines'):

    mbarrier.wait(bar, parity)      returns once the phase of that parity (0 or 1) is complete;
                                    a fresh barrier's "previous" phase, parity 1, counts as complete
    mbarrier.expect(bar, nbytes)    arrive on bar and tell it to wait for nbytes more bytes
    tma.async_copy_global_to_shared(desc, [b, h, row, 0], bar, buffer)
                                    start the copy of one block into buffer; its bytes complete
                                    on bar when they have landed
    range(n)                        a loop over a run-time count (gl.static_range unrolls
                                    constexprs only)

Before the copy into a stage that already held a block, the consumers must be done with that
block: wait on the stage's ``empty`` barrier, for the phase that their release completes (the
trip round the ring tells which parity). On any machine ``flashlib check ex12c`` runs your loop's
Python body in a model of the ring (``flashlib.teach.mbarrier``) with flashlib's consumers, and
on a Hopper GPU (sm90, Triton 3.6) it then runs inside the FA3 kernel against the float64
reference.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma


@gluon.jit
def load_kv(k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, batch, kv_head, first_row,
            n_blocks, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """The producer warp's loop: K_j and V_j, j < n_blocks, into stage j % STAGES of the ring."""
    # BEGIN SOLUTION
    for j in range(n_blocks):
        s = j % STAGES
        phase = (j // STAGES) & 1                # which trip round the ring
        row = first_row + j * BLOCK_N
        mbarrier.wait(k_empty.index(s), phase ^ 1)
        mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [batch, kv_head, row, 0], k_ready.index(s), k_smem.index(s))
        mbarrier.wait(v_empty.index(s), phase ^ 1)
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [batch, kv_head, row, 0], v_ready.index(s), v_smem.index(s))
    # END SOLUTION
