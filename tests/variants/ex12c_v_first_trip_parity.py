"""ex12c written another way: V before K, the parity from the trip count."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma


@gluon.jit
def load_kv(k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, batch, kv_head, first_row,
            n_blocks, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    for j in range(n_blocks):                     # V's copy issued before K's
        s = j % STAGES
        trip = j // STAGES
        row = first_row + j * BLOCK_N
        mbarrier.wait(v_empty.index(s), (trip + 1) % 2)
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [batch, kv_head, row, 0], v_ready.index(s), v_smem.index(s))
        mbarrier.wait(k_empty.index(s), (trip + 1) % 2)
        mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [batch, kv_head, row, 0], k_ready.index(s), k_smem.index(s))
