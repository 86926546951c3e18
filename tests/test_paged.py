"""Paged KV caches: flash_decode(block_table=...) and PagedKVCache against contiguous caches.

The pages are scattered out of order (and the pool holds pages no sequence uses): each sequence's
result must be attention over its own positions, checked against the float64 oracle on the
gathered cache, and equal to the contiguous kernel's on the same values. PagedKVCache must hold
what KVCache holds while taking pages only as sequences grow, and give them back on release.
"""
import pytest
import torch

from flashlib import KVCache, PagedKVCache, flash_decode, runtime
from flashlib.kernels import config, decode as kernels
from flashlib.testing import assert_attention_close

DEV = runtime.DEVICE
gpu = pytest.mark.skipif(DEV.type != "cuda", reason="needs a CUDA GPU")


def scattered(k, v, page_size, num_pages, seed=0):
    """k, v (B, Hkv, max_pages * page_size, D) cut into pages placed at random in a pool of
    ``num_pages``; returns the pools and the int32 block table (B, max_pages)."""
    B, Hkv, L, D = k.shape
    max_pages = L // page_size
    g = torch.Generator().manual_seed(seed)
    table = torch.randperm(num_pages, generator=g)[:B * max_pages].reshape(B, max_pages)
    pools = []
    for t in (k, v):
        pool = torch.randn(num_pages, Hkv, page_size, D, dtype=t.dtype, device=t.device)
        pool[table.reshape(-1).to(t.device)] = t.reshape(B, Hkv, max_pages, page_size, D) \
            .transpose(1, 2).reshape(-1, Hkv, page_size, D)
        pools.append(pool)
    return *pools, table.to(dtype=torch.int32, device=k.device)


@pytest.mark.parametrize("ids_ahead", [False, True])   # True: a one-wave grid loads its page ids a tile ahead
@pytest.mark.parametrize("Nq", [1, 3])
@pytest.mark.parametrize("page_size", [16, 32, 64])   # smaller than, as long as, longer than a tile
def test_pages_out_of_order_match_the_contiguous_cache(Nq, page_size, ids_ahead):
    B, Hq, Hkv, D, max_pages = 3, 6, 2, 24, 5
    q = torch.randn(B, Hq, Nq, D, device=DEV)
    k, v = (torch.randn(B, Hkv, max_pages * page_size, D, device=DEV) for _ in range(2))
    lens = torch.tensor([max_pages * page_size, 33, 2], device=DEV)
    k_pages, v_pages, table = scattered(k, v, page_size, num_pages=4 * B * max_pages)
    out, lse = flash_decode(q, k_pages, v_pages, cache_seqlens=lens, block_table=table,
                            num_splits=3, return_lse=True,
                            kernel_options={"decode_page_ids_ahead": ids_ahead})
    for b, L in enumerate(lens.tolist()):
        sl = slice(b, b + 1)
        assert_attention_close(out[sl], lse[sl], q[sl], k[sl, :, :L], v[sl, :, :L], causal=True,
                               name=f"sequence {b} (L={L})")
    # bit for bit under the key tile the paged plan picked (short pages on one wave take their own)
    tile = kernels.launch_plan(q, k_pages, lens, num_splits=3, block_table=table)[2]
    contiguous = kernels.flash_decode_forward(q, k, v, lens, num_splits=3, config=tile)
    assert torch.equal(out, contiguous[0]) and torch.equal(lse, contiguous[1])


@pytest.mark.parametrize("ids_ahead", [False, True])
def test_pages_shared_between_sequences_and_score_modifiers(ids_ahead):
    # two sequences with one common prefix page (a shared system prompt), softcap and ALiBi
    D, P = 16, 16
    pool_k, pool_v = (torch.randn(6, 2, P, D, device=DEV) for _ in range(2))
    table = torch.tensor([[4, 0, 2], [4, 5, 1]], dtype=torch.int32, device=DEV)
    lens = torch.tensor([40, 35], device=DEV)
    q = torch.randn(2, 4, 1, D, device=DEV)
    slopes = torch.rand(2, 4, device=DEV)
    out, lse = flash_decode(q, pool_k, pool_v, cache_seqlens=lens, block_table=table,
                            softcap=5.0, alibi_slopes=slopes, return_lse=True,
                            kernel_options={"decode_page_ids_ahead": ids_ahead})
    for b, L in enumerate(lens.tolist()):
        k = pool_k[table[b].long()].transpose(0, 1).reshape(1, 2, -1, D)[:, :, :L]
        v = pool_v[table[b].long()].transpose(0, 1).reshape(1, 2, -1, D)[:, :, :L]
        assert_attention_close(out[b:b + 1], lse[b:b + 1], q[b:b + 1], k, v, causal=True,
                               softcap=5.0, alibi_slopes=slopes[b], name=f"sequence {b}")


