"""The production suite's CPU-testable parts: the pack, its FLOPs, ALiBi's slopes, the pages, the
checks, the ratios, the plot and the table (``flashlib.bench.production``; the timings need a GPU)."""
import math

import pytest
import torch

from flashlib.bench import production as prod
from flashlib.decode import flash_decode
from flashlib.kernels.dispatch import attention_flops
from test_bench import RECORD_KEYS


def test_document_lengths_fill_the_pack_with_a_spread_of_lengths():
    lengths = prod.document_lengths(prod.PACK_TOKENS, prod.PACK_DOCS)
    assert len(lengths) == 16 and sum(lengths) == 32768 and min(lengths) >= 1
    assert lengths == prod.document_lengths(32768, 16)                 # fixed seed
    assert max(lengths) > 3 * 2048 and min(lengths) < 2048 / 4          # long and short documents
    for total, count in ((10, 10), (97, 5), (1000, 1)):
        got = prod.document_lengths(total, count, seed=3)
        assert sum(got) == total and len(got) == count and min(got) >= 1
    with pytest.raises(ValueError):
        prod.document_lengths(4, 5)


def test_offsets_and_document_ids_with_an_empty_document():
    cu = prod.cu_seqlens([3, 0, 2, 1])
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 3, 3, 5, 6]
    assert prod.document_ids(cu).tolist() == [0, 0, 0, 2, 2, 3]
    assert prod.checked_documents([3, 0, 2, 1]) == [(0, 3), (5, 6)]   # first/longest, last/shortest
    assert prod.checked_documents([4, 9, 1, 5, 2]) == [(0, 4), (4, 13), (13, 14), (19, 21)]


def test_packed_flops_sum_the_documents_and_keep_the_harness_formula():
    H, D = 16, 128
    assert prod.packed_flops([2048] * 16, H, D, causal=True) == attention_flops(16, H, 2048, 2048, D, causal=True)
    lengths = [5, 17, 9, 1]
    assert prod.packed_flops(lengths, H, D, causal=False) == 4 * H * D * (25 + 289 + 81 + 1)
    assert prod.packed_density(lengths) == (25 + 289 + 81 + 1) / 32 ** 2
    T = sum(lengths)
    rec = prod.record("varlen", "c", "fwd_bwd", "flashlib_varlen", torch.float16, B=1, H=H, Nq=T, Nk=T,
                      D=D, causal=True, density=prod.packed_density(lengths), ms=2.0,
                      flops=prod.packed_flops(lengths, H, D, causal=True))
    assert RECORD_KEYS <= set(rec) and rec["dtype"] == "float16"
    # what tests/test_bench.py recomputes from a committed record
    flops = 4 * rec["B"] * rec["Hq"] * rec["Nq"] * rec["Nk"] * rec["D"] * 0.5 * rec["density"]
    assert math.isclose(rec["tflops"], flops * 3.5 / 2.0 / 1e9, rel_tol=1e-9)


def test_alibi_slopes_are_the_papers_geometric_sequence():
    assert prod.alibi_slopes(8).tolist() == [2.0 ** -h for h in range(1, 9)]
    assert prod.alibi_slopes(12).tolist() == pytest.approx(
        [2.0 ** -h for h in range(1, 9)] + [2.0 ** -h for h in (0.5, 1.5, 2.5, 3.5)])
    assert prod.alibi_slopes(1).tolist() == [2.0 ** -8]


