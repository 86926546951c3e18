"""flash_decode (split-KV partial kernel + lse combine) and KVCache against the float64 oracle.

Each sequence b of a ragged batch is checked on its own against attention_ref over its first
L_b keys, bottom-right causal among the new tokens, with flashlib.testing's rule (baseline:
textbook attention in the same dtype). CPU: Triton's interpreter at small, irregular shapes
(head dims 16/80, 9 heads over 3, lengths 0 and full, more splits than key blocks). GPU (marked
``gpu``): real sizes, L up to 128k, head dims 64/128, B=1 and B=8 grouped, float16/bfloat16.
"""
import functools

import pytest
import torch

from flashlib import runtime
from flashlib.decode import KVCache, flash_decode
from flashlib.kernels import decode as kernels
from flashlib.ops import flash_attention
from flashlib.reference import attention_naive, attention_ref
from flashlib.testing import assert_attention_close, assert_close

gpu = pytest.mark.skipif(runtime.DEVICE.type != "cuda", reason="needs a CUDA GPU")
DEV = runtime.DEVICE


def inputs(B, Hq, Hkv, Nq, Lmax, D, dtype):
    q = torch.randn(B, Hq, Nq, D, dtype=dtype, device=DEV)
    k, v = (torch.randn(B, Hkv, Lmax, D, dtype=dtype, device=DEV) for _ in range(2))
    return q, k, v


def check_per_sequence(out, lse, q, k, v, seqlens, scale=None):
    """Sequence b against attention over its first L_b keys (bottom-right causal)."""
    assert lse.dtype == torch.float32 and out.dtype == q.dtype
    lengths = [k.shape[2]] * q.shape[0] if seqlens is None else seqlens.tolist()
    for b, L in enumerate(lengths):
        sl = slice(b, b + 1)
        assert_attention_close(out[sl], lse[sl], q[sl], k[sl, :, :L], v[sl, :, :L], causal=True,
                               scale=scale, name=f"out of sequence {b} (L={L})")


def run_and_check(B, Hq, Hkv, Nq, Lmax, D, seqlens, dtype, *, num_splits=None, scale=None):
    q, k, v = inputs(B, Hq, Hkv, Nq, Lmax, D, dtype)
    lens = None if seqlens is None else torch.tensor(seqlens, dtype=torch.int32, device=DEV)
    out, lse = flash_decode(q, k, v, cache_seqlens=lens, num_splits=num_splits, scale=scale,
                            return_lse=True)
    check_per_sequence(out, lse, q, k, v, lens, scale)
    return out, lse


CPU_CASES = [  # (B, Hq, Hkv, Nq, Lmax, D, seqlens, num_splits)
    (4, 8, 2, 1, 130, 64, [130, 0, 1, 97], None),   # ragged: full, empty, one key
    (2, 9, 3, 1, 97, 80, [97, 33], 3),              # grouped 9 over 3, head dim 80
    (2, 4, 1, 3, 70, 16, [70, 2], 2),               # 3 new tokens, causal; L=2 < 3: a row sees nothing
    (1, 2, 2, 1, 17, 16, None, 1),                  # multi-head, no lengths, one split
    (1, 8, 2, 5, 97, 32, [50], 7),                  # 5 tokens x group 4 = 20 rows, 7 splits > 4 blocks
    (1, 8, 1, 9, 40, 16, [40], 2),                  # 9 tokens x group 8 = 72 rows: two row blocks
]