def test_paged_cache_holds_what_the_contiguous_one_holds():
    B, Hkv, Hq, D = 2, 2, 4, 16
    paged = PagedKVCache(B, Hkv, 100, D, page_size=16, num_pages=10, dtype=torch.float32, device=DEV)
    flat = KVCache(B, Hkv, 100, D, dtype=torch.float32, device=DEV)
    assert paged.free_pages == 10
    for n in (20, 1, 1, 13):                       # a prompt, two steps, a chunk: 35 positions
        k_new, v_new = (torch.randn(B, Hkv, n, D, device=DEV) for _ in range(2))
        paged.append(k_new, v_new)
        flat.append(k_new, v_new)
        q = torch.randn(B, Hq, 1, D, device=DEV)
        # bit for bit, at the split count and key tile the paged call picks (its heuristic may
        # split more; short pages on one wave take their own tile)
        _, _, tile, splits = kernels.launch_plan(q, paged.k, paged.seqlens, block_table=paged.block_table,
                                                 longest=max(paged.lengths), ragged=False)
        expected, _ = kernels.flash_decode_forward(q, flat.k, flat.v, flat.seqlens, num_splits=splits, config=tile)
        assert torch.equal(paged.attend(q), expected)
    assert paged.lengths == [35, 35] and paged.free_pages == 10 - 2 * 3   # 3 pages each
    paged.release(0)
    assert paged.free_pages == 7 and paged.lengths == [0, 35]
    with pytest.raises(ValueError, match="the pool is out of pages: 8 needed, 7 free"):
        paged.append(*(torch.randn(B, Hkv, 64, D, device=DEV) for _ in range(2)))
    paged.reset()
    assert paged.free_pages == 10 and paged.lengths == [0, 0]


def test_the_table_is_read_once_per_version(monkeypatch):
    """The table's check reads it on the host (a device sync): once per version of the tensor, as
    a model's layers pass the same table; an in-place change is read and checked again, also
    against a smaller pool."""
    import flashlib.decode
    reads, table_range = [], flashlib.decode._table_range
    monkeypatch.setattr(flashlib.decode, "_table_range", lambda t: reads.append(1) or table_range(t))
    k, v = (torch.randn(4, 2, 16, 16, device=DEV) for _ in range(2))
    q, lens = torch.randn(1, 2, 1, 16, device=DEV), torch.tensor([20], device=DEV)
    table = torch.tensor([[3, 1]], dtype=torch.int32, device=DEV)
    first = flash_decode(q, k, v, cache_seqlens=lens, block_table=table)
    assert torch.equal(flash_decode(q, k, v, cache_seqlens=lens, block_table=table), first)
    assert len(reads) == 1
    with pytest.raises(ValueError, match="block_table holds page 3, but the caches have pages 0 to 2"):
        flash_decode(q, k[:3], v[:3], cache_seqlens=lens, block_table=table)   # same table, fewer pages
    table[0, 1] = 7                                            # in place: read and checked again
    with pytest.raises(ValueError, match="block_table holds page 7"):
        flash_decode(q, k, v, cache_seqlens=lens, block_table=table)
    assert len(reads) == 2


