"""The model suite (``python -m flashlib.bench --suite model``) at its tiny sizes on a CPU.

Structure and correctness, never speed: the tiny suite runs end to end through the interpreter
(training steps, decoding, the first step of fresh processes) and writes records in the harness's
format whose ratio is SDPA's time over flashlib's from the same run; an earlier file's records of
parts not run are kept; a wrong attention is caught by the checks and never timed; SDPA's decode
on its preallocated cache samples what flashlib's does.
"""
import json

import pytest
import torch

from flashlib import runtime
from flashlib.bench import model as bench_model
from flashlib.bench.__main__ import main
from flashlib.bench.sdpa_attend import SDPACache, sdpa_attend
from flashlib.teach import gpt

RECORD_KEYS = {"op", "impl", "dtype", "B", "Hq", "Hkv", "Nq", "Nk", "D", "causal", "density", "ms",
               "tflops", "gbps", "peak_mem_gb", "ratio_vs_sdpa_flash", "ratio_vs_sdpa_default",
               "tokens_per_s", "model", "layers"}


def test_tiny_suite_end_to_end(tmp_path, capsys):
    dtype = "float32" if runtime.DEVICE.type == "cpu" else "bfloat16"
    earlier = bench_model.record("train_step_compiled", "flashlib", "gpt2", bench_model.TINY_GPT, 2, 32, 32,
                                 getattr(torch, dtype), ms=1.0)
    (tmp_path / f"model_{dtype}.json").write_text(json.dumps(dict(env={}, records=[earlier])))
    main(["--suite", "model", "--tiny", "--parts", "train,decode,first", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "[model" in printed and "decode gpt2 B2" in printed      # a progress line per stage
    data = json.loads((tmp_path / f"model_{dtype}.json").read_text())
    assert {"gpu", "sm_count", "torch", "triton", "cuda", "date", "autotune"} <= set(data["env"])
    assert data["env"]["parts"] == ["train", "decode", "first"] and data["env"]["timing"]["rounds"] >= 2
    assert (tmp_path / f"model_{dtype}.png").stat().st_size > 0
    records = data["records"]
    assert records[0] == earlier                                    # a part not run is kept
    rows = {}
    for r in records[1:]:
        assert RECORD_KEYS <= set(r), RECORD_KEYS - set(r)
        assert r["ms"] is not None and r["ms"] > 0 and "note" not in r, r   # checked, then timed
        rows.setdefault((r["op"], r["model"], r["B"], r["Nq"]), {})[r["impl"]] = r
    assert sorted({key[:2] for key in rows}) == [("first_step", "gpt2"), ("generate", "gpt2"),
                                                 ("train_step", "gpt2"), ("train_step", "llama")]
    for (op, name, B, Nq), pair in rows.items():
        assert set(pair) == {"flashlib", "sdpa_default"}
        mine, sdpa = pair["flashlib"], pair["sdpa_default"]
        assert mine["ratio_vs_sdpa_default"] == round(sdpa["ms"] / mine["ms"], 3)
        assert sdpa["ratio_vs_sdpa_default"] == 1.0
        if op != "first_step":
            tokens = B if op == "generate" else B * Nq                # new tokens a step
            assert mine["tokens_per_s"] == pytest.approx(tokens / mine["ms"] * 1e3, rel=1e-2, abs=1)
        if op == "generate":
            assert (mine["Nq"], mine["Nk"]) == (1, mine["prompt"] + mine["new_tokens"])
            assert mine["prefill_ms"] > 0
        if op == "first_step":
            assert mine["process_s"] > 0 and mine["autotune"] is not None
        if op == "train_step":
            assert mine["tflops"] > 0
    llama = rows["train_step", "llama", 1, 32]["flashlib"]
    assert (llama["Hq"], llama["Hkv"], llama["D"]) == (4, 2, 16)    # grouped heads


def test_a_wrong_attention_is_caught_and_not_timed(monkeypatch):
    def not_causal(q, k, v, cache=None):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=q.shape[1] != k.shape[1])
    monkeypatch.setitem(bench_model.ATTENTION, "flashlib", not_causal)
    p = bench_model.plan(tiny=True)
    records = bench_model.train_rows("gpt2", bench_model.TINY_GPT, 2, 32, torch.float32, "train", p,
                                     lambda msg: None)
    mine, sdpa = records
    assert mine["ms"] is None and mine["note"].startswith("wrong attention output")
    assert sdpa["ms"] > 0 and "note" not in sdpa

    def refuses(q, k, v, cache=None):
        raise RuntimeError("no kernel for this shape")
    monkeypatch.setitem(bench_model.ATTENTION, "flashlib", refuses)
    mine, sdpa = bench_model.train_rows("gpt2", bench_model.TINY_GPT, 2, 32, torch.float32, "train", p,
                                        lambda msg: None)
    assert mine["ms"] is None and "RuntimeError: no kernel for this shape" in mine["note"]
    assert sdpa["ms"] > 0 and "note" not in sdpa                    # the other one still is timed


def test_sdpa_decode_on_its_preallocated_cache_samples_what_flashlib_does():
    cfg = gpt.GPTConfig(vocab_size=13, block_size=24, n_layer=2, n_head=4, n_kv_head=2, n_embd=32)
    models = [bench_model.build(cfg, bench_model.ATTENTION[i], bench_model.CACHE[i]) for i in bench_model.IMPLS]
    prompt = torch.randint(0, 13, (2, 9), device=runtime.DEVICE)
    caches = models[1].new_caches(2, 15)
    assert isinstance(caches[0], SDPACache) and caches[0].k.shape == (2, 2, 15, 8)
    out = [m.generate(prompt, 6, top_k=1) for m in models]              # greedy: same tokens
    assert torch.equal(out[0], out[1])
    with pytest.raises(ValueError, match="one token at a time"):
        cache = SDPACache(1, 2, 8, 8, dtype=torch.float32, device=runtime.DEVICE)
        q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8)
        sdpa_attend(q, k, k, cache)                         # prefill
        sdpa_attend(q[:, :, :2], k[:, :, :2], k[:, :, :2], cache)
