"""flashlib.masks and block_sparse_attention (forward + backward kernels) against the float64 oracle.

The oracle is ``attention_ref(..., mask=M.to_dense())``: block-sparse attention with mask M is
exact attention under M's element mask. CPU: through Triton's interpreter at small, irregular
shapes, with 32-wide mask blocks so that several blocks and partial tails appear. GPU (marked
``gpu``): real sizes.
"""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from flashlib import masks, runtime
from flashlib.ops import block_sparse_attention, flash_attention
from flashlib.reference import attention_naive, attention_ref
from flashlib.testing import assert_close, attention_magnitudes

DEV = runtime.DEVICE
gpu = pytest.mark.gpu


def rand(*shape, dtype=torch.float32, generator=None):
    return torch.randn(*shape, dtype=dtype, device=DEV, generator=generator)


def check_block_sparse(q, k, v, block_mask, dense, *, causal=False, block_size=128, backward=True,
                       scale=None, **score_mods):
    """Forward (out, lse) and gradients of block_sparse_attention against attention_ref under
    ``dense`` (bool, broadcast to (B, Hq, Nq, Nk)); baseline: naive masked attention in q's dtype.
    score_mods: ``softcap``, ``alibi_slopes``."""
    dtype = q.dtype
    leaves = [t.clone().requires_grad_(backward) for t in (q, k, v)]
    out, lse = block_sparse_attention(*leaves, block_mask, block_size=block_size, causal=causal,
                                      scale=scale, return_lse=True, **score_mods)
    ref_leaves = [t.double().requires_grad_(backward) for t in (q, k, v)]
    ref, ref_lse = attention_ref(*ref_leaves, mask=dense, scale=scale, **score_mods)
    base_leaves = [t.clone().requires_grad_(backward) for t in (q, k, v)]
    base = attention_naive(*base_leaves, mask=dense, scale=scale, **score_mods)
    assert out.shape == q.shape and out.dtype == dtype and lse.dtype == torch.float32
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    dout = torch.randn(out.shape, dtype=dtype, device=DEV, generator=torch.Generator(DEV).manual_seed(1))
    mags = attention_magnitudes(q, k, v, dout if backward else None, mask=dense, scale=scale,
                                **score_mods)                                       # the floor
    assert_close(out, ref, baseline=base, dtype=dtype, name="out", magnitude=mags["out"])
    assert torch.equal(torch.isinf(lse).cpu(), torch.isinf(ref_lse).cpu()), "lse -inf in the wrong rows"
    assert_close(lse, ref_lse, baseline=ref_lse.float(), dtype=torch.float32, name="lse", magnitude=mags["lse"])
    if backward:
        grads = torch.autograd.grad(out, leaves, dout)
        ref_grads = torch.autograd.grad(ref, ref_leaves, dout.double())
        base_grads = torch.autograd.grad(base, base_leaves, dout)
        for name, g, r, b in zip(("dq", "dk", "dv"), grads, ref_grads, base_grads):
            assert g.shape == r.shape and g.dtype == dtype and not torch.isnan(g).any(), name
            assert_close(g, r, baseline=b, dtype=dtype, name=name, magnitude=mags[name])
    return out, lse