@pytest.mark.parametrize("case", CPU_CASES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matches_reference(case, dtype):
    *shape, seqlens, num_splits = case
    run_and_check(*shape, seqlens, dtype, num_splits=num_splits)


def test_every_split_count_gives_the_same_answer():
    q, k, v = inputs(2, 4, 2, 1, 130, 64, torch.float32)
    lens = torch.tensor([130, 45], dtype=torch.int32, device=DEV)
    outs = []
    for num_splits in (1, 2, 3, 5, 17):           # 130 keys = 5 blocks of 32: 17 leaves 12 empty
        out, lse = flash_decode(q, k, v, cache_seqlens=lens, num_splits=num_splits, return_lse=True)
        check_per_sequence(out, lse, q, k, v, lens)
        outs.append((out, lse))
    for out, lse in outs[1:]:  # also within the float32 rule of one another
        assert_close(out, outs[0][0].double(), baseline=outs[0][0], dtype=torch.float32)
        assert_close(lse, outs[0][1].double(), baseline=outs[0][1], dtype=torch.float32)


def test_empty_splits_have_zero_weight_and_empty_rows_give_zero_and_minus_inf():
    q, k, v = inputs(3, 2, 1, 2, 40, 16, torch.float32)
    lens = torch.tensor([0, 1, 40], dtype=torch.int32, device=DEV)
    o_part, lse_part = kernels.decode_partial(q, k, v, lens, num_splits=6)
    assert o_part.shape == (3, 2, 2, 6, 16) and lse_part.shape == (3, 2, 2, 6)
    assert torch.all(lse_part[0] == float("-inf")) and torch.all(o_part[0] == 0)
    assert torch.isinf(lse_part[2]).any() and torch.isfinite(lse_part[2]).any()  # 40 keys, 2 blocks
    out, lse = kernels.combine(o_part, lse_part, out_dtype=q.dtype)
    assert not out.isnan().any()
    assert torch.all(out[0] == 0) and torch.all(lse[0] == float("-inf"))     # L = 0
    assert torch.all(lse[1, :, 0] == float("-inf")) and torch.all(out[1, :, 0] == 0)  # 2 tokens, 1 key
    check_per_sequence(out, lse, q, k, v, lens)


@pytest.mark.parametrize("num_splits", [1, 3, 9])
def test_one_launch_equals_the_two_kernels(num_splits):
    # flash_decode merges in the split-KV kernel's last program per row block (an arrival
    # counter); decode_partial + combine is the two-kernel form: same partials, same merge code
    # over as many rows at a time, so the same bits. 9 tokens x group 8 = 72 rows: two row blocks
    # of 64, two counters; with 9 splits the merge takes two tiles of splits.
    q, k, v = inputs(2, 8, 1, 9, 70, 16, torch.float32)
    lens = torch.tensor([70, 12], dtype=torch.int32, device=DEV)
    out, lse = flash_decode(q, k, v, cache_seqlens=lens, num_splits=num_splits, return_lse=True)
    block_m = kernels.launch_plan(q, k, lens, num_splits=num_splits)[0]
    two_out, two_lse = kernels.combine(*kernels.decode_partial(q, k, v, lens, num_splits=num_splits),
                                       out_dtype=q.dtype, block_r=block_m)
    assert torch.equal(out, two_out) and torch.equal(lse, two_lse)
    check_per_sequence(out, lse, q, k, v, lens)


def test_far_apart_scores_merge_without_overflow():
    # scale 8: scores up to about +-100, the splits' lse far apart. Each split's float32 lse is
    # rounded at that size, so its weight in the merge errs by about |lse| ulps: more than one
    # pass over the keys errs (2.7% of seeds failed a tolerance of 2x naive attention's error),
    # within the shared rule's floor, which grows with |scale q.k|
    q, k, v = inputs(2, 4, 2, 1, 130, 32, torch.float32)
    lens = [130, 77]
    out, lse = flash_decode(q, k, v, cache_seqlens=torch.tensor(lens, device=DEV), num_splits=4,
                            scale=8.0, return_lse=True)
    for b, L in enumerate(lens):
        assert_attention_close(out[b:b + 1], lse[b:b + 1], q[b:b + 1], k[b:b + 1, :, :L],
                               v[b:b + 1, :, :L], scale=8.0)


def test_bfloat16():
    run_and_check(2, 6, 2, 2, 70, 80, [70, 5], torch.bfloat16, num_splits=2)


def test_non_contiguous_cache():
    # a (B, L, H, D) cache viewed as (B, H, L, D), as models often store it
    q = torch.randn(2, 4, 1, 64, device=DEV)
    k, v = (torch.randn(2, 50, 2, 64, device=DEV).transpose(1, 2) for _ in range(2))
    lens = torch.tensor([50, 20], dtype=torch.int32, device=DEV)
    out, lse = flash_decode(q, k, v, cache_seqlens=lens, return_lse=True)
    check_per_sequence(out, lse, q, k, v, lens)


def test_heuristic_splits_fill_the_gpu_but_keep_splits_long():
    pick = kernels.num_splits_heuristic
    assert pick(1, 32, 1, 131072, block_n=64, sms=132) > 1        # 32 programs < 132 SMs: split
    assert pick(64, 32, 1, 131072, block_n=64, sms=132) == 1      # 2048 programs: no need
    assert pick(1, 1, 1, 100, block_n=64, sms=132) == 1           # 2 blocks: too short to split
    assert pick(8, 8, 1, 1024, block_n=64, sms=132) == 1          # half the SMs busy, short cache
    assert pick(8, 8, 1, 4096, block_n=64, sms=132) == 1
    assert pick(8, 8, 1, 8192, block_n=64, sms=132) == 2
    assert pick(1, 32, 1, 1024, block_n=64, sms=132) == 4         # a quarter busy: split anyway
    # how short a cache stays unsplit is per GPU: an H200 splits in two from 1k keys
    assert pick(8, 8, 1, 512, block_n=64, sms=132, short_cache=1024) == 1
    assert pick(8, 8, 1, 1024, block_n=64, sms=132, short_cache=1024) == 2
    for table in (kernels.SHORT_CACHE, kernels.LONG_SPLIT):
        assert kernels.for_gpu(table, torch.device("cpu")) == table["h100"]
    assert 1 <= pick(1, 1, 1, 10 ** 7, block_n=64, sms=132) <= kernels.MAX_SPLITS
    # lengths given (maybe ragged): more, shorter splits, so long sequences spread over idle SMs
    assert pick(8, 8, 1, 100000, block_n=64, sms=132, ragged=True) == 8 * pick(8, 8, 1, 100000, block_n=64, sms=132)
    # a paged cache: pages as long as a tile, one program an SM where splits of 2 blocks allow it
    # (then its page ids a tile ahead); shorter pages too where the short-page tile runs them (its
    # 8 warps hide the ids' wait), else two programs an SM (they hide each other's)
    assert pick(1, 32, 1, 1024, block_n=64, sms=132, ragged=True) == 4
    assert pick(1, 32, 1, 1024, block_n=64, sms=132, ragged=True, page=256) == 4
    assert pick(1, 32, 1, 1024, block_n=64, sms=132, ragged=True, page=16) == 8
    assert pick(1, 32, 1, 1024, block_n=64, sms=132, ragged=True, page=16, short_page_tile=True) == 4
    assert pick(1, 32, 1, 512, block_n=64, sms=132, ragged=True, short_cache=1024) == 1
    assert pick(1, 32, 1, 512, block_n=64, sms=132, short_cache=1024, page=64) == 4
    assert pick(8, 8, 1, 2048, block_n=64, sms=132, short_cache=1024, page=16) == 4
    assert pick(8, 8, 1, 2048, block_n=64, sms=132, short_cache=1024, page=16, short_page_tile=True) == 2
    assert pick(8, 8, 1, 512, block_n=64, sms=132, short_cache=1024, page=256) == 1  # short, half busy
    assert pick(1, 32, 1, 128, block_n=64, sms=132, ragged=True, page=16) == 1    # 2 blocks: one split
    for B, H, L in ((1, 32, 2048), (8, 8, 1024), (8, 8, 100000), (64, 32, 1024)):    # grid full already
        assert pick(B, H, 1, L, block_n=64, sms=132, ragged=True, page=16) == \
            pick(B, H, 1, L, block_n=64, sms=132, ragged=True)


def test_paged_launch_loads_page_ids_ahead_only_in_one_wave():
    on, off = runtime.KernelOptions(), runtime.KernelOptions(decode_page_ids_ahead=False)
    assert kernels.page_ids_ahead(132, 132, on) and not kernels.page_ids_ahead(133, 132, on)
    assert not kernels.page_ids_ahead(1, 132, off)


def test_kv_cache_append_and_attend_equal_attention_over_all_keys():
    B, Hq, Hkv, D = 2, 6, 2, 80
    cache = KVCache(B, Hkv, 40, D, dtype=torch.float32, device=DEV)
    ks, vs = [], []
    for n in (7, 1, 1, 3):                        # a prefill, two single tokens, 3 draft tokens
        k_new, v_new = (torch.randn(B, Hkv, n, D, device=DEV) for _ in range(2))
        ks.append(k_new)
        vs.append(v_new)
        cache.append(k_new, v_new)
        q = torch.randn(B, Hq, n, D, device=DEV)
        out, lse = cache.attend(q, return_lse=True)
        k_all, v_all = torch.cat(ks, dim=2), torch.cat(vs, dim=2)
        assert_attention_close(out, lse, q, k_all, v_all, causal=True)
    assert cache.lengths == [12, 12]
    with pytest.raises(ValueError, match="the cache is full"):
        cache.append(*(torch.randn(B, Hkv, 29, D, device=DEV) for _ in range(2)))
    cache.reset()
    assert cache.lengths == [0, 0]


def test_kv_cache_with_ragged_lengths():
    cache = KVCache(2, 1, 20, 16, dtype=torch.float32, device=DEV, lengths=[3, 0])
    first = torch.randn(2, 1, 3, 16, device=DEV)
    cache.k[0, :, :3], cache.v[0, :, :3] = first[0], -first[0]
    k_new, v_new = (torch.randn(2, 1, 2, 16, device=DEV) for _ in range(2))
    cache.append(k_new, v_new)
    assert cache.lengths == [5, 2]
    assert torch.equal(cache.k[0, :, 3:5], k_new[0]) and torch.equal(cache.k[1, :, :2], k_new[1])
    q = torch.randn(2, 2, 1, 16, device=DEV)
    out, lse = cache.attend(q, return_lse=True)
    check_per_sequence(out, lse, q, cache.k, cache.v, torch.tensor([5, 2]))


def attend_both_ways(B, Hq, Hkv, D, lengths, n, steps, num_splits=None, dtype=torch.float32, max_len=80):
    """KVCache.attend(q, k_new, v_new) with the append inside the launch (decode_append, the
    default) against append then attend, from the same cache contents: equal outputs, caches and lengths."""
    caches = [KVCache(B, Hkv, max_len, D, dtype=dtype, device=DEV, lengths=lengths) for _ in range(2)]
    old = torch.randn(B, Hkv, max_len, D, device=DEV, dtype=dtype)
    for cache in caches:
        cache.k.copy_(old)
        cache.v.copy_(-old)
    for _ in range(steps):
        q = torch.randn(B, Hq, n, D, device=DEV, dtype=dtype)
        # the new keys as a model makes them: views of a projection, strided
        k_new, v_new = (torch.randn(B, Hkv, 3, n, D, device=DEV, dtype=dtype)[:, :, 1] for _ in range(2))
        plain = caches[0].attend(q, k_new, v_new, num_splits=num_splits, return_lse=True,
                                 kernel_options={"decode_append": False})
        fused = caches[1].attend(q, k_new, v_new, num_splits=num_splits, return_lse=True)
        for a, b in zip(plain, fused):
            assert torch.equal(a, b)
        assert caches[1].seqlens.tolist() == caches[1].lengths == caches[0].lengths
        assert torch.equal(caches[0].k, caches[1].k) and torch.equal(caches[0].v, caches[1].v)
    return caches[1]


@pytest.mark.parametrize("B, Hq, Hkv, D, lengths, n, num_splits", [
    (2, 4, 2, 16, [5, 40], 1, None),        # ragged, one token a step, the heuristic's splits
    (1, 16, 2, 16, [28], 9, 4),             # 8 x 9 rows: two row blocks; new positions 28..36
                                            # cross the chunk boundary at 32 (32-key blocks here)
    (2, 2, 2, 24, [0, 64], 3, 5),           # an empty sequence; head dim not a power of two
])
def test_attend_can_append_inside_its_launch(B, Hq, Hkv, D, lengths, n, num_splits):
    cache = attend_both_ways(B, Hq, Hkv, D, lengths, n, 2, num_splits)
    with pytest.raises(ValueError, match="the cache is full"):
        cache.attend(*(torch.randn(B, H, 80, D, device=DEV) for H in (Hq, Hkv, Hkv)),
                     kernel_options={"decode_append": True})
    with pytest.raises(ValueError, match="q must have the 1 new tokens"):
        cache.attend(torch.randn(B, Hq, 2, D, device=DEV), *(torch.randn(B, Hkv, 1, D, device=DEV)
                                                               for _ in range(2)),
                     kernel_options={"decode_append": True})


def test_a_model_samples_the_same_tokens_with_the_append_inside_the_launch():
    import flashlib
    from flashlib.teach import gpt
    cfg = gpt.GPTConfig(vocab_size=13, block_size=24, n_layer=2, n_head=4, n_kv_head=2, n_embd=32)
    torch.manual_seed(0)
    model = gpt.GPT(cfg).to(DEV)
    prompt = torch.randint(0, 13, (2, 5), device=DEV)
    tokens = [model.generate(prompt, 6, generator=torch.Generator(DEV).manual_seed(1))]
    with flashlib.kernel_options(decode_append=False):
        tokens.append(model.generate(prompt, 6, generator=torch.Generator(DEV).manual_seed(1)))
    assert torch.equal(*tokens)


def test_splits_are_sized_for_the_host_lengths_of_a_kv_cache(monkeypatch):
    # a KVCache knows its lengths on the host: the split count is sized for them (rounded up to
    # SPLIT_LENGTH_STEP, so a decoding loop keeps one plan), equal lengths are not ragged
    step, sizing = kernels.SPLIT_LENGTH_STEP, kernels.split_sizing
    lens = torch.zeros(2, dtype=torch.int32)
    assert sizing(4096, None, longest=100, ragged=True) == (4096, False)   # no lengths: all valid
    assert sizing(4096, lens) == (4096, True)                               # no hint: the worst case
    assert sizing(4096, lens, longest=0, ragged=False) == (step, False)
    assert sizing(4096, lens, longest=step + 1, ragged=True) == (2 * step, True)
    assert sizing(300, lens, longest=290, ragged=False) == (300, False)     # never past the cache
    q, k, _ = inputs(1, 32, 32, 1, 64 * step, 64, torch.float16)
    worst = kernels.launch_plan(q, k, lens[:1])[3]
    sized = kernels.launch_plan(q, k, lens[:1], longest=700, ragged=False)[3]
    assert sized < worst and sized == kernels.num_splits_heuristic(
        1, 32, 1, 3 * step, block_n=kernels.block_n_for(64, 2)[0], sms=kernels.NOMINAL_SMS)
    seen = []
    monkeypatch.setattr("flashlib.decode.flash_decode_forward",
                        lambda *args, **kwargs: seen.append(kwargs) or (args[0], None))
    cache = KVCache(2, 1, 64, 16, dtype=torch.float32, device=DEV, lengths=[5, 5])
    cache.attend(torch.randn(2, 1, 1, 16, device=DEV))
    cache.append(*(torch.randn(2, 1, 2, 16, device=DEV) for _ in range(2)))
    ragged = KVCache(2, 1, 64, 16, dtype=torch.float32, device=DEV, lengths=[5, 9])
    ragged.attend(torch.randn(2, 1, 1, 16, device=DEV))
    flash_decode(torch.randn(2, 1, 1, 16, device=DEV), cache.k, cache.v, cache_seqlens=cache.seqlens)
    assert [(s["longest"], s["ragged"]) for s in seen] == [(5, False), (9, True), (None, None)]
    assert cache.lengths == [7, 7] and cache.seqlens.tolist() == [7, 7]


class RecordedLaunches:
    """Stands in for ``fast_launch`` where launches may be direct (a GPU): records the first
    launch of each plan and the tensors of every replay."""
    def __init__(self):
        self.first, self.replays = [], []

    def fast_launch(self, kernel, grid, *args, kernel_options=None, **kwargs):
        self.first.append((grid, args, kwargs))
        return lambda *tensors: self.replays.append(tensors)


def test_decode_plans_replay_only_calls_with_the_same_key(monkeypatch):
    from flashlib.kernels import launch, score_mod
    monkeypatch.setattr(launch, "SUPPORTED", True)   # direct launches, as on a GPU (a fact, not a switch)
    launches = RecordedLaunches()
    monkeypatch.setattr(kernels, "fast_launch", launches.fast_launch)
    monkeypatch.setattr(kernels, "_plans", {})

    def call(q, k, v, lens, **kwargs):
        kernels.flash_decode_forward(q, k, v, lens, scale=0.25, **kwargs)
        return len(launches.first), len(launches.replays)

    q, k, v = inputs(2, 4, 2, 1, 512, 16, torch.float16)
    lens = torch.tensor([300, 200], dtype=torch.int32)
    assert call(q, k, v, lens, longest=300, ragged=True) == (1, 0)
    q2, k2, v2 = inputs(2, 4, 2, 1, 512, 16, torch.float16)
    lens2 = lens + 1
    assert call(q2, k2, v2, lens2, longest=301, ragged=True) == (1, 1)     # same plan: replayed
    replayed = launches.replays[-1]
    assert replayed[0] is q2 and replayed[1] is k2 and replayed[2] is v2 and replayed[3] is lens2
    # anything a launch depends on makes a new plan; a stale one is never replayed
    others = [dict(q=q.float(), k=k.float(), v=v.float()),                        # dtype
              dict(k=torch.randn(2, 2, 600, 16).half()[:, :, :512]),             # strides
              dict(lens=None), dict(ragged=False), dict(longest=200),             # splits' sizing
              dict(num_splits=3), dict(return_lse=False),
              dict(score_mod=score_mod.make(q, score_mod.Modifiers(softcap=5.0))),
              dict(options=runtime.OPTIONS.replace(fa3_fold_scale=False))]
    for n, change in enumerate(others, start=2):
        args = dict(q=q, k=k, v=v, lens=lens, longest=300, ragged=True) | change
        assert call(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("lens"), **args) == (n, 1), change
    assert launches.first[-4][0] != launches.first[0][0]                           # 3 splits: another grid
    with runtime.kernel_options(launch_hook=lambda *launch_args: None):       # hooks see every launch
        assert call(q, k, v, lens, longest=300, ragged=True) == (len(others) + 2, 1)


def _args():
    q = torch.randn(2, 4, 1, 16, device=DEV)
    k, v = (torch.randn(2, 2, 8, 16, device=DEV) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("bad, match", [
    (dict(cache_seqlens=[3, 4]), "cache_seqlens must be a torch.Tensor"),
    (dict(cache_seqlens=torch.tensor([3.0, 4.0])), "cache_seqlens has dtype torch.float32"),
    (dict(cache_seqlens=torch.tensor([3, 4, 5])), r"cache_seqlens must have shape \(2,\)"),
    (dict(cache_seqlens=torch.tensor([3, 9])), r"cache_seqlens must lie in \[0, 8\]"),
    (dict(cache_seqlens=torch.tensor([-1, 2])), r"cache_seqlens must lie in \[0, 8\]"),
    (dict(cache_seqlens=torch.tensor([3, 4], device="meta")), "cache_seqlens is on meta"),
    (dict(num_splits=0), "num_splits must be a positive int"),
    (dict(num_splits=2.5), "num_splits must be a positive int"),
    (dict(num_splits=True), "num_splits must be a positive int"),
    (dict(scale=float("inf")), "scale must be a finite real number"),
    (dict(q=torch.randn(2, 3, 1, 16)), "heads_q=3 is not a multiple of heads_kv=2"),
    (dict(q=torch.randn(2, 4, 1, 32)), "k has headdim 16 but q has headdim 32"),
    (dict(v=torch.randn(2, 2, 8, 16).half()), "v has dtype torch.float16 but q has torch.float32"),
])
def test_bad_input_names_the_argument(bad, match):
    if runtime.DEVICE.type == "cuda" and "cache_seqlens must lie" in match:
        pytest.skip("values are checked on the host only for CPU tensors")
    q, k, v = _args()
    tensors = {n: bad.pop(n).to(DEV) for n in ("q", "k", "v") if n in bad}
    q, k, v = tensors.get("q", q), tensors.get("k", k), tensors.get("v", v)
    if isinstance(bad.get("cache_seqlens"), torch.Tensor) and bad["cache_seqlens"].device.type != "meta":
        bad["cache_seqlens"] = bad["cache_seqlens"].to(DEV)
    with pytest.raises((ValueError, TypeError), match=match):
        flash_decode(q, k, v, **bad)


@pytest.mark.parametrize("bad, match", [
    (dict(k_new=torch.randn(2, 2, 1, 8)), r"k_new must have shape \(2, 2, n, 16\)"),
    (dict(v_new=torch.randn(2, 2, 1, 16).double()), "v_new is torch.float64"),
    (dict(v_new=torch.randn(2, 2, 2, 16)), "differ"),
])
def test_kv_cache_bad_append_names_the_argument(bad, match):
    cache = KVCache(2, 2, 8, 16, dtype=torch.float32, device=DEV)
    args = dict(k_new=torch.randn(2, 2, 1, 16), v_new=torch.randn(2, 2, 1, 16))
    args.update(bad)
    with pytest.raises((ValueError, TypeError), match=match):
        cache.append(**{n: t.to(DEV) for n, t in args.items()})


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_attend_appending_inside_its_launch(dtype):
    # GQA at a model's sizes, ragged, one token and then 4 draft tokens a step, the heuristic's
    # split count and a forced 16 (new positions at the chunks' edges)
    for num_splits in (None, 16):
        attend_both_ways(8, 32, 8, 128, [4000, 1, 0, 777, 4095, 2048, 100, 3000], 1, 3, num_splits,
                         dtype, max_len=4200)
        attend_both_ways(4, 32, 8, 128, [4000, 63, 64, 1000], 4, 2, num_splits, dtype, max_len=4200)


GPU_CASES = [  # (B, Hq, Hkv, Nq, Lmax, D, seqlens): real sizes
    (1, 8, 8, 1, 131072, 128, None),
    (1, 32, 32, 1, 32768, 64, None),
    (8, 32, 8, 1, 16384, 128, [16384, 1, 0, 5000, 12345, 16000, 777, 9999]),
    (8, 32, 8, 1, 131072, 128, [131072, 100000, 65536, 4097, 30000, 1, 128, 70000]),
    (4, 32, 8, 4, 8192, 128, [8192, 3, 4000, 8190]),            # 4 draft tokens, causal
    (2, 9, 3, 2, 10000, 80, [10000, 6543]),
    (8, 32, 8, 1, 4096, 128, None),                             # unsplit: 128-key blocks
    (16, 32, 8, 3, 3000, 128, None),                            # unsplit, causal, ragged tail block
]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_real_sizes(case, dtype):
    run_and_check(*case, dtype)


@gpu
@pytest.mark.gpu
def test_gpu_split_counts_and_float32():
    for num_splits in (1, 7, 64, 300):
        run_and_check(2, 8, 2, 1, 20000, 128, [20000, 12345], torch.float32, num_splits=num_splits)



@gpu
@pytest.mark.gpu
def test_gpu_one_launch_merge_has_no_race():
    # the last program of each row block to arrive merges: if a merge could start before every
    # split's stores were visible, some of these repeats would differ from the two-kernel result
    # (same partials, same merge code: equal bits). 16 splits x 64 row blocks, ragged lengths.
    q, k, v = inputs(8, 32, 8, 1, 32768, 128, torch.float16)
    lens = torch.tensor([32768, 1, 0, 5000, 12345, 32000, 777, 20000], dtype=torch.int32, device=DEV)
    expected = kernels.combine(*kernels.decode_partial(q, k, v, lens, num_splits=16),
                               out_dtype=q.dtype)
    for _ in range(50):
        out, lse = flash_decode(q, k, v, cache_seqlens=lens, num_splits=16, return_lse=True)
        assert torch.equal(out, expected[0]) and torch.equal(lse, expected[1])
    check_per_sequence(out, lse, q, k, v, lens)


@gpu
@pytest.mark.gpu
def test_gpu_workspace_is_shared_safely():
    # the one-launch path keeps its partials and arrival counters in one workspace per stream:
    # split counts and return_lse alternating, another stream, and two CUDA graphs captured and
    # replayed after eager calls must all give the two-kernel result, bit for bit
    from flashlib.kernels import launch
    q, k, v = inputs(8, 32, 8, 1, 32768, 128, torch.float16)
    lens = torch.tensor([32768, 1, 0, 5000, 12345, 32000, 777, 20000], dtype=torch.int32, device=DEV)

    def expected(s):
        return kernels.combine(*kernels.decode_partial(q, k, v, lens, num_splits=s),
                               out_dtype=q.dtype)

    def decode(s, return_lse=True):
        return flash_decode(q, k, v, cache_seqlens=lens, num_splits=s, return_lse=return_lse)

    want = {s: expected(s) for s in (3, 16, 64)}
    for s in (16, 3, 64, 16, 3):
        out, lse = decode(s)
        assert torch.equal(out, want[s][0]) and torch.equal(lse, want[s][1]), s
        assert torch.equal(decode(s, return_lse=False), want[s][0]), s
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = [decode(s) for s in (16, 3)]
    torch.cuda.current_stream().wait_stream(side)
    for (out, lse), s in zip(got, (16, 3)):
        assert torch.equal(out, want[s][0]) and torch.equal(lse, want[s][1]), s
    graphs, results = [], []
    for s in (16, 64):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            results.append(decode(s))
        graphs.append(graph)
    decode(3)
    for graph, (out, lse), s in zip(graphs, results, (16, 64)):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want[s][0]) and torch.equal(lse, want[s][1]), s
    if launch.enabled(runtime.OPTIONS):   # the direct launches above reused the kernel compiled on the first call
        assert launch._compiled[kernels._decode_partial_kernel]


@gpu
@pytest.mark.gpu
def test_gpu_graph_counters_come_from_a_pool_zeroed_outside_the_graph(monkeypatch):
    # under capture the arrival counters are a fresh slice of a per-device pool zeroed at the first
    # eager call (no memset in the graph); each replay leaves them at 0 for the next one. Without
    # a pool (or once it is used up) they are zeroed in the graph: the same bits either way
    q, k, v = inputs(8, 32, 8, 1, 32768, 128, torch.float16)
    lens = torch.tensor([32768, 1, 0, 5000, 12345, 32000, 777, 20000], dtype=torch.int32, device=DEV)
    want = kernels.combine(*kernels.decode_partial(q, k, v, lens, num_splits=16), out_dtype=q.dtype)
    decode = functools.partial(flash_decode, q, k, v, cache_seqlens=lens, num_splits=16,
                               return_lse=True)
    decode()                                                  # an eager call makes the pool
    pool = kernels._graph_counters[q.device.index]
    for pooled in (True, False):
        if not pooled:
            monkeypatch.delitem(kernels._graph_counters, q.device.index)
        before = pool[1]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, lse = decode()
        assert pool[1] == before + (64 if pooled else 0)     # 8 x 8 row blocks, one counter each
        for _ in range(5):
            out.zero_()
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, want[0]) and torch.equal(lse, want[1]), pooled
        if pooled:
            assert torch.all(pool[0][before:pool[1]] == 0)    # left at 0 for the next replay