@pytest.mark.parametrize("change, error, match", [
    (dict(block_table=torch.tensor([[0, 9]], dtype=torch.int32)), ValueError, "block_table holds page 9"),
    (dict(block_table=torch.tensor([[0, -1]], dtype=torch.int32)), ValueError, "block_table holds page -1"),
    (dict(block_table=torch.tensor([[0, 1]], dtype=torch.int64)), TypeError, "block_table must be an int32"),
    (dict(cache_seqlens=None), ValueError, "cache_seqlens is required with block_table"),
    (dict(pages=24), ValueError, r"page_size \(k_cache.shape\[2\]\) must be a power of two >= 16"),
])
def test_bad_pages_name_the_argument(change, error, match):
    pages = change.pop("pages", 16)
    k, v = (torch.randn(4, 2, pages, 16, device=DEV) for _ in range(2))
    args = dict(cache_seqlens=torch.tensor([20], device=DEV),
                block_table=torch.tensor([[3, 1]], dtype=torch.int32))
    args.update(change)
    args = {name: t.to(DEV) if isinstance(t, torch.Tensor) else t for name, t in args.items()}
    with pytest.raises(error, match=match):
        flash_decode(torch.randn(1, 2, 1, 16, device=DEV), k, v, **args)


def test_short_pages_on_one_wave_get_their_own_tile(monkeypatch):
    """Pages shorter than the key tile on a grid of one wave: ``SHORT_PAGE_KEY_BLOCK``, where it
    fits (compiled kernels; the interpreter keeps its own tile); a program of one query row takes
    the long-split tile (128 keys, 4 warps). Where they do not fit, the table's tile and two
    programs an SM. Plans are memoised per shape and target: each target below gets its own."""
    monkeypatch.setattr(runtime, "INTERPRET", False)

    def plan(page, B=4, Hq=32, Hkv=8, L=4096, dtype=torch.float16):
        q = torch.empty(B, Hq, 1, 128, dtype=dtype)
        k = torch.empty(B * L // page, Hkv, page, 128, dtype=dtype)
        table = torch.zeros(B, L // page, dtype=torch.int32)
        lens = torch.full((B,), L, dtype=torch.int32)
        return kernels.launch_plan(q, k, lens, block_table=table, longest=L, ragged=False)

    with config.compiling_for(config.TARGETS["h100"]):
        for args in ({"page": 16}, {"page": 32}, {"page": 16, "B": 1, "Hq": 64, "Hkv": 32, "L": 1024}):
            _, _, tile, splits = plan(**args)
            assert tile == kernels.SHORT_PAGE_KEY_BLOCK and splits == 4, args      # 128 programs
        for L in (1024, 8192):                                                       # one query row
            assert plan(16, B=1, Hkv=32, Hq=32, L=L)[2:] == (kernels.LONG_SPLIT_KEY_BLOCK, 4), L
        assert plan(256)[2] != kernels.SHORT_PAGE_KEY_BLOCK                          # a page a tile
        assert plan(16, B=64)[2:] == ((128, 4, 3), 1)                                # 512 programs
        assert plan(16, dtype=torch.float32)[2:] == ((64, 4, 3), 8)                  # does not fit
    with config.compiling_for(config.TARGETS["a100"]):                               # 163 KB
        assert plan(16)[2:] == ((64, 4, 3), 8)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("ids_ahead, num_splits", [(False, None), (True, 2)])   # 2: 64 programs, one wave
@pytest.mark.parametrize("page_size", [16, 64, 256])
def test_gpu_real_sizes(page_size, ids_ahead, num_splits):
    B, Hq, Hkv, D, L = 4, 32, 8, 128, 16384
    q = torch.randn(B, Hq, 1, D, dtype=torch.float16, device=DEV)
    k, v = (torch.randn(B, Hkv, L, D, dtype=torch.float16, device=DEV) for _ in range(2))
    lens = torch.tensor([16384, 9000, 1, 4097], device=DEV)
    k_pages, v_pages, table = scattered(k, v, page_size, num_pages=2 * B * L // page_size)
    options = runtime.KernelOptions(decode_page_ids_ahead=ids_ahead)
    grid = B * Hkv * (num_splits or kernels.launch_plan(q, k_pages, lens, block_table=table)[3])
    assert kernels.page_ids_ahead(grid, kernels.sm_count(q.device), options) == ids_ahead
    out, lse = flash_decode(q, k_pages, v_pages, cache_seqlens=lens, block_table=table,
                            num_splits=num_splits, return_lse=True, kernel_options=options)
    for b, n in enumerate(lens.tolist()):
        sl = slice(b, b + 1)
        assert_attention_close(out[sl], lse[sl], q[sl], k[sl, :, :n], v[sl, :, :n], causal=True,
                               name=f"sequence {b}")