def qkv(B, Hq, Hkv, Nq, Nk, D, dtype=torch.float32, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return rand(B, Hq, Nq, D, dtype=dtype, generator=g), rand(B, Hkv, Nk, D, dtype=dtype, generator=g), \
        rand(B, Hkv, Nk, D, dtype=dtype, generator=g)


def doc_ids(B, N, n_docs, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n_docs, (B, N), generator=g).sort(dim=1).values


# (name, builder(B, Nq, Nk, block_size)) for every kind of mask in flashlib.masks
MASKS = [
    ("causal", lambda B, Nq, Nk, bs: masks.causal(Nq, Nk, block_size=bs, device=DEV)),
    ("window", lambda B, Nq, Nk, bs: masks.sliding_window(Nq, Nk, 40, block_size=bs, device=DEV)),
    ("window_sym", lambda B, Nq, Nk, bs: masks.sliding_window(Nq, Nk, 23, causal=False, block_size=bs,
                                                              device=DEV)),
    ("local_global", lambda B, Nq, Nk, bs: masks.local_global(Nq, Nk, 20, 9, block_size=bs, device=DEV)),
    ("document", lambda B, Nq, Nk, bs: masks.document(doc_ids(B, Nq, 3, 1).to(DEV),
                                                      doc_ids(B, Nk, 3, 2).to(DEV), block_size=bs)),
    ("random", lambda B, Nq, Nk, bs: masks.random_blocks(Nq, Nk, 0.4, block_size=bs, heads=6, seed=3,
                                                         device=DEV)),
    ("function", lambda B, Nq, Nk, bs: masks.from_function(lambda i, j: (i + 2 * j) % 5 != 0, Nq, Nk,
                                                           block_size=bs, device=DEV)),
]


# every kind in float32; float16 for one band mask (partial tiles computed) and one bitmap mask
# (partial tiles loaded), each through the interpreter (the GPU tests run every kind in both)
KINDS_AND_DTYPES = [(*m, torch.float32) for m in MASKS] + \
    [(*m, torch.float16) for m in MASKS if m[0] in ("window", "document")]


@pytest.mark.parametrize("name,build,dtype", KINDS_AND_DTYPES,
                         ids=[f"{m[0]}-{str(m[2])[6:]}" for m in KINDS_AND_DTYPES])
def test_every_mask_kind_matches_reference(name, build, dtype):
    # 6 query heads over 3 K/V heads, Nq != Nk, neither a multiple of the block, head dim 80
    B, Hq, Hkv, Nq, Nk, D = 2, 6, 3, 97, 130, 80
    mask = build(B, Nq, Nk, 32)
    check_block_sparse(*qkv(B, Hq, Hkv, Nq, Nk, D, dtype), mask, mask.to_dense())


@pytest.mark.parametrize("name", ["causal", "window", "window_sym"])
def test_band_masks_when_the_keys_fill_the_last_block(name):
    # Nk a multiple of the block: partial tiles skip the bounds on K/V loads and on the band test
    B, Hq, Hkv, Nq, Nk, D = 1, 4, 2, 97, 128, 48
    mask = dict((m[0], m[1]) for m in MASKS)[name](B, Nq, Nk, 32)
    check_block_sparse(*qkv(B, Hq, Hkv, Nq, Nk, D), mask, mask.to_dense())


def test_bool_block_tensor_with_causal_and_broadcast_heads():
    B, Hq, Hkv, Nq, Nk, D, bs = 2, 4, 2, 130, 70, 40, 32
    g = torch.Generator().manual_seed(5)
    blocks = (torch.rand(Hq, math.ceil(Nq / bs), math.ceil(Nk / bs), generator=g) < 0.5).to(DEV)  # (H, nQ, nK)
    dense = blocks.repeat_interleave(bs, 1).repeat_interleave(bs, 2)[:, :Nq, :Nk]
    dense = dense & masks.causal(Nq, Nk, block_size=bs, device=DEV).to_dense()[0]
    check_block_sparse(*qkv(B, Hq, Hkv, Nq, Nk, D), blocks, dense, causal=True, block_size=bs)


def test_bfloat16_and_custom_scale():
    mask = masks.sliding_window(70, 45, 17, block_size=32, device=DEV)
    check_block_sparse(*qkv(1, 2, 1, 70, 45, 32, torch.bfloat16), mask, mask.to_dense(), scale=0.3)


def test_all_true_mask_equals_flash_attention():
    B, Hq, Hkv, Nq, Nk, D = 1, 4, 2, 130, 97, 64
    q, k, v = qkv(B, Hq, Hkv, Nq, Nk, D)
    for causal in (False, True):
        blocks = torch.ones(math.ceil(Nq / 64), math.ceil(Nk / 64), dtype=torch.bool, device=DEV)
        out, lse = block_sparse_attention(q, k, v, blocks, block_size=64, causal=causal, return_lse=True)
        dense_out, dense_lse = flash_attention(q, k, v, causal=causal, return_lse=True)
        ref, _ = attention_ref(q, k, v, causal=causal)
        assert_close(out, ref, baseline=dense_out, dtype=q.dtype, name=f"out, causal={causal}")
        assert torch.equal(torch.isinf(lse), torch.isinf(dense_lse))


def test_empty_rows_give_zeros_and_no_nan_gradients():
    # query block 1 (rows 32..63) has an empty row of the block mask, and with causal and
    # Nq - Nk = 32 rows 0..31 see no key either
    B, Hq, Nq, Nk, D, bs = 1, 2, 96, 64, 32, 32
    blocks = torch.ones(3, 2, dtype=torch.bool, device=DEV)
    blocks[1] = False
    dense = blocks.repeat_interleave(bs, 0).repeat_interleave(bs, 1) & masks.causal(Nq, Nk, device=DEV).to_dense()[0]
    q, k, v = qkv(B, Hq, Hq, Nq, Nk, D)
    out, lse = check_block_sparse(q, k, v, blocks, dense, causal=True, block_size=bs)
    assert torch.equal(out[:, :, :bs + 32], torch.zeros_like(out[:, :, :bs + 32]))   # rows 0..63 see no key
    assert torch.isinf(lse[:, :, :bs + 32]).all() and torch.isfinite(lse[:, :, bs + 32:]).all()
    qq = q.clone().requires_grad_()
    block_sparse_attention(qq, k, v, blocks, block_size=bs, causal=True).sum().backward()
    assert torch.equal(qq.grad[:, :, :bs + 32], torch.zeros_like(qq.grad[:, :, :bs + 32]))


def test_one_visible_key_per_row_and_large_logits():
    # each query sees exactly one key: out is that key's value, dq is exactly 0 (softmax of one
    # score is 1 whatever the score); scores of several hundred must not overflow
    Nq = Nk = 70
    mask = masks.from_function(lambda i, j: j == (i * 7) % Nk, Nq, Nk, block_size=32, device=DEV)
    q, k, v = qkv(1, 2, 2, Nq, Nk, 32)
    q = q * 30.0
    check_block_sparse(q, k, v, mask, mask.to_dense())
    out = block_sparse_attention(q, k, v, mask)
    picked = v[:, :, (torch.arange(Nq) * 7) % Nk]
    assert torch.allclose(out, picked, rtol=0, atol=1e-6)
    mask2 = masks.sliding_window(Nq, Nk, 20, block_size=32, device=DEV)
    check_block_sparse(q, k, v, mask2, mask2.to_dense(), scale=3.0)


def test_non_contiguous_inputs():
    mask = masks.sliding_window(33, 50, 16, causal=False, block_size=16, device=DEV)
    q = rand(2, 33, 4, 64).transpose(1, 2)
    k = rand(2, 50, 2, 64).transpose(1, 2)
    v = rand(2, 50, 2, 64).transpose(1, 2)
    check_block_sparse(q, k, v, mask, mask.to_dense(), backward=False)


@settings(max_examples=12, deadline=None)
@given(nq=st.integers(1, 75), nk=st.integers(1, 75), bs=st.sampled_from([16, 32]),
       density=st.floats(0.05, 1.0), causal=st.booleans(), seed=st.integers(0, 2**16))
def test_property_equals_reference_with_dense_expansion(nq, nk, bs, density, causal, seed):
    """block_sparse with mask M == attention_ref with the dense expansion of M, for any M."""
    mask = masks.random_blocks(nq, nk, density, block_size=bs, heads=2, seed=seed, device=DEV)
    q, k, v = qkv(1, 2, 1, nq, nk, 16, seed=seed)
    dense = mask.to_dense() & (masks.causal(nq, nk, block_size=bs, device=DEV).to_dense() if causal else True)
    check_block_sparse(q, k, v, mask, dense, causal=causal, backward=nq * nk < 2000)


# ---- flashlib.masks ---------------------------------------------------------------------------

def brute_kinds(dense, bs):
    """Tile kinds from the element mask by direct inspection (0 empty, 1 partial, 2 full)."""
    Nq, Nk = dense.shape[-2:]
    nQ, nK = math.ceil(Nq / bs), math.ceil(Nk / bs)
    kinds = torch.zeros(nQ, nK, dtype=torch.int8)
    for a in range(nQ):
        for b in range(nK):
            tile = dense[a * bs:(a + 1) * bs, b * bs:(b + 1) * bs]
            whole = tile.shape[1] == bs                       # key tiles past Nk are never full
            kinds[a, b] = 0 if not tile.any() else 2 if tile.all() and whole else 1
    return kinds


@pytest.mark.parametrize("name,build", MASKS, ids=[m[0] for m in MASKS])
def test_mask_tables_agree_with_the_dense_mask(name, build):
    Nq, Nk, bs = 97, 130, 32
    mask = build(2, Nq, Nk, bs)
    dense = mask.to_dense().cpu()
    for b in range(mask.shape[0]):
        for h in range(mask.shape[1]):
            kinds = mask.kinds[b, h].cpu()
            assert torch.equal(kinds, brute_kinds(dense[b, h], bs)), f"tile kinds of ({b}, {h})"
            for rows, index, full, count, bitmap in (
                    (kinds, mask.kv_index, mask.kv_full, mask.kv_count, mask.kv_bitmap),
                    (kinds.T, mask.q_index, mask.q_full, mask.q_count, mask.q_bitmap)):
                for r, row in enumerate(rows):
                    listed = index[b, h, r, :count[b, h, r]].cpu().tolist()
                    n_full = int(full[b, h, r])
                    assert listed[:n_full] == [c for c in range(len(row)) if row[c] == 2]
                    assert listed[n_full:] == [c for c in range(len(row)) if row[c] == 1]
                    for pos in range(n_full, len(listed)):   # each partial entry's bitmap is its tile
                        qb, kb = (r, listed[pos]) if rows is kinds else (listed[pos], r)
                        tile = torch.zeros(bs, bs, dtype=torch.bool)
                        part = dense[b, h, qb * bs:(qb + 1) * bs, kb * bs:(kb + 1) * bs]
                        tile[:part.shape[0], :part.shape[1]] = part
                        assert torch.equal(mask.bitmaps[int(bitmap[b, h, r, pos])].cpu().bool(), tile)


def test_mask_density_drawing_and_combination():
    m = masks.sliding_window(256, 256, 128, block_size=64)    # row 64 sees keys 0..64: block 0 full
    assert m.to_string() == "+...\n#+..\n+#+.\n.+#+"
    assert m.density() == pytest.approx(9 / 16)
    c = masks.causal(2, 4, block_size=16)
    assert c.to_dense()[0, 0].int().tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]      # bottom-right
    d = masks.document(torch.tensor([0, 0, 1, 1]), causal=False, block_size=16)
    both = d & masks.causal(4, 4, block_size=16)
    assert both.to_dense()[0, 0].int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]
    r = masks.random_blocks(1000, 1000, 0.25, block_size=128, heads=3)
    assert r.shape == (1, 3, 8, 8) and r.density() == pytest.approx(0.25)
    assert "density" in repr(r)


