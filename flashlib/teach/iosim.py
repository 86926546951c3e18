"""An HBM/SRAM traffic simulator: how many elements move between HBM and a small SRAM.

FlashAttention's claim is about IO, not flops (arXiv 2205.14135, section 3.2, Theorem 2): with
an SRAM of M elements, head dim d and sequence length N, standard attention needs
Theta(N d + N^2) HBM accesses and FlashAttention Theta(N^2 d^2 / M). This module checks that by
*walking the loops* of each algorithm and counting every tile it loads from or stores to HBM,
so the numbers can be trusted and compared with the closed forms (tests/test_iosim.py does).

Units: sizes and counts are in *elements* (the paper's convention); multiply by the bytes per
element (2 for float16) for bytes, as ``sweep_sram`` does. ``sram`` is the SRAM size M in
elements, and every walk records the most elements it held on chip at once (``sram_peak``).
The matmuls always fit in M; FA1 with the paper's block sizes B_c = ceil(M / 4d),
B_r = min(B_c, d) may hold up to about 1.25 M (K_j, V_j: M/2; Q_i, O_i: up to M/2;
S_ij: up to M/4): the paper's constants are asymptotic, and ``sram_peak`` shows it.

``attention_standard_backward`` and ``attention_flash_backward`` walk the backward passes (the
paper's Algorithms 3 and 4, appendix B), so forward + backward can be counted as the paper's
Figure 2 does; ``attention_flops`` counts the matmul FLOPs, with FlashAttention's recomputation.

``attention_block_sparse`` walks block-sparse FlashAttention (section 3.3): FA2's loops over
only the tiles a block mask lists, Theta(N d + N^2 d^2 s / M) for a fraction s of non-empty tiles.

Limits: one head, one sequence (multiply by batch x heads); N_q = N_k = N; masking (causal or
any other) only as the tile kinds given to ``attention_block_sparse``, whose element masks of
partial tiles are not counted; registers, caches and the L2 are not modelled; counts only, no
timing.
"""
import math
from dataclasses import dataclass

import numpy as np

__all__ = ["Traffic", "matmul_naive", "matmul_row_reuse", "matmul_tiled", "attention_standard",
           "attention_flash", "fa1_block_sizes", "attention_block_sparse", "visited_tiles", "sweep_sram",
           "attention_standard_backward", "attention_flash_backward", "attention_flops"]


@dataclass
class Traffic:
    """Elements read from / written to HBM, and the most elements held in SRAM at once."""
    reads: int = 0
    writes: int = 0
    sram_peak: int = 0
    sram: int = 0        # capacity M the walk was given

    @property
    def total(self) -> int:
        return self.reads + self.writes

    def bytes(self, itemsize: int = 2) -> int:
        return self.total * itemsize


class Chip:
    """The counter the walks drive: HBM reads/writes, and what is resident in SRAM."""

    def __init__(self, sram: int, *, strict: bool = True):
        self.traffic, self.used, self.strict = Traffic(sram=sram), 0, strict

    def read(self, rows: int, cols: int = 1) -> None:
        """Load a rows x cols tile from HBM into SRAM."""
        self.traffic.reads += rows * cols
        self.hold(rows, cols)

    def hold(self, rows: int, cols: int = 1) -> None:
        """Occupy SRAM without HBM traffic (an accumulator, a score tile computed on chip)."""
        self.used += rows * cols
        self.traffic.sram_peak = max(self.traffic.sram_peak, self.used)
        if self.strict and self.used > self.traffic.sram:
            raise ValueError(f"working set of {self.used} elements does not fit in an SRAM of "
                             f"sram={self.traffic.sram} elements")

    def write(self, rows: int, cols: int = 1) -> None:
        """Store a rows x cols tile (already on chip) to HBM."""
        self.traffic.writes += rows * cols

    def free(self, rows: int, cols: int = 1) -> None:
        self.used -= rows * cols


def blocks(n: int, size: int):
    """(start, length) of each block of ``size`` along ``n``; the last may be shorter."""
    return [(start, min(size, n - start)) for start in range(0, n, size)]


# ---- matmul C = A B, A (m x k), B (k x n) --------------------------------------------------

def matmul_naive(m: int, k: int, n: int, *, sram: int) -> Traffic:
    """Each C[i, j] reads row i of A and column j of B afresh: reads 2mnk, writes mn."""
    chip = Chip(sram)
    for _ in range(m):
        for _ in range(n):
            chip.read(1, k)          # row i of A
            chip.read(k, 1)          # column j of B
            chip.hold(1)             # C[i, j]
            chip.write(1)
            chip.free(1, 2 * k + 1)
    return chip.traffic


