"""Decoding with a KV cache: ``flash_decode`` (checks, then the Flash-Decoding kernels of
``flashlib.kernels.decode``) and ``KVCache``, a preallocated cache that appends and attends.

Follows the Flash-Decoding post (Dao, Haziza, Massa and Sizov, 2023): split the cache into chunks,
attend to each chunk in parallel, merge the partial results by their lse (lesson 03's merge).
The layers are those of ``flashlib.ops``: kernels -> launcher (``flash_decode_forward``) ->
``flash_decode`` (checks, keyword-only options, this docstring).

Limits: inference only (no gradient); a few new tokens per step (any number works, but more
than 64 query rows per K/V head re-read the cache once per 64 rows: use ``flash_attention``
for a prefill); ``cache_seqlens`` values are checked on the host only for CPU tensors (on a GPU
that would cost a device sync per step; the kernel clamps them to [0, Lmax] instead). Each call
costs host time (these checks, a few allocations and one Triton launch, the merge being fused
into the split-KV kernel): at short caches it can exceed the GPU time, which CUDA graphs (or
fewer, larger steps) hide; see benchmarks/probes/NOTES.md.
"""
import numbers
from typing import Optional

import torch

from . import runtime
from .inputs import SUPPORTED_DTYPES, check_inputs, check_score_mods, read_once
from .kernels import score_mod
from .kernels.decode import flash_decode_forward
from .kernels.score_mod import Modifiers


def check_decode_inputs(q, k_cache, v_cache, *, cache_seqlens=None, num_splits=None, scale=None,
                        block_table=None, check_table=True):
    """Validate ``flash_decode``'s arguments; return the resolved scale. Errors name the argument.
    check_table=False: the block table's entries are trusted (a ``PagedKVCache`` built it)."""
    if block_table is not None:
        Lmax = check_pages(q, k_cache, v_cache, cache_seqlens, block_table, check_table)
        # the SDPA-layout checks (dtypes, devices, heads, headdim), the pages' first dim aside
        scale = check_inputs(q, k_cache, v_cache, scale=scale, paged=True)
    else:
        scale = check_inputs(q, k_cache, v_cache, scale=scale)
        Lmax = k_cache.shape[2]
    B = q.shape[0]
    if cache_seqlens is not None:
        if not isinstance(cache_seqlens, torch.Tensor):
            raise TypeError(f"cache_seqlens must be a torch.Tensor of ints or None, got "
                            f"{type(cache_seqlens).__name__}")
        if cache_seqlens.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"cache_seqlens has dtype {cache_seqlens.dtype}; expected torch.int32 "
                            "or torch.int64")
        if tuple(cache_seqlens.shape) != (B,):
            raise ValueError(f"cache_seqlens must have shape ({B},), one length per sequence, got "
                             f"{tuple(cache_seqlens.shape)}")
        if cache_seqlens.device != q.device:
            raise ValueError(f"cache_seqlens is on {cache_seqlens.device} but q is on {q.device}")
        if cache_seqlens.device.type == "cpu" and B > 0:
            lo, hi = int(cache_seqlens.min()), int(cache_seqlens.max())
            if lo < 0 or hi > Lmax:
                raise ValueError(f"cache_seqlens must lie in [0, {Lmax}] (the caches' length), "
                                 f"got values from {lo} to {hi}")
    if num_splits is not None:
        if isinstance(num_splits, bool) or not isinstance(num_splits, numbers.Integral):
            raise TypeError(f"num_splits must be a positive int or None, got {num_splits!r}")
        if num_splits < 1:
            raise ValueError(f"num_splits must be a positive int or None, got {num_splits!r}")
    return scale


def _table_range(block_table):
    """(smallest, largest) entry of the table: one read, one sync."""
    return torch.stack(torch.aminmax(block_table)).tolist()