def band_dense(mask):
    """The element mask that ``mask.band`` describes: lo <= j - (i + Nk - Nq) <= hi."""
    lo, hi = mask.band
    i = torch.arange(mask.seqlen_q)[:, None] + (mask.seqlen_k - mask.seqlen_q)
    j = torch.arange(mask.seqlen_k)[None, :]
    return (j - i >= lo) & (j - i <= hi)


@pytest.mark.parametrize("Nq,Nk", [(97, 130), (130, 97), (64, 64)])
def test_band_masks_are_exactly_their_rule(Nq, Nk):
    # the kernels mask partial tiles of band masks by arithmetic instead of their bitmaps
    window = masks.sliding_window(Nq, Nk, 40, block_size=32)
    bands = [masks.causal(Nq, Nk, block_size=32), window,
             masks.sliding_window(Nq, Nk, 23, causal=False, block_size=32),
             masks.sliding_window(Nq, Nk, 1, block_size=32),
             masks.sliding_window(Nq, Nk, 50, causal=False, block_size=32) & masks.causal(Nq, Nk, block_size=32)]
    for mask in bands:
        assert mask.band is not None and torch.equal(band_dense(mask), mask.to_dense()[0, 0].cpu()), mask
    doc = masks.document(doc_ids(1, Nq, 3, 1), doc_ids(1, Nk, 3, 2), block_size=32)
    for mask in (doc, doc & window, masks.local_global(Nq, Nk, 20, 9, block_size=32),
                 masks.random_blocks(Nq, Nk, 0.4, block_size=32)):
        assert mask.band is None, mask


