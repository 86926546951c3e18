"""Block masks for block-sparse attention: which (query block, key block) tiles a kernel visits.

Block-sparse FlashAttention (Dao et al. 2022, section 3.3) runs the FlashAttention loops over
only the non-zero blocks of a block mask, so its HBM traffic is Theta(N d + N^2 d^2 s / M) for
a fraction s of non-empty blocks: it is exact attention under the mask, only cheaper.

A mask starts from a rule, "query i may attend key j" (causal, a sliding window, a document,
a user function, ...). Cut into ``block_size`` x ``block_size`` tiles, each tile is

    empty    no pair allowed: the kernel never loads it;
    full     every pair allowed: the kernel visits it with no mask at all;
    partial  some pairs allowed: the kernel visits it and masks element-wise: by arithmetic
             for a band mask (``band``: causal, sliding windows and their intersections), else
             reading the tile's bit pattern from ``bitmaps`` (a (block_size, block_size) uint8
             tile each).

Key tiles that run past seqlen_k are partial (their bitmap is 0 past the end), so a full tile
never pays for a bounds check. Query rows past seqlen_q do not count: a short last query tile
is full when all of its real rows see all its keys (the padded rows are computed and never stored). A ``BlockMask`` is stored the way the kernels read it:

    per query block (forward and dQ): kv_index (Bm, Hm, nQ, nK) int32 the key blocks to visit,
        full ones first, kv_full (Bm, Hm, nQ) how many are full, kv_count how many in all,
        kv_bitmap (Bm, Hm, nQ, nK) the bitmap of each partial entry;
    per key block (dK/dV): the transpose, q_index, q_full, q_count, q_bitmap (Bm, Hm, nK, nQ);
    kv_full_adjacent, q_full_adjacent: whether every row's full entries are adjacent blocks.

(Bm, Hm) is (1 or batch, 1 or heads): a mask broadcasts over (batch, heads). Limits: the rule
is evaluated densely once, on the mask's device, in chunks of query rows (fine on a GPU up to
about 128k x 128k per (Bm, Hm)); the bitmaps cost block_size^2 bytes per partial tile.
"""
import math
from typing import NamedTuple

import torch

__all__ = ["BlockMask", "KernelView", "visit_lists", "full_blocks_adjacent", "causal", "sliding_window",
           "local_global", "document", "random_blocks", "from_function", "from_block_tensor"]

EMPTY, PARTIAL, FULL = 0, 1, 2
_CHUNK_ELEMENTS = 1 << 25  # rule elements evaluated at once while building


class KernelView(NamedTuple):
    """What the block-sparse kernels read of a ``BlockMask`` (``kernels.block_sparse``), and nothing
    else: the visit tables (tensors on the mask's device) and the layout (numbers). The eager path
    hands it to the launchers as it is; under torch.compile a custom op takes ``tables()`` and
    ``layout()`` (an op's arguments are tensors and ints) and ``from_args`` rebuilds it."""
    kv_count: torch.Tensor      # (Bm, Hm, nQ) int32: key blocks each query block visits
    kv_full: torch.Tensor       # (Bm, Hm, nQ) int32: how many of them (listed first) are full
    kv_index: torch.Tensor      # (Bm, Hm, nQ, nK) int32: the key blocks, full ones first
    kv_bitmap: torch.Tensor     # (Bm, Hm, nQ, nK) int32: a partial entry's bitmap in ``bitmaps``
    q_count: torch.Tensor       # (Bm, Hm, nK) ... the same per key block, for dK/dV
    q_full: torch.Tensor
    q_index: torch.Tensor       # (Bm, Hm, nK, nQ)
    q_bitmap: torch.Tensor
    bitmaps: torch.Tensor       # (n_bitmaps, block_size, block_size) uint8: partial tiles' patterns
    block_size: int
    band: tuple | None          # (lo, hi): partial tiles masked by arithmetic, not bitmaps
    kv_visits: int              # a power of two >= the mean visit count (an autotuning key)
    q_visits: int
    kv_full_adjacent: bool      # every row's full entries are adjacent key blocks
    q_full_adjacent: bool

    @property
    def shape(self):
        """(Bm, Hm, n_query_blocks, n_key_blocks)."""
        return tuple(self.kv_index.shape)

    @property
    def batch_heads(self):
        return self.shape[:2]

    def tables(self) -> list:
        return list(self[:9])

    def layout(self) -> list:
        lo, hi = (0, 0) if self.band is None else self.band
        return [int(x) for x in (self.block_size, self.band is not None, lo, hi, self.kv_visits,
                                 self.q_visits, self.kv_full_adjacent, self.q_full_adjacent)]

    @classmethod
    def from_args(cls, tables, layout) -> "KernelView":
        """The view that ``tables()`` and ``layout()`` came from."""
        block_size, banded, lo, hi, kv_visits, q_visits, kv_adjacent, q_adjacent = layout
        return cls(*tables, block_size, (lo, hi) if banded else None, kv_visits, q_visits,
                   bool(kv_adjacent), bool(q_adjacent))