def check_pages(q, k_cache, v_cache, cache_seqlens, block_table, check_table=True):
    """Validate a paged cache: pages (num_pages, Hkv, page_size, D) with page_size a power of two
    >= 16, an int32 block table (B, max_pages) on q's device whose entries are pages that exist,
    and ``cache_seqlens``, which paging requires. Returns Lmax = max_pages x page_size. The table's
    entries are read on the host (a device sync on a GPU, once per version of the table:
    ``inputs.read_once``) unless ``check_table`` is False."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache),
                    ("block_table", block_table)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.ndim != 4:
        raise ValueError(f"q must have 4 dims (batch, heads, n_new, headdim), got {tuple(q.shape)}")
    B = q.shape[0]
    if block_table.dtype != torch.int32 or block_table.ndim != 2 or block_table.shape[0] != B:
        raise TypeError(f"block_table must be an int32 tensor of shape ({B}, max_pages), got "
                        f"{block_table.dtype} of shape {tuple(block_table.shape)}")
    if block_table.device != q.device:
        raise ValueError(f"block_table is on {block_table.device} but q is on {q.device}")
    if cache_seqlens is None:
        raise ValueError("cache_seqlens is required with block_table: the pages do not say how "
                         "many positions of each sequence are valid")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.ndim != 4:
            raise ValueError(f"{name} must be pages of shape (num_pages, heads_kv, page_size, "
                             f"headdim) with block_table, got {getattr(t, 'shape', t)!r}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ")
    num_pages, page_size = k_cache.shape[0], k_cache.shape[2]
    if num_pages == 0:
        raise ValueError("k_cache and v_cache hold no pages")
    if page_size < 16 or page_size & (page_size - 1):
        raise ValueError(f"page_size (k_cache.shape[2]) must be a power of two >= 16, got {page_size}")
    if check_table and block_table.numel() and not torch.compiler.is_compiling():
        lo, hi = read_once(block_table, _table_range)
        if lo < 0 or hi >= num_pages:
            raise ValueError(f"block_table holds page {lo if lo < 0 else hi}, but the caches have "
                             f"pages 0 to {num_pages - 1}")
    return block_table.shape[1] * page_size


def flash_decode(q, k_cache, v_cache, *, cache_seqlens=None, block_table=None, num_splits=None,
                 scale=None, softcap=None, alibi_slopes=None, return_lse=False, kernel_options=None):
    """Attention of a few new query tokens over a KV cache, with Flash-Decoding's split-KV kernels.

    q: (batch, heads_q, n_new, headdim), n_new small (1 for plain decoding, a few for
    speculative decoding). k_cache, v_cache: (batch, heads_kv, max_len, headdim), heads_q %
    heads_kv == 0 (the query heads of a group share one K/V read). cache_seqlens: (batch,)
    int32/int64 tensor on q's device, the valid length L of each sequence (a ragged batch); None
    means all max_len. The new tokens are the last n_new of those L positions and attend
    bottom-right causally: new token i sees cache position j iff j <= i + L - n_new.
    block_table: int32 (batch, max_pages) or None. With it the caches are pages (num_pages,
    heads_kv, page_size, headdim), page_size a power of two >= 16 (vLLM's PagedAttention layout):
    position p of sequence b is row p % page_size of page block_table[b, p // page_size], pages
    in any order and shared between sequences; max_len is max_pages x page_size; cache_seqlens is
    required, and the table's entries are checked to be pages (read on the host: a device sync
    on a GPU, once per version of the table; ``PagedKVCache`` skips it for the tables it built).
    num_splits: chunks each sequence's keys are split into (None: picked from the GPU's SM count,
    the batch, heads and max_len); any value gives the same result up to rounding.
    scale: multiplies q k^T; defaults to 1/sqrt(headdim). softcap, alibi_slopes: score modifiers
    as in ``flash_attention``; ALiBi's distance is from the new token's position, i + L - n_new,
    to the key's. float16, bfloat16, float32 (exact dots);
    head dims up to 256; CUDA tensors, or CPU tensors through Triton's interpreter.
    Returns out (like q) or (out, lse) with lse (batch, heads_q, n_new) float32, natural log. A
    row with nothing to attend to (L = 0, or n_new > L) gets out 0 and lse -inf. No gradient.
    kernel_options: as ``flash_attention``'s.
    """
    return decode_attention(q, k_cache, v_cache, cache_seqlens=cache_seqlens, block_table=block_table,
                            num_splits=num_splits, scale=scale, softcap=softcap, alibi_slopes=alibi_slopes,
                            return_lse=return_lse, kernel_options=kernel_options)


def decode_attention(q, k_cache, v_cache, *, cache_seqlens=None, block_table=None, num_splits=None,
                     scale=None, softcap=None, alibi_slopes=None, return_lse=False, kernel_options=None,
                     check_table=True, host_lengths=None, append=None):
    """``flash_decode``, with ``check_table=False`` trusting ``block_table``'s entries instead of
    reading them back (the tables a ``PagedKVCache`` built: no device sync per step), and
    ``host_lengths``, a list of the ints ``cache_seqlens`` holds, as a cache keeps them on the
    host: the split count is sized for them rather than for a full, ragged cache (no device read;
    a wrong list costs speed, not correctness: the kernel reads the lengths it splits), and
    ``append``, ``KVCache.attend``'s (k_new, v_new, lengths out) to write in the same launch (the
    kernels' ``_launch``; not under torch.compile)."""
    options = runtime.options(kernel_options)
    scale = check_decode_inputs(q, k_cache, v_cache, cache_seqlens=cache_seqlens,
                                num_splits=num_splits, scale=scale, block_table=block_table,
                                check_table=check_table)
    mods = check_score_mods(q, softcap=softcap, alibi_slopes=alibi_slopes)
    longest = ragged = None
    if host_lengths:
        longest, ragged = max(host_lengths), min(host_lengths) != max(host_lengths)
    if torch.compiler.is_compiling():
        out, lse = _flash_decode_op(q, k_cache, v_cache, cache_seqlens, num_splits, scale, *mods.op_args(),
                                    options.op_args(), block_table)
    else:
        out, lse = flash_decode_forward(q, k_cache, v_cache, cache_seqlens, num_splits=num_splits,
                                        scale=scale, return_lse=return_lse, block_table=block_table,
                                        score_mod=score_mod.make(q, mods), options=options,
                                        longest=longest, ragged=ragged, append=append)
    return (out, lse) if return_lse else out