def test_full_blocks_adjacent_per_row():
    # the kernels step through adjacent full blocks without reading the list: the flag must be
    # exact, per row, for both lists
    Nq, Nk = 130, 200
    for mask in (masks.causal(Nq, Nk, block_size=32), masks.sliding_window(Nq, Nk, 70, block_size=32),
                 masks.document(doc_ids(1, Nq, 3, 1), doc_ids(1, Nk, 3, 2), block_size=32),
                 masks.from_block_tensor(torch.ones(5, 7, dtype=torch.bool), Nq, Nk, block_size=32)):
        assert mask.kv_full_adjacent and mask.q_full_adjacent, mask
    blocks = torch.ones(5, 7, dtype=torch.bool)
    blocks[3, 2] = False                                   # row 3 lists full blocks 0, 1, 3, ...
    gap = masks.from_block_tensor(blocks, Nq, Nk, block_size=32)
    assert not gap.kv_full_adjacent and not gap.q_full_adjacent
    blocks[3, 0] = blocks[3, 1] = False                    # row 3 starts at 3; column 2 skips row 3
    shifted = masks.from_block_tensor(blocks, Nq, Nk, block_size=32)
    assert shifted.kv_full_adjacent and not shifted.q_full_adjacent
    for mask in (masks.local_global(Nq, Nk, 40, 9, block_size=32),
                 *(masks.random_blocks(Nq, Nk, 0.6, block_size=32, seed=s) for s in range(4))):
        for kinds, flag in ((mask.kinds, mask.kv_full_adjacent),
                            (mask.kinds.transpose(-1, -2), mask.q_full_adjacent)):
            runs = [torch.nonzero(row == masks.FULL).flatten() for row in kinds.reshape(-1, kinds.shape[-1])]
            assert flag == all(bool((r.diff() == 1).all()) for r in runs), mask