class BlockMask:
    """A block-sparse attention pattern: the rule, its tiles' kinds and the kernels' tables.

    rule(q0, q1) -> bool tensor broadcastable to (Bm, Hm, q1 - q0, seqlen_k): True where query
    row q0 + r may attend key j. Build masks with this module's functions rather than by hand.
    band: None, or (lo, hi) when the rule is exactly "lo <= j - p <= hi" with p = i + seqlen_k -
    seqlen_q (query i placed bottom-right): the kernels then compute partial tiles' masks instead
    of loading bitmaps. Only this module's band builders set it.
    """

    def __init__(self, rule, seqlen_q, seqlen_k, *, block_size=128, batch_heads=(1, 1),
                 device=None, name="mask", band=None):
        if not (isinstance(block_size, int) and block_size >= 16 and block_size & (block_size - 1) == 0):
            raise ValueError(f"block_size must be a power of two >= 16, got {block_size!r}")
        for arg, n in (("seqlen_q", seqlen_q), ("seqlen_k", seqlen_k)):
            if not isinstance(n, int) or n < 1:
                raise ValueError(f"{arg} must be a positive int, got {n!r}")
        self.rule, self.seqlen_q, self.seqlen_k = rule, seqlen_q, seqlen_k
        self.block_size, self.batch_heads, self.name = block_size, tuple(batch_heads), name
        self.band = None if band is None else (int(band[0]), int(band[1]))
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.kinds, self.bitmaps, bitmap_id = self._classify()
        self.device = self.kinds.device          # with its index: "cuda" is built on "cuda:0"
        self.kv_index, self.kv_full, self.kv_count, self.kv_bitmap = visit_lists(self.kinds, bitmap_id)
        self.q_index, self.q_full, self.q_count, self.q_bitmap = visit_lists(
            self.kinds.transpose(-1, -2), bitmap_id.transpose(-1, -2))
        # bands, documents and all-full masks: the kernels step through such runs without the list
        self.kv_full_adjacent = full_blocks_adjacent(self.kv_index, self.kv_full)
        self.q_full_adjacent = full_blocks_adjacent(self.q_index, self.q_full)
        # the kernels autotune per power of two of the blocks a program visits on average: the
        # best tile for 3 blocks per query block is not the best for 100
        self.kv_visits = 1 << max(0, math.ceil(math.log2(max(1.0, float(self.kv_count.float().mean())))))
        self.q_visits = 1 << max(0, math.ceil(math.log2(max(1.0, float(self.q_count.float().mean())))))

    @property
    def shape(self):
        """(Bm, Hm, n_query_blocks, n_key_blocks)."""
        return tuple(self.kinds.shape)

    def kernel_view(self) -> KernelView:
        """What the kernels read of this mask (``KernelView``)."""
        return KernelView(self.kv_count, self.kv_full, self.kv_index, self.kv_bitmap, self.q_count,
                          self.q_full, self.q_index, self.q_bitmap, self.bitmaps, self.block_size,
                          self.band, self.kv_visits, self.q_visits, self.kv_full_adjacent,
                          self.q_full_adjacent)

    def _rows(self, q0, q1):
        Bm, Hm = self.batch_heads
        allowed = torch.as_tensor(self.rule(q0, q1), device=self.device)
        if allowed.dtype != torch.bool:
            raise TypeError(f"the rule of {self.name} returned {allowed.dtype}, expected bool")
        return allowed.broadcast_to(Bm, Hm, q1 - q0, self.seqlen_k)

    def _classify(self):
        """Tile kinds (Bm, Hm, nQ, nK) int8, bitmaps (n_partial, bs, bs) uint8, bitmap ids."""
        Bm, Hm = self.batch_heads
        bs, Nq, Nk = self.block_size, self.seqlen_q, self.seqlen_k
        nQ, nK = math.ceil(Nq / bs), math.ceil(Nk / bs)
        kinds = torch.empty(Bm, Hm, nQ, nK, dtype=torch.int8, device=self.device)
        bitmap_id = torch.full((Bm, Hm, nQ, nK), -1, dtype=torch.int32, device=self.device)
        bitmaps, n_bitmaps = [], 0
        step = max(1, _CHUNK_ELEMENTS // (Bm * Hm * bs * nK * bs))       # query blocks per chunk
        for qb0 in range(0, nQ, step):
            qb1 = min(nQ, qb0 + step)
            q0, q1 = qb0 * bs, min(Nq, qb1 * bs)
            tiles = torch.zeros(Bm, Hm, (qb1 - qb0) * bs, nK * bs, dtype=torch.bool, device=self.device)
            tiles[:, :, :q1 - q0, :Nk] = self._rows(q0, q1)
            tiles = tiles.view(Bm, Hm, qb1 - qb0, bs, nK, bs).transpose(3, 4)   # (Bm, Hm, q, nK, bs, bs)
            allowed = tiles.sum((-1, -2))                                       # (Bm, Hm, q, nK)
            rows = (torch.arange(qb0, qb1, device=self.device) * bs).neg().add(Nq).clamp(max=bs)
            full = allowed == (rows * bs)[:, None]                  # every valid row sees all bs keys
            chunk = torch.where(allowed == 0, EMPTY, torch.where(full, FULL, PARTIAL)).to(torch.int8)
            kinds[:, :, qb0:qb1] = chunk
            where = (chunk == PARTIAL).nonzero(as_tuple=True)
            n = where[0].numel()
            bitmap_id[:, :, qb0:qb1][where] = torch.arange(n_bitmaps, n_bitmaps + n, dtype=torch.int32,
                                                          device=self.device)
            bitmaps.append(tiles[where].to(torch.uint8))                       # (n, bs, bs)
            n_bitmaps += n
        if n_bitmaps == 0:  # kernels still need a valid pointer
            bitmaps.append(torch.zeros(1, bs, bs, dtype=torch.uint8, device=self.device))
        return kinds, torch.cat(bitmaps), bitmap_id

    def density(self) -> float:
        """Fraction of tiles that are not empty (the paper's s), over every (batch, head) slice."""
        return float((self.kinds != EMPTY).float().mean())

    def to_dense(self) -> torch.Tensor:
        """The element mask, (Bm, Hm, seqlen_q, seqlen_k) bool: for tests and small drawings."""
        return self._rows(0, self.seqlen_q).clone()

    def to(self, device) -> "BlockMask":
        """This mask with its tables on ``device`` (the kernels need them beside q, k, v)."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device == self.device:
            return self
        moved = object.__new__(BlockMask)
        moved.__dict__.update({k: (v.to(device) if isinstance(v, torch.Tensor) else v)
                               for k, v in self.__dict__.items()})
        moved.device = device
        return moved

    def __and__(self, other: "BlockMask") -> "BlockMask":
        """Both rules at once (e.g. a document mask and causal)."""
        if (self.seqlen_q, self.seqlen_k, self.block_size) != (other.seqlen_q, other.seqlen_k, other.block_size):
            raise ValueError(f"cannot combine {self!r} with {other!r}: seqlens and block_size must match")
        batch_heads = tuple(max(a, b) for a, b in zip(self.batch_heads, other.batch_heads))
        band = (None if self.band is None or other.band is None
                else (max(self.band[0], other.band[0]), min(self.band[1], other.band[1])))
        return BlockMask(lambda q0, q1: self._rows(q0, q1) & other._rows(q0, q1).to(self.device),
                         self.seqlen_q, self.seqlen_k, block_size=self.block_size,
                         batch_heads=batch_heads, device=self.device, name=f"{self.name} & {other.name}",
                         band=band)

    def to_string(self, batch=0, head=0, *, max_blocks=64) -> str:
        """ASCII drawing of one (batch, head) slice: rows are query blocks, columns key blocks.

        ``#`` full (no mask), ``+`` partial (masked element-wise), ``.`` empty (never loaded).
        """
        kinds = self.kinds[min(batch, self.shape[0] - 1), min(head, self.shape[1] - 1)].cpu()
        char = {EMPTY: ".", PARTIAL: "+", FULL: "#"}
        lines = ["".join(char[int(x)] for x in row[:max_blocks]) + (" ..." if len(row) > max_blocks else "")
                 for row in kinds[:max_blocks]]
        if kinds.shape[0] > max_blocks:
            lines.append("...")
        return "\n".join(lines)

    def plot(self, batch=0, head=0, *, ax=None, elements=False):
        """Draw the tiles (or, with ``elements=True``, the element mask) of one slice."""
        import matplotlib.pyplot as plt
        from matplotlib.colors import ListedColormap
        if ax is None:
            _, ax = plt.subplots(figsize=(4.5, 4.5))
        b, h = min(batch, self.shape[0] - 1), min(head, self.shape[1] - 1)
        if elements:
            ax.imshow(self.to_dense()[b, h].cpu(), cmap="Greys", interpolation="nearest")
            ax.set_xlabel("key j")
            ax.set_ylabel("query i")
        else:
            cmap = ListedColormap(["white", "#f4a261", "#264653"])
            ax.imshow(self.kinds[b, h].cpu(), cmap=cmap, vmin=0, vmax=2, interpolation="nearest")
            ax.set_xlabel(f"key block (size {self.block_size})")
            ax.set_ylabel("query block")
            from matplotlib.patches import Patch
            ax.legend(handles=[Patch(color=c, label=l) for c, l in
                               zip(cmap.colors, ("empty: skipped", "partial: masked", "full: no mask"))],
                      loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
        ax.set_title(f"{self.name}: density {self.density():.2f}")
        return ax

    def __repr__(self):
        return (f"BlockMask({self.name}, seqlen_q={self.seqlen_q}, seqlen_k={self.seqlen_k}, "
                f"block_size={self.block_size}, shape={self.shape}, density={self.density():.3f})")


def full_blocks_adjacent(index, n_full) -> bool:
    """Whether in every row of ``visit_lists``' tables the full entries are adjacent blocks."""
    steps = index[..., 1:] - index[..., :-1]                                    # (..., R, C - 1)
    between_full = torch.arange(steps.shape[-1], device=index.device) < n_full[..., None] - 1
    return bool(((steps == 1) | ~between_full).all())


def visit_lists(kinds, bitmap_id):
    """Per row of ``kinds`` (..., R, C): the columns to visit, full first, then partial, each
    group in ascending order. Returns (index, n_full, count, bitmap): index (..., R, C) int32
    (entries past count are the empty columns), n_full and count (..., R) int32, bitmap (..., R, C)
    the ``bitmap_id`` of each listed column (-1 for full ones)."""
    C = kinds.shape[-1]
    cols = torch.arange(C, device=kinds.device)
    rank = torch.where(kinds == FULL, 0, torch.where(kinds == PARTIAL, 1, 2))   # full, partial, empty
    order = torch.argsort(rank * C + cols, dim=-1)                              # stable by column
    index = order.to(torch.int32).contiguous()
    full = (kinds == FULL).sum(-1).to(torch.int32).contiguous()
    count = (kinds != EMPTY).sum(-1).to(torch.int32).contiguous()
    bitmap = torch.gather(bitmap_id, -1, order).contiguous()
    return index, full, count, bitmap


def _positions(q0, q1, seqlen_q, seqlen_k, device):
    """Query rows q0..q1 as (n, 1) and keys as (1, seqlen_k); queries placed bottom-right."""
    i = torch.arange(q0, q1, device=device)[:, None] + (seqlen_k - seqlen_q)
    j = torch.arange(seqlen_k, device=device)[None, :]
    return i, j


def causal(seqlen_q, seqlen_k, *, block_size=128, device=None) -> BlockMask:
    """Bottom-right causal: query i sees key j iff j <= i + seqlen_k - seqlen_q (2 x 4: ``xxx.`` ``xxxx``)."""
    def rule(q0, q1):
        i, j = _positions(q0, q1, seqlen_q, seqlen_k, device)
        return j <= i
    return BlockMask(rule, seqlen_q, seqlen_k, block_size=block_size, device=device, name="causal",
                     band=(-(seqlen_q + seqlen_k), 0))


def sliding_window(seqlen_q, seqlen_k, window, *, causal=True, block_size=128, device=None) -> BlockMask:
    """Each query sees the ``window`` keys ending at its own position (bottom-right aligned).

    causal=True: keys p - window < j <= p, where p = i + seqlen_k - seqlen_q (Mistral-style).
    causal=False: keys |j - p| < window, centred (Longformer-style local attention).
    window=3, causal::  x . . . .      window=2, not causal::  x x . . .
                        x x . . .                              x x x . .
                        x x x . .                              . x x x .
                        . x x x .
    """
    return BlockMask(_window_rule(window, causal, seqlen_q, seqlen_k, device), seqlen_q, seqlen_k,
                     block_size=block_size, device=device,
                     name=f"sliding window {window}{' causal' if causal else ''}",
                     band=(1 - window, 0 if causal else window - 1))


def _window_rule(window, causal, seqlen_q, seqlen_k, device):
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int, got {window!r}")

    def rule(q0, q1):
        i, j = _positions(q0, q1, seqlen_q, seqlen_k, device)
        return ((j <= i) & (j > i - window)) if causal else ((j - i).abs() < window)
    return rule


def local_global(seqlen_q, seqlen_k, window, n_global, *, causal=False, block_size=128,
                 device=None) -> BlockMask:
    """Sliding window plus ``n_global`` global tokens (Longformer / BigBird): the first
    n_global keys are seen by every query, and the first n_global queries see every key
    (with ``causal``, only keys not in their future)."""
    if not isinstance(n_global, int) or n_global < 0:
        raise ValueError(f"n_global must be a non-negative int, got {n_global!r}")
    local = _window_rule(window, causal, seqlen_q, seqlen_k, device)

    def rule(q0, q1):
        i, j = _positions(q0, q1, seqlen_q, seqlen_k, device)
        rows = torch.arange(q0, q1, device=device)[:, None]
        seen = local(q0, q1) | (j < n_global) | (rows < n_global)
        return seen & (j <= i) if causal else seen
    return BlockMask(rule, seqlen_q, seqlen_k, block_size=block_size, device=device,
                     name=f"local {window} + global {n_global}")


def document(doc_ids_q, doc_ids_k=None, *, causal=True, block_size=128) -> BlockMask:
    """Packed sequences: query i sees key j iff both belong to the same document.

    doc_ids_q: int tensor (seqlen_q,) or (batch, seqlen_q), the document of each query position
    (e.g. ``[0, 0, 0, 1, 1, 2, ...]``); doc_ids_k: the same for keys (default: doc_ids_q).
    causal: also bottom-right causal (the usual case for packed training sequences).
    """
    doc_ids_k = doc_ids_q if doc_ids_k is None else doc_ids_k
    for name, ids in (("doc_ids_q", doc_ids_q), ("doc_ids_k", doc_ids_k)):
        if not isinstance(ids, torch.Tensor) or ids.dtype.is_floating_point or ids.ndim not in (1, 2):
            raise TypeError(f"{name} must be an int tensor of shape (seqlen,) or (batch, seqlen)")
    dq, dk = doc_ids_q.reshape(-1, doc_ids_q.shape[-1]), doc_ids_k.reshape(-1, doc_ids_k.shape[-1])
    if dq.shape[0] != dk.shape[0]:
        raise ValueError(f"doc_ids_q has batch {dq.shape[0]} but doc_ids_k has {dk.shape[0]}")
    Nq, Nk = dq.shape[1], dk.shape[1]

    def rule(q0, q1):
        same = dq[:, q0:q1, None] == dk[:, None, :]                       # (Bm, n, Nk)
        if causal:
            i, j = _positions(q0, q1, Nq, Nk, dq.device)
            same = same & (j <= i)
        return same[:, None]                                              # (Bm, 1, n, Nk)
    return BlockMask(rule, Nq, Nk, block_size=block_size, batch_heads=(dq.shape[0], 1),
                     device=dq.device, name=f"document{' causal' if causal else ''}")


def from_block_tensor(block_mask, seqlen_q, seqlen_k, *, block_size=128, causal=False) -> BlockMask:
    """A bool tensor (..., ceil(seqlen_q/bs), ceil(seqlen_k/bs)) broadcasting over (batch, heads):
    query i may attend key j iff ``block_mask[..., i // bs, j // bs]`` (and the causal rule)."""
    if not isinstance(block_mask, torch.Tensor) or block_mask.dtype != torch.bool:
        raise TypeError(f"block_mask must be a bool tensor or a flashlib.masks.BlockMask, got "
                        f"{getattr(block_mask, 'dtype', type(block_mask).__name__)}")
    want = (math.ceil(seqlen_q / block_size), math.ceil(seqlen_k / block_size))
    if block_mask.ndim < 2 or block_mask.ndim > 4 or tuple(block_mask.shape[-2:]) != want:
        raise ValueError(f"block_mask has shape {tuple(block_mask.shape)}; expected (..., {want[0]}, "
                         f"{want[1]}) for seqlen_q={seqlen_q}, seqlen_k={seqlen_k}, block_size={block_size}")
    blocks = block_mask.reshape((1,) * (4 - block_mask.ndim) + tuple(block_mask.shape))  # (Bm, Hm, nQ, nK)
    cols = torch.arange(seqlen_k, device=blocks.device) // block_size

    def rule(q0, q1):
        rows = torch.arange(q0, q1, device=blocks.device) // block_size
        allowed = blocks[:, :, rows][..., cols]                              # (Bm, Hm, n, Nk)
        if causal:
            i, j = _positions(q0, q1, seqlen_q, seqlen_k, blocks.device)
            allowed = allowed & (j <= i)
        return allowed
    return BlockMask(rule, seqlen_q, seqlen_k, block_size=block_size, batch_heads=blocks.shape[:2],
                     device=blocks.device, name=f"block tensor{' causal' if causal else ''}")


def random_blocks(seqlen_q, seqlen_k, density, *, block_size=128, batch=1, heads=1, seed=0,
                  device=None) -> BlockMask:
    """``round(density * nQ * nK)`` blocks per (batch, head) slice, chosen at random (seeded)."""
    if not 0.0 < density <= 1.0:
        raise ValueError(f"density must be in (0, 1], got {density!r}")
    nQ, nK = math.ceil(seqlen_q / block_size), math.ceil(seqlen_k / block_size)
    g = torch.Generator().manual_seed(seed)
    keep = max(1, round(density * nQ * nK))
    scores = torch.rand(batch, heads, nQ * nK, generator=g)
    chosen = torch.zeros(batch, heads, nQ * nK, dtype=torch.bool)
    chosen.scatter_(-1, scores.topk(keep, dim=-1).indices, True)
    mask = from_block_tensor(chosen.view(batch, heads, nQ, nK).to(device), seqlen_q, seqlen_k,
                             block_size=block_size)
    mask.name = f"random {density:g}"
    return mask


def from_function(fn, seqlen_q, seqlen_k, *, block_size=128, device=None, name="function") -> BlockMask:
    """A rule given as ``fn(q_idx, k_idx) -> bool tensor``, on broadcast index tensors
    q_idx (n, 1) and k_idx (1, seqlen_k) (plain row/column indices, no bottom-right shift);
    e.g. ``from_function(lambda i, j: (i - j).abs() % 7 == 0, 300, 300)``."""
    def rule(q0, q1):
        i = torch.arange(q0, q1, device=device)[:, None]
        j = torch.arange(seqlen_k, device=device)[None, :]
        return fn(i, j)
    return BlockMask(rule, seqlen_q, seqlen_k, block_size=block_size, device=device, name=name)
