"""flashlib.teach.iosim: walked counts equal the closed forms and show Theorem 2 (FA1 section 3.2)."""
import math

import numpy as np
import pytest

from flashlib.teach import iosim

MATMULS = [(17, 80, 97), (130, 17, 1), (1, 97, 130), (97, 130, 17)]   # (m, k, n)
SRAMS = [300, 1000, 4099]


@pytest.mark.parametrize("m, k, n", MATMULS)
@pytest.mark.parametrize("sram", SRAMS)
def test_matmul_counts_equal_closed_forms(m, k, n, sram):
    naive = iosim.matmul_naive(m, k, n, sram=sram)
    assert (naive.reads, naive.writes, naive.sram_peak) == (2 * m * n * k, m * n, 2 * k + 1)
    reuse = iosim.matmul_row_reuse(m, k, n, sram=sram)
    assert (reuse.reads, reuse.writes) == (m * k + m * n * k, m * n)
    tiled = iosim.matmul_tiled(m, k, n, sram=sram)
    T = math.isqrt(sram // 3)
    assert 3 * T * T <= sram < 3 * (T + 1) ** 2
    # each A tile is read once per column of C tiles, each B tile once per row of C tiles
    assert tiled.reads == m * k * math.ceil(n / T) + k * n * math.ceil(m / T)
    assert tiled.writes == m * n
    for traffic in (naive, reuse, tiled):
        assert traffic.sram_peak <= sram and traffic.total == traffic.reads + traffic.writes


def test_matmul_tiled_reads_fall_as_one_over_tile_size():
    m = k = n = 96
    reads = {T: iosim.matmul_tiled(m, k, n, sram=3 * T * T).reads for T in (4, 8, 16, 32)}
    for T in (4, 8, 16, 32):
        assert reads[T] == 2 * m * n * k // T
    assert reads[4] > reads[8] > reads[16] > reads[32]
    assert iosim.matmul_naive(m, k, n, sram=4 * k).total > iosim.matmul_row_reuse(
        m, k, n, sram=4 * k).total > iosim.matmul_tiled(m, k, n, sram=4 * k).total


def test_working_sets_that_do_not_fit_are_refused():
    with pytest.raises(ValueError, match="sram=100"):
        iosim.matmul_naive(17, 80, 97, sram=100)         # a row and a column need 161
    with pytest.raises(ValueError, match="sram=2"):
        iosim.matmul_tiled(17, 80, 97, sram=2)


def flash_closed_form(N, d, block_k):
    T_c = math.ceil(N / block_k)
    reads = 2 * N * d + T_c * (2 * N * d + 2 * N)        # K, V once; Q, O, l, m per KV block
    writes = (N * d + 2 * N) + T_c * (N * d + 2 * N)     # initialise O, l, m; write back each step
    return reads, writes


@pytest.mark.parametrize("N, d", [(130, 80), (97, 17), (1, 80), (256, 64)])
@pytest.mark.parametrize("sram", [256, 4099, 20000, 100_000])
def test_attention_counts_equal_closed_forms(N, d, sram):
    block_q, block_k = iosim.fa1_block_sizes(sram, d)
    assert block_k == math.ceil(sram / (4 * d)) and block_q == min(block_k, d)
    flash = iosim.attention_flash(N, d, sram=sram)
    assert (flash.reads, flash.writes) == flash_closed_form(N, d, block_k)
    # the paper's blocks overshoot M by at most K_j, V_j: M/2 + 2d; Q_i, O_i: M/2 + 2d; S: M/4
    assert flash.sram_peak <= 1.25 * sram + 4 * d + 2 * block_q + block_k

    standard = iosim.attention_standard(N, d, sram=sram)
    qk, pv = iosim.matmul_tiled(N, d, N, sram=sram), iosim.matmul_tiled(N, N, d, sram=sram)
    softmax_reads = N * N if N <= sram else 2 * N * N   # a row that does not fit is read twice
    assert standard.reads == qk.reads + softmax_reads + pv.reads
    assert standard.writes == qk.writes + N * N + pv.writes == 2 * N * N + N * d
    assert standard.sram_peak <= sram


def test_flash_block_sizes_can_be_chosen():
    N, d = 130, 80
    traffic = iosim.attention_flash(N, d, sram=10**6, block_q=16, block_k=24)
    assert (traffic.reads, traffic.writes) == flash_closed_form(N, d, 24)


def test_flash_traffic_falls_with_sram_and_beats_standard_once_it_is_large():
    N, d = 512, 64
    srams = [2**p for p in range(8, 16)]                 # 4d ... N d: the paper's range
    flash = [iosim.attention_flash(N, d, sram=M).total for M in srams]
    standard = [iosim.attention_standard(N, d, sram=M).total for M in srams]
    assert all(a > b for a, b in zip(flash, flash[1:]))
    assert flash[0] > standard[0]                        # tiny SRAM: Q, O re-read too often
    assert flash[-1] < standard[-1] / 2                  # SRAM of N d: a fraction of the traffic
    crossover = next(i for i in range(len(srams)) if flash[i] < standard[i])
    assert all(f < s for f, s in zip(flash[crossover:], standard[crossover:]))


def test_theorem2_trend_one_over_sram():
    N, d = 1024, 32
    srams = [2**p for p in range(11, 15)]                # 2 d^2 ... N d / 2: T_c from 64 to 8
    flash = np.array([iosim.attention_flash(N, d, sram=M).total for M in srams], dtype=float)
    # Theta(N^2 d^2 / M): the constant is 12 up to the ceilings and the 3Nd of K, V and O
    constant = flash * np.array(srams) / (N * N * d * d)
    assert ((constant > 11.5) & (constant < 14.5)).all(), constant
    slopes = np.diff(np.log(flash)) / np.diff(np.log(srams))   # log-log slope, -1 for 1/M
    assert ((slopes > -1.05) & (slopes < -0.85)).all(), slopes


def test_standard_is_theta_n_d_plus_n_squared():
    d, sram = 64, 3 * 64 * 64                            # M >= 3 d^2: tiles span the head dim
    for N in (97, 256, 1000):
        ratio = iosim.attention_standard(N, d, sram=sram).total / (N * d + N * N)
        assert 4 <= ratio <= 8, (N, ratio)               # S written + read, P written + read


def test_sweep_returns_bytes_for_a_plot():
    N, d = 256, 64
    srams = [1024, 4096, 16384]
    sweep = iosim.sweep_sram(N, d, srams, itemsize=2)
    assert sweep["sram"] == srams
    for key, walk in (("standard", iosim.attention_standard), ("flash", iosim.attention_flash)):
        assert sweep[key] == [2 * walk(N, d, sram=M).total for M in srams]
    assert sweep["theorem2"] == [2 * N * N * d * d / M for M in srams]
    assert sweep["flash"][0] > sweep["flash"][1] > sweep["flash"][2]
    assert iosim.attention_flash(N, d, sram=4096).bytes(4) == 2 * sweep["flash"][1]


# ---- block-sparse FlashAttention (section 3.3): FA2's loops over the listed tiles only --------

def dense_fa2_closed_form(N, d, block_q):
    T_r = math.ceil(N / block_q)
    return N * d + T_r * 2 * N * d, N * d + N            # Q once, K and V per query block; O, lse once


@pytest.mark.parametrize("N, d", [(130, 80), (97, 17), (1, 80), (256, 64)])
@pytest.mark.parametrize("sram", [256, 4099, 20000])
def test_block_sparse_at_density_one_is_dense_fa2(N, d, sram):
    block_k, block_q = iosim.fa1_block_sizes(sram, d)    # FA2 keeps the (large) query block on chip
    dense = iosim.attention_block_sparse(N, d, sram=sram, density=1.0)
    assert (dense.reads, dense.writes) == dense_fa2_closed_form(N, d, block_q)
    all_full = np.full((math.ceil(N / block_q), math.ceil(N / block_k)), 2)
    assert iosim.attention_block_sparse(N, d, sram=sram, kinds=all_full) == dense
    # FA1 (Algorithm 1) moves more: its O, l, m go through HBM once per key block
    assert dense.total < iosim.attention_flash(N, d, sram=sram).total
    empty = iosim.attention_block_sparse(N, d, sram=sram, density=0.0)
    assert (empty.reads, empty.writes) == (N * d, N * d + N)   # Q read, O = 0 and lse = -inf written


def test_block_sparse_traffic_is_linear_in_density():
    N, d, block = 256, 64, 32                            # 8 x 8 tiles of 32 x 32
    sram = 4 * block * d
    base = 2 * N * d + N                                 # Q, O, lse: the N d term
    for s in (0.0, 1 / 64, 0.1, 0.25, 0.5, 0.77, 1.0):
        tiles = round(s * 64)
        traffic = iosim.attention_block_sparse(N, d, sram=sram, density=s)
        assert traffic.total == base + tiles * 2 * block * d, s    # each tile: K_j and V_j


def test_block_sparse_theta_n_d_plus_n2_d2_s_over_m():
    N, d, s = 1024, 32, 0.25
    for sram in (2**11, 2**12, 2**13, 2**14):            # block_q = M / 4d = 16 ... 128
        traffic = iosim.attention_block_sparse(N, d, sram=sram, density=s)
        quadratic = traffic.total - (2 * N * d + N)
        assert quadratic * sram / (N * N * d * d * s) == pytest.approx(8.0), sram


def test_causal_is_density_one_half():
    from flashlib import masks
    N, d, block = 1024, 64, 32
    mask = masks.causal(N, N, block_size=block)
    kinds = mask.kinds[0, 0].numpy()
    T = N // block
    assert mask.density() == pytest.approx((T + 1) / (2 * T))   # the diagonal and below
    sram = 4 * block * d
    base = 2 * N * d + N
    causal = iosim.attention_block_sparse(N, d, sram=sram, kinds=kinds, block_q=block, block_k=block)
    dense = iosim.attention_block_sparse(N, d, sram=sram, density=1.0, block_q=block, block_k=block)
    assert (causal.total - base) / (dense.total - base) == pytest.approx(mask.density())
    assert 0.5 < mask.density() < 0.52
    window = masks.sliding_window(N, N, 128, block_size=block).kinds[0, 0].numpy()
    local = iosim.attention_block_sparse(N, d, sram=sram, kinds=window, block_q=block, block_k=block)
    assert local.total - base == (window != 0).sum() * 2 * block * d


def test_block_sparse_bad_arguments():
    with pytest.raises(ValueError, match="exactly one of density= and kinds="):
        iosim.attention_block_sparse(130, 80, sram=4099)
    with pytest.raises(ValueError, match="exactly one of density= and kinds="):
        iosim.attention_block_sparse(130, 80, sram=4099, density=0.5, kinds=np.ones((2, 2)))
    with pytest.raises(ValueError, match="density must be in"):
        iosim.attention_block_sparse(130, 80, sram=4099, density=1.5)
    with pytest.raises(ValueError, match=r"kinds has shape \(3, 3\); expected \(9, 9\)"):
        iosim.attention_block_sparse(130, 80, sram=4099, kinds=np.ones((3, 3)), block_q=16, block_k=16)


@pytest.mark.parametrize("N, d", [(130, 80), (97, 17), (1, 80), (256, 64)])
@pytest.mark.parametrize("sram", [4099, 20000, 100_000])
def test_flash_backward_counts_equal_closed_form(N, d, sram):
    """Algorithm 4: K_j, V_j once; Q_i, O_i, dO_i, dQ_i, l_i, m_i read and dQ_i written per KV block."""
    block_q, block_k = iosim.fa1_block_sizes(sram, d)
    T_c = math.ceil(N / block_k)
    walk = iosim.attention_flash_backward(N, d, sram=sram)
    assert walk.reads == 2 * N * d + T_c * (4 * N * d + 2 * N)
    assert walk.writes == 3 * N * d + T_c * N * d + 2 * N * d
    small = iosim.attention_flash_backward(N, d, sram=sram, block_q=7, block_k=5)
    assert small.reads == 2 * N * d + math.ceil(N / 5) * (4 * N * d + 2 * N)


@pytest.mark.parametrize("N, d", [(130, 80), (97, 17), (1024, 64)])
def test_standard_backward_moves_about_seven_n_squared(N, d):
    """dV, dP, dS, dQ, dK with a large SRAM: P read twice (dV, dS), dP written and read, dS
    written and read twice: 7 N^2, plus the N x d operands."""
    sram = 3 * 128 * 128
    walk = iosim.attention_standard_backward(N, d, sram=sram)
    T = iosim.square_tile(sram)                                        # d <= T: one pass over d
    assert walk.writes == 2 * N * N + 3 * N * d                       # dP, dS; dV, dQ, dK
    # N^2: P twice, dP once, dS twice; the N x d operands (dO twice, V, K, Q) once per tile row
    assert walk.reads == 5 * N * N + 5 * N * d * math.ceil(N / T)
    # a row of dS that does not fit in SRAM is streamed twice: more reads, the same writes
    tight = iosim.attention_standard_backward(N, d, sram=2 * N - 1) if N > 16 else walk
    assert tight.writes == walk.writes and tight.reads >= walk.reads


def test_forward_backward_flops_and_traffic_at_the_papers_setting():
    """GPT-2 medium's attention (FA1 paper, Figure 2): N = 1024, d = 64. FlashAttention does more
    FLOPs (S recomputed: 14 against 12 N^2 d) and moves several times fewer elements."""
    N, d, sram = 1024, 64, 100_000
    standard = iosim.attention_flops(N, d, backward=True)
    flash = iosim.attention_flops(N, d, backward=True, recompute=True)
    assert (iosim.attention_flops(N, d), standard, flash) == (4 * N * N * d, 12 * N * N * d,
                                                              14 * N * N * d)
    moved_standard = (iosim.attention_standard(N, d, sram=sram).total
                      + iosim.attention_standard_backward(N, d, sram=sram).total)
    moved_flash = (iosim.attention_flash(N, d, sram=sram).total
                   + iosim.attention_flash_backward(N, d, sram=sram).total)
    assert flash > standard and moved_flash * 3 < moved_standard
    with pytest.raises(ValueError, match="backward=True"):
        iosim.attention_flops(N, d, recompute=True)