def test_band_and_bitmap_masking_give_the_same_bits():
    # a band mask's partial tiles are masked by arithmetic and its full blocks stepped through
    # without the list; with the band and the flags dropped, the same tables go through bitmaps
    # and list loads
    B, Hq, Hkv, Nq, Nk, D = 1, 4, 2, 97, 130, 48
    banded = masks.causal(Nq, Nk, block_size=32, device=DEV) & masks.sliding_window(Nq, Nk, 90, block_size=32)
    assert banded.band is not None and banded.kv_full_adjacent and int(banded.kv_full.max()) >= 2
    bitmapped = masks.BlockMask.__new__(masks.BlockMask)
    bitmapped.__dict__.update(banded.__dict__, band=None, kv_full_adjacent=False, q_full_adjacent=False)
    results = []
    for mask in (banded, bitmapped):
        leaves = [t.requires_grad_() for t in qkv(B, Hq, Hkv, Nq, Nk, D)]
        out = block_sparse_attention(*leaves, mask)
        results.append((out, *torch.autograd.grad(out.sum(), leaves)))
    for name, a, b in zip(("out", "dq", "dk", "dv"), *results):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("name", ["window", "random"])
def test_torch_compile_traces_the_whole_call_and_matches_eager(name):
    # under torch.compile block_sparse_attention is one op per direction taking the mask's
    # tables (fullgraph: no graph break for a BlockMask built outside), running the same kernels
    # as eager: outputs and gradients bit-equal, for a band mask (partial tiles by arithmetic, full
    # blocks stepped through) and a bitmap mask (tables read, heads broadcast)
    B, Hq, Hkv, Nq, Nk, D = 2, 6, 2, 70, 97, 16
    mask = dict(MASKS)[name](B, Nq, Nk, 32)
    leaves = [t.requires_grad_() for t in qkv(B, Hq, Hkv, Nq, Nk, D)]
    dout = rand(B, Hq, Nq, D)

    def attend(q, k, v):
        return block_sparse_attention(q, k, v, mask, return_lse=True)
    results = []
    for fn in (torch.compile(attend, fullgraph=True, backend="aot_eager"), attend):
        out, lse = fn(*leaves)
        results.append((out, lse, *torch.autograd.grad(out, leaves, dout)))
    for what, compiled, eager in zip(("out", "lse", "dq", "dk", "dv"), *results):
        assert torch.equal(compiled, eager), what


def test_torch_compile_builds_masks_eagerly():
    # a mask built inside the call (from a bool block tensor, or with causal=True): its tables are
    # built on the host as in eager (graph breaks), and the result is eager's
    q, k, v = qkv(1, 4, 2, 50, 66, 16)
    blocks = torch.rand(1, 4, 4, 5, generator=torch.Generator().manual_seed(0)).to(DEV) < 0.6
    window = masks.sliding_window(50, 66, 30, causal=False, block_size=16, device=DEV)

    def attend(q, k, v):
        return (block_sparse_attention(q, k, v, blocks, block_size=16, causal=True)
                + block_sparse_attention(q, k, v, window, causal=True))
    assert torch.equal(torch.compile(attend, backend="aot_eager")(q, k, v), attend(q, k, v))