def matmul_row_reuse(m: int, k: int, n: int, *, sram: int) -> Traffic:
    """Row i of A stays in SRAM while every column of B streams past: reads mk + mnk."""
    chip = Chip(sram)
    for _ in range(m):
        chip.read(1, k)              # row i of A, read once
        for _ in range(n):
            chip.read(k, 1)          # column j of B
            chip.hold(1)
            chip.write(1)
            chip.free(1, k + 1)
        chip.free(1, k)
    return chip.traffic


def walk_matmul_tiled(chip: Chip, m: int, k: int, n: int, tile: int) -> None:
    for _, rows in blocks(m, tile):
        for _, cols in blocks(n, tile):
            chip.hold(rows, cols)                  # C tile accumulates on chip
            for _, depth in blocks(k, tile):
                chip.read(rows, depth)             # A tile
                chip.read(depth, cols)             # B tile
                chip.free(rows, depth)
                chip.free(depth, cols)
            chip.write(rows, cols)
            chip.free(rows, cols)


def square_tile(sram: int) -> int:
    """Largest T with three T x T tiles (A, B, C) in SRAM."""
    tile = math.isqrt(sram // 3)
    if tile < 1:
        raise ValueError(f"sram={sram} elements cannot hold three 1 x 1 tiles")
    return tile


def matmul_tiled(m: int, k: int, n: int, *, sram: int, tile: int | None = None) -> Traffic:
    """Square T x T tiles, 3 T^2 <= M: reads mk ceil(n/T) + kn ceil(m/T), writes mn."""
    chip = Chip(sram)
    walk_matmul_tiled(chip, m, k, n, square_tile(sram) if tile is None else tile)
    return chip.traffic


# ---- attention, one head: Q, K, V, O are N x d ---------------------------------------------

def attention_standard(N: int, d: int, *, sram: int) -> Traffic:
    """Algorithm 0 of the paper: S = Q K^T and P = softmax(S) go through HBM.

    The two matmuls are tiled (``matmul_tiled``); the softmax reads each row of S once and
    writes P if the row fits in SRAM, else it streams the row twice (online max/sum, then
    normalise). Theta(N d + N^2) once M >= 3 d^2, more below that.
    """
    chip = Chip(sram)
    tile = square_tile(sram)
    walk_matmul_tiled(chip, N, d, N, tile)         # S = Q K^T, written to HBM
    chunk = N if N <= sram else sram - 2           # room for the running (max, sum)
    for _ in range(N):                             # P = softmax(S), row by row
        if chunk == N:
            chip.read(1, N)
            chip.write(1, N)
            chip.free(1, N)
            continue
        chip.hold(2)
        for _, length in blocks(N, chunk):         # pass 1: running max and sum
            chip.read(1, length)
            chip.free(1, length)
        for _, length in blocks(N, chunk):         # pass 2: normalise and write P
            chip.read(1, length)
            chip.write(1, length)
            chip.free(1, length)
        chip.free(2)
    walk_matmul_tiled(chip, N, N, d, tile)         # O = P V
    return chip.traffic


def fa1_block_sizes(sram: int, d: int) -> tuple[int, int]:
    """The paper's choice (Algorithm 1, line 1): B_c = ceil(M / 4d), B_r = min(B_c, d)."""
    block_k = math.ceil(sram / (4 * d))
    return min(block_k, d), block_k


def attention_flash(N: int, d: int, *, sram: int, block_q: int | None = None,
                    block_k: int | None = None) -> Traffic:
    """FlashAttention-1, Algorithm 1: KV blocks outer; O, l, m read and written every step.

    Reads 2Nd + T_c (2Nd + 2N) and writes (T_c + 1)(Nd + 2N), T_c = ceil(N / B_c): about
    12 N^2 d^2 / M in all. Block sizes default to ``fa1_block_sizes(sram, d)``.
    """
    default_q, default_k = fa1_block_sizes(sram, d)
    block_q = default_q if block_q is None else block_q
    block_k = default_k if block_k is None else block_k
    chip = Chip(sram, strict=False)                # the paper's blocks overshoot M a little
    chip.write(N, d)                               # line 2: O = 0, l = 0, m = -inf in HBM
    chip.write(N, 2)
    for _, cols in blocks(N, block_k):
        chip.read(cols, d)                         # K_j
        chip.read(cols, d)                         # V_j
        for _, rows in blocks(N, block_q):
            chip.read(rows, d)                     # Q_i
            chip.read(rows, d)                     # O_i
            chip.read(rows, 2)                     # l_i, m_i
            chip.hold(rows, cols)                  # S_ij, then P~_ij, on chip
            chip.write(rows, d)                    # O_i
            chip.write(rows, 2)                    # l_i, m_i
            chip.free(rows, cols)
            chip.free(rows, 2 * d + 2)
        chip.free(cols, 2 * d)
    return chip.traffic


def attention_standard_backward(N: int, d: int, *, sram: int) -> Traffic:
    """Standard attention's backward (the paper's Algorithm 3): every N x N matrix through HBM.

    Given Q, K, V, dO and the forward's P in HBM: dV = P^T dO, dP = dO V^T (tiled matmuls, dP
    written), dS = P * (dP - rowsum(P * dP)) row by row (reads P and dP, writes dS; two passes
    over a row that does not fit in SRAM), dQ = dS K, dK = dS^T Q. Theta(N d + N^2): about
    7 N^2 elements once M >= 3 d^2 (P read twice, dP written and read, dS written and read twice).
    """
    chip = Chip(sram)
    tile = square_tile(sram)
    walk_matmul_tiled(chip, N, N, d, tile)         # dV = P^T dO  (reads P, dO; writes dV)
    walk_matmul_tiled(chip, N, d, N, tile)         # dP = dO V^T  (reads dO, V; writes dP)
    half = (sram - 1) // 2                         # room for a chunk of P and of dP, and D_i
    chunk = N if N <= half else half
    for _ in range(N):                             # dS, row by row
        chip.hold(1)                               # D_i = sum_j P_ij dP_ij
        passes = 1 if chunk == N else 2            # a long row: D_i first, then dS
        for p in range(passes):
            for _, length in blocks(N, chunk):
                chip.read(1, length)               # P_i
                chip.read(1, length)               # dP_i
                if p == passes - 1:
                    chip.write(1, length)          # dS_i
                chip.free(2, length)
        chip.free(1)
    walk_matmul_tiled(chip, N, N, d, tile)         # dQ = dS K
    walk_matmul_tiled(chip, N, N, d, tile)         # dK = dS^T Q
    return chip.traffic


def attention_flash_backward(N: int, d: int, *, sram: int, block_q: int | None = None,
                             block_k: int | None = None) -> Traffic:
    """FlashAttention-1's backward (the paper's Algorithm 4): P recomputed on chip from Q, K, l, m.

    dQ, dK, dV are zeroed in HBM; KV blocks outer: K_j, V_j read once, dK_j, dV_j kept on chip
    and written once; query blocks inner: Q_i, O_i, dO_i, dQ_i and l_i, m_i read, dQ_i written,
    every step. Reads 2Nd + T_c (4Nd + 2N), writes 3Nd + T_c Nd + 2Nd, T_c = ceil(N / B_c).
    Block sizes default to ``fa1_block_sizes(sram, d)``, as the forward's.
    """
    default_q, default_k = fa1_block_sizes(sram, d)
    block_q = default_q if block_q is None else block_q
    block_k = default_k if block_k is None else block_k
    chip = Chip(sram, strict=False)                # the paper's blocks overshoot M a little
    chip.write(N, 3 * d)                           # dQ, dK, dV = 0 in HBM
    for _, cols in blocks(N, block_k):
        chip.read(cols, 2 * d)                     # K_j, V_j
        chip.hold(cols, 2 * d)                     # dK_j, dV_j accumulate on chip
        for _, rows in blocks(N, block_q):
            chip.read(rows, 4 * d)                 # Q_i, O_i, dO_i, dQ_i
            chip.read(rows, 2)                     # l_i, m_i
            chip.hold(rows, cols)                  # S_ij -> P_ij, dP_ij -> dS_ij, on chip
            chip.write(rows, d)                    # dQ_i
            chip.free(rows, cols + 4 * d + 2)
        chip.write(cols, 2 * d)                    # dK_j, dV_j
        chip.free(cols, 4 * d)
    return chip.traffic


def attention_flops(N: int, d: int, *, backward: bool = False, recompute: bool = False) -> int:
    """Matmul FLOPs of attention for one head, N queries and N keys (a multiply-add is 2 FLOPs).

    Forward: S = Q K^T and O = P V, 4 N^2 d. backward=True adds dV = P^T dO, dP = dO V^T,
    dQ = dS K, dK = dS^T Q, 8 N^2 d; recompute=True (FlashAttention's backward, which keeps no P)
    adds S = Q K^T once more, 2 N^2 d. The softmax's element-wise FLOPs (a few per score, against
    4 d per score for the matmuls) are not counted.
    """
    if recompute and not backward:
        raise ValueError("recompute=True counts the backward's recomputation: give backward=True")
    per_score = 4 * d + (8 * d if backward else 0) + (2 * d if recompute else 0)
    return per_score * N * N


def visited_tiles(n_rows: int, n_cols: int, *, density=None, kinds=None) -> np.ndarray:
    """(n_rows, n_cols) bool: the tiles a block-sparse walk visits, from exactly one of

    kinds: tile kinds, 0 empty (never visited), 1 partial, 2 full (``BlockMask.kinds[b, h]``);
    density: s in [0, 1], round(s n_rows n_cols) tiles spread evenly over the grid (row-major).
    """
    if (density is None) == (kinds is None):
        raise ValueError("give exactly one of density= and kinds=")
    if kinds is not None:
        kinds = np.asarray(kinds)
        if kinds.shape != (n_rows, n_cols):
            raise ValueError(f"kinds has shape {kinds.shape}; expected ({n_rows}, {n_cols}), one entry "
                             "per (query block, key block) tile of this walk's block sizes")
        return kinds != 0
    if not 0.0 <= density <= 1.0:
        raise ValueError(f"density must be in [0, 1], got {density!r}")
    n = round(density * n_rows * n_cols)
    visited = np.zeros(n_rows * n_cols, dtype=bool)
    visited[np.linspace(0, n_rows * n_cols - 1, n).round().astype(int)] = True   # spacing >= 1
    return visited.reshape(n_rows, n_cols)


def attention_block_sparse(N: int, d: int, *, sram: int, density: float | None = None, kinds=None,
                           block_q: int | None = None, block_k: int | None = None) -> Traffic:
    """Block-sparse FlashAttention (section 3.3) in FA2's loop order, as flashlib's kernels run it.

    Query blocks outer: Q_i is read once, O_i and lse_i written once; the inner loop visits only
    the key blocks listed for query block i (``visited_tiles``: give ``kinds`` or ``density``),
    reading K_j and V_j for each. Empty tiles cost nothing. Reads N d + 2 d (key rows of every
    visited tile), writes N d + N: for blocks that divide N, N d + s T_r 2 N d and N d + N, so
    with block_q = M / 4d about 2 N d + 8 s N^2 d^2 / M, the paper's Theta(N d + N^2 d^2 s / M).
    s = 1 is dense FA2. Block sizes default to ``fa1_block_sizes`` with the roles swapped (the
    query block stays on chip here, so it is the large one); with ``kinds`` from a BlockMask pass
    its block_size as both.
    """
    default_k, default_q = fa1_block_sizes(sram, d)
    block_q = default_q if block_q is None else block_q
    block_k = default_k if block_k is None else block_k
    query_blocks, key_blocks = blocks(N, block_q), blocks(N, block_k)
    visited = visited_tiles(len(query_blocks), len(key_blocks), density=density, kinds=kinds)
    chip = Chip(sram, strict=False)                # the default blocks overshoot M a little, as FA1's
    for i, (_, rows) in enumerate(query_blocks):
        chip.read(rows, d)                         # Q_i
        chip.hold(rows, d + 2)                     # acc, m, l stay on chip
        for j in np.flatnonzero(visited[i]):
            cols = key_blocks[j][1]
            chip.read(cols, d)                     # K_j
            chip.read(cols, d)                     # V_j
            chip.hold(rows, cols)                  # S_ij, then P_ij
            chip.free(rows, cols)
            chip.free(cols, 2 * d)
        chip.write(rows, d)                        # O_i
        chip.write(rows, 1)                        # lse_i
        chip.free(rows, 2 * d + 2)
    return chip.traffic


def sweep_sram(N: int, d: int, srams, *, itemsize: int = 2) -> dict:
    """HBM bytes of standard vs FlashAttention for each SRAM size (elements) in ``srams``.

    Returns lists keyed "sram", "standard", "flash" (bytes) and "theorem2" (N^2 d^2 / M in
    bytes, the shape of Theorem 2's bound), ready for a log-log plot against "sram".
    """
    result = {"sram": [], "standard": [], "flash": [], "theorem2": []}
    for sram in srams:
        result["sram"].append(sram)
        result["standard"].append(attention_standard(N, d, sram=sram).bytes(itemsize))
        result["flash"].append(attention_flash(N, d, sram=sram).bytes(itemsize))
        result["theorem2"].append(N * N * d * d / sram * itemsize)
    return result