def test_fast_launch_signature_separates_what_triton_specializes_on():
    # a remembered kernel is reused only for calls that Triton would compile the same way: tensor
    # dtype and 16-byte alignment, and the value of every other argument, must all match
    from flashlib.kernels import launch
    a, b = torch.zeros(64), torch.ones(64)
    sig = lambda *args, **kw: launch._signature(0, args, kw)          # noqa: E731
    assert sig(a, 16, BLOCK=64) == sig(b, 16, BLOCK=64)               # other data, same kernel
    assert sig(a, 16, BLOCK=64) != sig(a[1:], 16, BLOCK=64)           # 4 bytes off alignment
    assert sig(a, 16, BLOCK=64) != sig(a.half(), 16, BLOCK=64)
    assert sig(a, 16, BLOCK=64) != sig(a, 17, BLOCK=64)               # ints: divisibility, value
    assert sig(a, 16, BLOCK=64) != sig(a, 16, BLOCK=32)
    assert launch._signature(0, (a,), {}) != launch._signature(1, (a,), {})   # another device
    if runtime.INTERPRET:
        assert not launch.enabled(runtime.OPTIONS)                                     # the interpreter: plain calls


def test_torch_compile_runs_the_same_kernels():
    # under torch.compile flash_decode is one op (flashlib::flash_decode): same results,
    # fake outputs of the real shapes and strides (torch.library.opcheck)
    from flashlib.decode import _flash_decode_op
    q, k, v = inputs(2, 4, 2, 2, 50, 16, torch.float32)
    lens = torch.tensor([50, 20], device=DEV)

    def decode(q, k, v, lens):
        return flash_decode(q, k, v, cache_seqlens=lens, num_splits=3, return_lse=True)
    for compiled, eager in zip(torch.compile(decode, backend="aot_eager")(q, k, v, lens),
                               decode(q, k, v, lens)):
        assert torch.equal(compiled, eager)
    from flashlib.kernels.score_mod import NO_MODIFIERS, Modifiers
    options = runtime.OPTIONS.op_args()
    torch.library.opcheck(_flash_decode_op, (q, k, v, lens, 3, 0.25, *NO_MODIFIERS.op_args(), options))
    mods = Modifiers(4.0, torch.rand(2, 4, device=DEV)).op_args()
    torch.library.opcheck(_flash_decode_op, (q, k, v, None, None, 0.25, *mods, options))


@gpu
@pytest.mark.gpu
def test_gpu_compiled_with_cuda_graphs_matches_eager():
    # mode="reduce-overhead" warms up and replays CUDA graphs in a memory pool of its own, which
    # refuses any buffer that outlives a call (the eager path keeps its scratch per stream)
    q, k, v = inputs(2, 32, 8, 1, 4096, 128, torch.float16)
    lens = torch.tensor([4000, 1500], device=DEV, dtype=torch.int32)

    def decode(q, k, v, lens):
        return flash_decode(q, k, v, cache_seqlens=lens)
    compiled = torch.compile(decode, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):   # warm-up, recording, replay
        out = compiled(q, k, v, lens)
    assert torch.equal(out, decode(q, k, v, lens))