def test_mask_on_the_device_already_is_not_copied():
    # block_sparse_attention moves the mask to q's device (cuda:0): a mask built on "cuda" is
    # there already (a copy per call cost host time and, under torch.compile, a graph break)
    mask = masks.sliding_window(40, 40, 8, block_size=16, device=DEV.type)
    assert mask.to(torch.empty(0, device=DEV).device) is mask
    assert mask.to(DEV.type) is mask


def test_block_sparse_custom_ops_pass_torch_opcheck():
    # schema, fake (meta) outputs with the real strides; no autograd of their own (ops.OpAttention
    # is theirs). Small: opcheck runs each op about ten times through the interpreter; grouped and
    # strided heads, Nq != Nk
    from flashlib import ops
    q, k, v = qkv(1, 2, 1, 20, 33, 16)
    q = q.transpose(1, 2).contiguous().transpose(1, 2)            # strided heads
    mask = masks.local_global(20, 33, 12, 5, block_size=16, device=DEV)
    view = mask.kernel_view()
    tables, layout = view.tables(), view.layout()
    assert masks.KernelView.from_args(tables, layout) == view     # the op sees what eager sees
    slopes = torch.rand(2, device=DEV)
    from flashlib.kernels.score_mod import NO_MODIFIERS, Modifiers
    options = runtime.OPTIONS.op_args()
    out, lse = ops._bs_forward_op(q, k, v, tables, layout, 0.3, *NO_MODIFIERS.op_args(), options)
    torch.library.opcheck(ops._bs_forward_op, (q, k, v, tables, layout, 0.3,
                                               *Modifiers(5.0, slopes).op_args(), options))
    torch.library.opcheck(ops._bs_backward_op, (q, k, v, out, lse, torch.randn_like(out),
                                                tables, layout, 0.3, *Modifiers(None, slopes).op_args(), options))


def test_bad_input_names_the_argument():
    q, k, v = qkv(1, 2, 2, 40, 40, 16)
    with pytest.raises(ValueError, match="block_mask has shape"):
        block_sparse_attention(q, k, v, torch.ones(2, 3, dtype=torch.bool, device=DEV), block_size=16)
    with pytest.raises(TypeError, match="block_mask must be a bool tensor"):
        block_sparse_attention(q, k, v, torch.ones(3, 3, device=DEV), block_size=16)
    with pytest.raises(ValueError, match="block_size must be a power of two"):
        block_sparse_attention(q, k, v, torch.ones(1, 1, dtype=torch.bool), block_size=48)
    with pytest.raises(ValueError, match="seqlen_q=50"):
        block_sparse_attention(q, k, v, masks.causal(50, 40, block_size=16))
    with pytest.raises(ValueError, match="does not broadcast"):
        block_sparse_attention(q, k, v, torch.ones(3, 3, 3, dtype=torch.bool, device=DEV), block_size=16)
    with pytest.raises(ValueError, match="heads_q=2 is not a multiple of heads_kv=3"):
        block_sparse_attention(q, torch.randn(1, 3, 40, 16), torch.randn(1, 3, 40, 16), masks.causal(40, 40))
    with pytest.raises(ValueError, match="window must be a positive int"):
        masks.sliding_window(40, 40, 0)
    with pytest.raises(ValueError, match="density must be in"):
        masks.random_blocks(40, 40, 0.0)
    with pytest.raises(TypeError, match="doc_ids_q must be an int tensor"):
        masks.document(torch.zeros(40))


# ---- GPU, real sizes --------------------------------------------------------------------------

@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_real_sizes(dtype, D):
    B, Hq, Hkv, N = 2, 8, 2, 4096 + 77
    for mask in (masks.sliding_window(N, N, 1000, device=DEV),
                 masks.document(doc_ids(B, N, 5, 0).to(DEV)),
                 masks.random_blocks(N, N, 0.2, heads=Hq, device=DEV)):
        check_block_sparse(*qkv(B, Hq, Hkv, N, N, D, dtype), mask, mask.to_dense())


