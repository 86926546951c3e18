"""ex12c written another way: the stage and the phase as running counters, both empty waits first."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma


@gluon.jit
def load_kv(k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, batch, kv_head, first_row,
            n_blocks, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    s = 0
    phase = 0
    for j in range(n_blocks):                     # stage and phase as running counters
        mbarrier.wait(k_empty.index(s), phase ^ 1)
        mbarrier.wait(v_empty.index(s), phase ^ 1)
        mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [batch, kv_head, first_row + j * BLOCK_N, 0], k_ready.index(s),
                                        k_smem.index(s))
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [batch, kv_head, first_row + j * BLOCK_N, 0], v_ready.index(s),
                                        v_smem.index(s))
        s += 1
        if s == STAGES:
            s = 0
            phase ^= 1