def test_pages_hold_the_cache_in_shuffled_order_and_decode_alike():
    B, Hkv, L, D, P = 2, 1, 40, 16, 16
    _, k, v = prod.make_inputs(B, 1, Hkv, 1, L, D, torch.float32, "cpu")
    order, table = prod.page_order(B, 3)
    assert sorted(order.tolist()) == list(range(6)) and order.tolist() != list(range(6))
    pages = prod.to_pages(k, P, order)                                  # (6, Hkv, P, D)
    pos = torch.arange(L)
    for b in range(B):
        assert torch.equal(pages[table[b, pos // P].long(), :, pos % P].transpose(0, 1), k[b])
    q, _, _ = prod.make_inputs(B, 4, Hkv, 1, 1, D, torch.float32, "cpu")
    lens = torch.tensor([40, 23], dtype=torch.int32)
    want = flash_decode(q, k, v, cache_seqlens=lens)
    got = flash_decode(q, pages, prod.to_pages(v, P, order), cache_seqlens=lens, block_table=table)
    assert torch.allclose(got, want, atol=1e-5)


def test_setups_check_against_the_oracle_and_measure_notes_failures():
    call, inputs, check = prod.varlen_setup("flashlib_varlen", (5, 17, 9, 1), 2, 16, torch.float32)
    with torch.no_grad():
        out = call(*inputs)
    assert out.shape == (32, 2, 16) and check(out)[1]
    assert not check(out.roll(1, dims=0))[1]                            # rows of another document
    call, inputs, check = prod.score_mod_setup("flashlib_alibi", "alibi", 1, 2, 37, 16, True, torch.float32)
    with torch.no_grad():
        assert check(call(*inputs))[1]
        plain = prod.flash_attention(*inputs, causal=True)
    assert not check(plain)[1]                                          # the slopes matter
    wrong = prod.measure(lambda: (lambda x: x, (torch.ones(1, 1, 2, 1),),
                                  lambda out: (0.5, False)))
    assert wrong == {"fwd": (None, None, "wrong: max error 0.5 over tolerance"),
                     "fwd_bwd": (None, None, "wrong: max error 0.5 over tolerance")}
    refused = prod.measure(lambda: 1 / 0)
    assert all(ms is None and note.startswith("unsupported: ZeroDivisionError")
               for ms, _, note in refused.values())


def fake_records():
    common = dict(dtype=torch.float16, D=64, causal=True)
    rs = [prod.record("varlen", "d64 causal, 16 docs", op, impl, B=b, H=32, Nq=n, Nk=n, ms=ms, flops=f, **common)
          for op in prod.OPS for impl, b, n, ms, f in (
              ("flashlib_dense", 16, 2048, 1.0, 1e9), ("flashlib_varlen", 1, 32768, 2.0, 3e9),
              ("flex_document", 1, 32768, 2.5, 3e9))]
    rs += [prod.record("score_mod", "d64 N4096 causal", "fwd", impl, B=8, H=32, Nq=4096, Nk=4096, ms=ms,
                       flops=1e9, mod=mod, **common)
           for impl, mod, ms in (("flashlib", "none", 1.0), ("flashlib_softcap", "softcap", 1.25),
                                 ("flashlib_alibi", "alibi", 1.1), ("flex_softcap", "softcap", 2.5),
                                 ("flex_alibi", "alibi", None))]
    rs[-1]["note"] = "wrong: max error 1 over tolerance"
    for impl, gbps, graph in (("flashlib_contiguous", 3000.0, 2000.0), ("flashlib_paged16", 2700.0, None),
                              ("flashlib_paged256", 3300.0, 2200.0)):
        rs.append(dict(prod.record("paged_decode", "mha L4096", "decode", impl, torch.float16, B=1, H=32, Nq=1,
                                   Nk=4096, D=128, causal=False, ms=1.0, flops=1e9), gbps=gbps, gbps_graph=graph))
    return rs


def test_ratios_are_throughput_over_the_baselines_in_the_same_part_case_and_op():
    rs = {(r["part"], r["op"], r["impl"]): r for r in prod.add_ratios(fake_records())}
    varlen = rs[("varlen", "fwd_bwd", "flashlib_varlen")]
    assert varlen["ratio_vs_flashlib_dense"] == 1.5 and varlen["ratio_vs_flex"] == 1.25   # TFLOP/s
    assert rs[("varlen", "fwd", "flex_document")]["ratio_vs_flex"] == 1.0
    softcap, alibi = rs[("score_mod", "fwd", "flashlib_softcap")], rs[("score_mod", "fwd", "flashlib_alibi")]
    assert softcap["ratio_vs_flashlib"] == 0.8 and softcap["ratio_vs_flex"] == 2.0
    assert alibi["ratio_vs_flashlib"] == 0.909 and alibi["ratio_vs_flex"] is None        # flex failed
    assert rs[("score_mod", "fwd", "flashlib")]["ratio_vs_flex"] is None                  # no plain flex
    paged = rs[("paged_decode", "decode", "flashlib_paged256")]
    assert paged["ratio_vs_contiguous"] == 1.1 and paged["ratio_vs_contiguous_graph"] == 1.1
    assert rs[("paged_decode", "decode", "flashlib_paged16")]["ratio_vs_contiguous_graph"] is None
    assert all(RECORD_KEYS <= set(r) and r["ratio_vs_sdpa_flash"] is None for r in rs.values())


def test_plot_and_table(tmp_path, capsys):
    records = prod.add_ratios(fake_records())
    prod.plot(records, tmp_path / "production.png", "test")
    assert (tmp_path / "production.png").stat().st_size > 0
    prod.print_table(records)
    printed = capsys.readouterr().out
    assert "paged_decode" in printed and "3.30" in printed and "1.250" in printed and "wrong" in printed


def test_jobs_list_every_case_with_flex_last_and_filter_by_name():
    full, quick = prod.jobs(torch.float16), prod.jobs(torch.float16, quick=True)
    assert len(full) == 17 * 3 + 2 * 3 + 3 * 5 and len(quick) == 5 * 3 + 3 + 5
    flex = [impl.startswith("flex") for _, impl, _ in full]
    assert flex == sorted(flex) and sum(flex) == 2 + 6
    assert {p for p, _, _ in prod.jobs(torch.float16, impls=["paged_decode"])} == {"paged_decode"}
    assert [i for _, i, _ in prod.jobs(torch.float16, True, impls=["flashlib_alibi", "flex_document"])] == \
        ["flashlib_alibi", "flex_document"]