@gpu
def test_gpu_long_sliding_window_float32_exact():
    N = 16384
    mask = masks.sliding_window(N, N, 1024, device=DEV)
    check_block_sparse(*qkv(1, 2, 1, N, N, 64), mask, mask.to_dense())


@gpu
def test_gpu_more_programs_than_grid_axis_1_allows():
    # B x H = 131072 > 65535: every kernel puts (batch, head) on grid axis 0
    B, H, N, D = 1024, 128, 16, 64
    q, k, v = (rand(B, H, N, D, dtype=torch.float16).requires_grad_() for _ in range(3))
    for fn in (lambda: flash_attention(q, k, v, causal=True),
               lambda: block_sparse_attention(q, k, v, masks.causal(N, N, block_size=16, device=DEV))):
        out = fn()
        ref, _ = attention_ref(q[-2:], k[-2:], v[-2:], causal=True)
        base = attention_naive(q[-2:], k[-2:], v[-2:], causal=True)
        assert_close(out[-2:], ref, baseline=base, dtype=q.dtype, name="out of the last batch entries")
        dq, dk, dv = torch.autograd.grad(out.float().pow(2).sum(), (q, k, v))
        assert torch.isfinite(dq).all() and dk[-1].abs().sum() > 0 and dv[-1].abs().sum() > 0


@gpu
def test_gpu_direct_launches_repeat_the_first_call():
    # from the second call of a signature on, the launchers skip Triton's launch path and the
    # autotuner (kernels/launch.py): the same config and the same bits, dense and block-sparse
    from flashlib.kernels import block_sparse as bs, fa2_bwd, fa2_fwd, launch
    q, k, v = (t.requires_grad_() for t in qkv(2, 4, 2, 1000, 1000, 64, torch.float16))
    dout = torch.randn_like(q)
    mask = masks.sliding_window(1000, 1000, 300, device=DEV)
    for fn, dense in ((lambda: block_sparse_attention(q, k, v, mask), mask.to_dense()),
                      (lambda: flash_attention(q, k, v), None)):
        runs = []
        for _ in range(3):
            out = fn()
            runs.append((out, *torch.autograd.grad(out, (q, k, v), dout)))
        plain = [t.detach() for t in (q, k, v)]
        ref, _ = attention_ref(*plain, mask=dense)
        assert_close(runs[0][0], ref, baseline=attention_naive(*plain, mask=dense), dtype=q.dtype)
        for later in runs[1:]:
            assert all(torch.equal(a, b) for a, b in zip(runs[0], later))
    if launch.enabled(runtime.OPTIONS):
        scores = 2 * 4 * 1000 * 1000
        for choose in (bs._choose_fwd, bs._choose_dq, bs._choose_dkdv):
            assert launch._compiled[choose(64, 2, scores, mask.block_size)[0]], choose
        for choose in (fa2_fwd._choose, fa2_bwd._choose_dq, fa2_bwd._choose_dkdv):
            assert launch._compiled[choose(64, 2, scores)[0]], choose


@gpu
def test_gpu_compiled_matches_eager():
    # under torch.compile (inductor, fullgraph) the custom ops run the same kernels as eager:
    # output and gradients bit-equal, after a float64 check of the eager output
    B, Hq, Hkv, N, D = 2, 8, 2, 2048 + 33, 64
    q, k, v = (t.requires_grad_() for t in qkv(B, Hq, Hkv, N, N, D, torch.bfloat16))
    dout = torch.randn_like(q)
    mask = masks.causal(N, N, device=DEV) & masks.sliding_window(N, N, 500, device=DEV)

    def attend(q, k, v):
        return block_sparse_attention(q, k, v, mask)
    runs = []
    for fn in (attend, torch.compile(attend, fullgraph=True)):
        out = fn(q, k, v)
        runs.append((out, *torch.autograd.grad(out, (q, k, v), dout)))
    plain, dense = [t.detach() for t in (q, k, v)], mask.to_dense()
    ref, _ = attention_ref(*plain, mask=dense)
    assert_close(runs[0][0], ref, baseline=attention_naive(*plain, mask=dense), dtype=q.dtype)
    for name, eager, compiled in zip(("out", "dq", "dk", "dv"), *runs):
        assert torch.equal(eager, compiled), name