# Under torch.compile the launcher (its scratch pool, lock and memo) is opaque to the compiler as
# this op (runtime.define_op), as flash_attention's are (flashlib/ops.py): no graph break, and
# mode="reduce-overhead" can replay decoding steps from CUDA graphs.
def _flash_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  cache_seqlens: Optional[torch.Tensor], num_splits: Optional[int],
                  scale: float, mod_floats: list[float], mod_tensors: list[Optional[torch.Tensor]],
                  options: list[int], block_table: Optional[torch.Tensor] = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    return flash_decode_forward(q, k_cache, v_cache, cache_seqlens, num_splits=num_splits,
                                scale=scale, return_lse=True, cached_scratch=False,
                                score_mod=score_mod.make(q, Modifiers.from_op_args(mod_floats, mod_tensors)),
                                block_table=block_table, options=runtime.from_op_args(options))


def _flash_decode_fake(q, *args, **kwargs):
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)


_flash_decode_op = runtime.define_op("flash_decode", _flash_decode, _flash_decode_fake)


class KVCache:
    """A preallocated KV cache for one attention layer: k, v (batch, heads_kv, max_len, headdim)
    and each sequence's length, kept both on the host (to check for room and to size the split
    count without a device sync) and on the device (``seqlens``, what the kernels read)::

        cache = KVCache(batch=1, heads_kv=8, max_len=4096, headdim=128, dtype=torch.float16)
        cache.append(k_prompt, v_prompt)           # (1, 8, n_prompt, 128) after the prefill
        for step in range(n_steps):
            cache.append(k_new, v_new)             # the new token's key and value first,
            out = cache.attend(q_new)              # then its query: (1, Hq, 1, 128)
            # or both at once: out = cache.attend(q_new, k_new, v_new)

    ``append`` adds the same number of tokens to every sequence; ``lengths`` may start ragged.
    ``seqlens`` is replaced by another tensor when ``attend`` appends in its launch: read it from
    the cache, do not keep it.
    """

    def __init__(self, batch, heads_kv, max_len, headdim, *, dtype=torch.float16, device=None,
                 lengths=None):
        if dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"dtype must be float16, bfloat16 or float32, got {dtype}")
        for name, n in (("batch", batch), ("heads_kv", heads_kv), ("max_len", max_len),
                        ("headdim", headdim)):
            if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
                raise ValueError(f"{name} must be a positive int, got {n!r}")
        device = runtime.DEVICE if device is None else torch.device(device)
        self.k = torch.zeros(batch, heads_kv, max_len, headdim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        host = (torch.zeros(batch, dtype=torch.int64) if lengths is None
                else torch.as_tensor(lengths, dtype=torch.int64).cpu().clone())
        if tuple(host.shape) != (batch,) or host.min() < 0 or host.max() > max_len:
            raise ValueError(f"lengths must be {batch} ints in [0, {max_len}], got {lengths!r}")
        self._lengths = host.tolist()   # host copy, plain ints: checks and split counts, no sync
        self.seqlens = host.to(device=device, dtype=torch.int32)  # device copy: the kernels'
        self._next_seqlens = None       # where an appending launch writes the lengths (attend)

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    @property
    def lengths(self) -> list:
        """Valid positions per sequence (a list of ints, from the host copy)."""
        return list(self._lengths)

    def _room_for(self, k_new, v_new):
        """n, the tokens k_new, v_new (batch, heads_kv, n, headdim) add to each sequence, after
        checking them and that every sequence has room for them."""
        B, Hkv, _, D = self.k.shape
        n = _check_appended(k_new, v_new, B, Hkv, D, self.k)
        longest = max(self._lengths)
        if longest + n > self.max_len:
            raise ValueError(f"the cache is full: sequence {self._lengths.index(longest)} holds {longest} "
                             f"of {self.max_len} positions, no room for {n} more")
        return n

    def append(self, k_new, v_new):
        """Write k_new, v_new (batch, heads_kv, n, headdim) after each sequence's last position."""
        n = self._room_for(k_new, v_new)
        starts = self._lengths
        if min(starts) == max(starts):
            self.k[:, :, starts[0]:starts[0] + n] = k_new
            self.v[:, :, starts[0]:starts[0] + n] = v_new
        else:
            for b, start in enumerate(starts):
                self.k[b, :, start:start + n] = k_new[b]
                self.v[b, :, start:start + n] = v_new[b]
        self._lengths = [start + n for start in starts]
        self.seqlens += n

    def attend(self, q, k_new=None, v_new=None, **kwargs):
        """``flash_decode(q, k, v, cache_seqlens=seqlens, **kwargs)``. The split count comes from
        the lengths in the cache (the host copy), not its capacity.

        k_new, v_new (batch, heads_kv, n, headdim), n q's new tokens: ``append`` them first. With
        the kernel options' ``decode_append`` on (and outside torch.compile) the decoding launch
        writes them itself (flash-attn's ``flash_attn_with_kvcache(k=, v=)``): one launch a step
        instead of four (two cache writes and the lengths' increment besides it)."""
        if k_new is None and v_new is None:
            return decode_attention(q, self.k, self.v, cache_seqlens=self.seqlens,
                                    host_lengths=self._lengths, **kwargs)
        if not runtime.options(kwargs.get("kernel_options")).decode_append or torch.compiler.is_compiling():
            self.append(k_new, v_new)
            return self.attend(q, **kwargs)
        n = self._room_for(k_new, v_new)
        if not isinstance(q, torch.Tensor) or q.ndim != 4 or q.shape[2] != n:
            raise ValueError(f"q must have the {n} new tokens of k_new and v_new on dim 2, got "
                             f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")
        if self._next_seqlens is None:
            self._next_seqlens = torch.empty_like(self.seqlens)
        lengths = [start + n for start in self._lengths]
        out = decode_attention(q, self.k, self.v, cache_seqlens=self.seqlens, host_lengths=lengths,
                               append=(k_new, v_new, self._next_seqlens), **kwargs)
        self.seqlens, self._next_seqlens = self._next_seqlens, self.seqlens
        self._lengths = lengths
        return out

    def reset(self):
        """Forget every sequence (lengths back to 0); the memory stays allocated."""
        self._lengths = [0] * len(self._lengths)
        self.seqlens.zero_()


def _check_appended(k_new, v_new, B, Hkv, D, like):
    """Validate a cache append's k_new, v_new (B, Hkv, n, D) in ``like``'s dtype and device; n."""
    for name, t in (("k_new", k_new), ("v_new", v_new)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim != 4 or t.shape[0] != B or t.shape[1] != Hkv or t.shape[3] != D:
            raise ValueError(f"{name} must have shape ({B}, {Hkv}, n, {D}), got {tuple(t.shape)}")
        if t.dtype != like.dtype or t.device != like.device:
            raise TypeError(f"{name} is {t.dtype} on {t.device}; the cache holds "
                            f"{like.dtype} on {like.device}")
    if k_new.shape != v_new.shape:
        raise ValueError(f"k_new {tuple(k_new.shape)} and v_new {tuple(v_new.shape)} differ")
    return k_new.shape[2]


class PagedKVCache:
    """A paged KV cache for one attention layer (vLLM's PagedAttention layout): a pool of pages k,
    v (num_pages, heads_kv, page_size, headdim) shared by the batch, a block table (batch,
    max_pages) saying which page holds each sequence's positions, and each sequence's length::

        cache = PagedKVCache(batch=8, heads_kv=8, max_len=32768, headdim=128, page_size=64,
                             num_pages=2048, dtype=torch.float16)   # 1/2 of 8 full sequences
        cache.append(k_new, v_new)       # a sequence takes a free page when it needs one
        out = cache.attend(q_new)        # flash_decode(..., block_table=cache.block_table)
        cache.release(3)                 # sequence 3 is done: its pages go back to the pool

    Memory follows the tokens held, not batch x max_len: sequences of different lengths share
    the pool, and ``release`` frees a finished sequence's pages for the others.
    """

    def __init__(self, batch, heads_kv, max_len, headdim, *, page_size=64, num_pages=None,
                 dtype=torch.float16, device=None):
        if dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"dtype must be float16, bfloat16 or float32, got {dtype}")
        for name, n in (("batch", batch), ("heads_kv", heads_kv), ("max_len", max_len),
                        ("headdim", headdim), ("page_size", page_size)):
            if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
                raise ValueError(f"{name} must be a positive int, got {n!r}")
        if page_size < 16 or page_size & (page_size - 1):
            raise ValueError(f"page_size must be a power of two >= 16, got {page_size}")
        max_pages = -(-max_len // page_size)
        num_pages = batch * max_pages if num_pages is None else num_pages
        if isinstance(num_pages, bool) or not isinstance(num_pages, numbers.Integral) or num_pages < 1:
            raise ValueError(f"num_pages must be a positive int, got {num_pages!r}")
        device = runtime.DEVICE if device is None else torch.device(device)
        self.k = torch.zeros(num_pages, heads_kv, page_size, headdim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self._table = torch.zeros(batch, max_pages, dtype=torch.int32)     # host copy
        self.block_table = self._table.to(device)                         # the kernels'
        self._lengths = [0] * batch                                       # host copy, as KVCache's
        self.seqlens = torch.zeros(batch, dtype=torch.int32, device=device)
        self._free = list(range(num_pages - 1, -1, -1))                   # pop() takes page 0 first

    @property
    def page_size(self) -> int:
        return self.k.shape[2]

    @property
    def max_len(self) -> int:
        return self._table.shape[1] * self.page_size

    @property
    def lengths(self) -> list:
        return list(self._lengths)

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def append(self, k_new, v_new):
        """Write k_new, v_new (batch, heads_kv, n, headdim) after each sequence's last position,
        taking pages from the pool as sequences cross into new ones."""
        B, Hkv, P, D = self._table.shape[0], self.k.shape[1], self.page_size, self.k.shape[3]
        n = _check_appended(k_new, v_new, B, Hkv, D, self.k)
        starts = self._lengths
        if max(starts) + n > self.max_len:
            b = starts.index(max(starts))
            raise ValueError(f"sequence {b} holds {starts[b]} of {self.max_len} positions, no room "
                             f"for {n} more")
        needed = [-(-(s + n) // P) - -(-s // P) for s in starts]          # new pages per sequence
        if sum(needed) > len(self._free):
            raise ValueError(f"the pool is out of pages: {sum(needed)} needed, {len(self._free)} "
                             "free (release finished sequences, or allocate more num_pages)")
        # Host ints and slices only: an index tensor built here would be copied to the device,
        # and a copy from pageable host memory waits for the GPU to drain (a sync per step).
        for b, start in enumerate(starts):
            for slot in range(-(-start // P), -(-start // P) + needed[b]):
                page = self._free.pop()
                self._table[b, slot] = page
                self.block_table[b, slot] = page                          # a fill on the device
            pos = start
            while pos < start + n:                                        # page by page
                page, row = int(self._table[b, pos // P]), pos % P
                rows = min(P - row, start + n - pos)
                new = slice(pos - start, pos - start + rows)
                self.k[page, :, row:row + rows] = k_new[b, :, new]        # (Hkv, rows, D)
                self.v[page, :, row:row + rows] = v_new[b, :, new]
                pos += rows
        self._lengths = [start + n for start in starts]
        self.seqlens += n

    def attend(self, q, k_new=None, v_new=None, **kwargs):
        """``flash_decode(q, k, v, cache_seqlens=seqlens, block_table=block_table, **kwargs)``;
        the table is the cache's own, so its entries are not read back to be checked, and the
        split count comes from the lengths in the cache (the host copy), as ``KVCache.attend``'s.
        k_new, v_new: ``append`` them first (a launch of their own: pages are written on the host's
        plan of which page each position is in)."""
        if k_new is not None or v_new is not None:
            self.append(k_new, v_new)
        known = {"num_splits", "scale", "softcap", "alibi_slopes", "return_lse", "kernel_options"}
        unknown = set(kwargs) - known
        if unknown:
            raise TypeError(f"attend() got unexpected keyword arguments {sorted(unknown)}")
        return decode_attention(q, self.k, self.v, cache_seqlens=self.seqlens,
                                block_table=self.block_table, check_table=False,
                                host_lengths=self._lengths, **kwargs)

    def release(self, b):
        """Sequence ``b`` is finished: its pages go back to the pool and its length to 0."""
        used = -(-self._lengths[b] // self.page_size)
        self._free += self._table[b, :used].tolist()
        self._table[b] = 0
        self.block_table[b] = 0
        self._lengths[b] = 0
        self.seqlens[b] = 0

    def reset(self):
        """Every sequence finished: all pages back in the pool."""
        for b in range(self._table.shape[0]):
            self.release(b)
