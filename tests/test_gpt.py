"""flashlib.teach.gpt: the capstone's GPT on flashlib's kernels (through the interpreter on a CPU).

Its attention against a float64 oracle model (training forward and gradients), sampling with the
KV cache against recomputing the sequence (the same tokens and logits), grouped-query heads, the
tokenizer, the batches, and clear errors for bad configurations and arguments.
"""
import pytest
import torch

from flashlib.teach import gpt
from flashlib import runtime
from flashlib.reference import attention_naive, attention_ref
from flashlib.testing import assert_close

DEV = runtime.DEVICE


def _oracle(q, k, v, cache=None):
    return attention_ref(q, k, v, causal=True)[0].to(q.dtype)


def _naive(q, k, v, cache=None):
    return attention_naive(q, k, v, causal=True)


def _models(seed=0, **overrides):
    cfg = gpt.GPTConfig(**{**dict(vocab_size=11, block_size=24, n_layer=2, n_head=4, n_kv_head=2,
                                  n_embd=32), **overrides})
    torch.manual_seed(seed)
    model = gpt.GPT(cfg).to(DEV)
    oracle = gpt.GPT(cfg, attention=_oracle).to(DEV, torch.float64)
    naive = gpt.GPT(cfg, attention=_naive).to(DEV)
    for other in (oracle, naive):
        other.load_state_dict(model.state_dict())
    return cfg, model, oracle, naive


def test_training_loss_and_gradients_match_the_oracle():
    cfg, model, oracle, naive = _models()
    idx = torch.randint(0, cfg.vocab_size, (2, 19), device=DEV)       # 19: not a block multiple
    targets = torch.randint(0, cfg.vocab_size, (2, 19), device=DEV)
    results = []
    for m in (model, oracle, naive):
        logits, loss = m(idx, targets)
        loss.backward()
        results.append((logits, loss, {n: p.grad for n, p in m.named_parameters()}))
    (logits, loss, grads), (logits64, loss64, grads64), (logits32, loss32, grads32) = results
    assert logits.shape == (2, 19, cfg.vocab_size)
    assert_close(logits, logits64, baseline=logits32, dtype=torch.float32)
    assert_close(loss, loss64, baseline=loss32, dtype=torch.float32)
    for name in grads:
        assert_close(grads[name], grads64[name], baseline=grads32[name], dtype=torch.float32, name=name)


def test_cached_logits_equal_recomputed_ones():
    cfg, model, oracle, naive = _models(1)
    idx = torch.randint(0, cfg.vocab_size, (3, 12), device=DEV)
    caches = model.new_caches(3, 12)
    assert [c.k.shape for c in caches] == [(3, 2, 12, 8)] * cfg.n_layer
    with torch.no_grad():
        for start, stop in ((0, 9), (9, 10), (10, 12)):          # prefill, 1 token, 2 tokens
            logits, _ = model(idx[:, start:stop], caches=caches)
            assert [c.lengths for c in caches] == [[stop] * 3] * cfg.n_layer
            assert_close(logits, oracle(idx[:, :stop])[0][:, start:stop],
                         baseline=naive(idx[:, :stop])[0][:, start:stop], dtype=torch.float32)


def test_generate_with_and_without_the_cache_samples_the_same_tokens():
    cfg, model, _, _ = _models(2, n_kv_head=1)
    prompt = torch.randint(0, cfg.vocab_size, (2, 5), device=DEV)
    runs = [model.generate(prompt, 6, top_k=5, use_cache=use_cache,
                           generator=torch.Generator(DEV).manual_seed(3)) for use_cache in (True, False)]
    assert runs[0].shape == (2, 11) and torch.equal(runs[0][:, :5], prompt)
    assert torch.equal(runs[0], runs[1])
    assert int(runs[0].min()) >= 0 and int(runs[0].max()) < cfg.vocab_size


def test_top_k_one_is_greedy():
    cfg, model, _, _ = _models(4)
    prompt = torch.randint(0, cfg.vocab_size, (1, 4), device=DEV)
    out = model.generate(prompt, 3, top_k=1)
    with torch.no_grad():
        for t in range(4, 7):
            assert int(out[0, t]) == int(model(out[:, :t])[0][0, -1].argmax())


def test_tokenizer_and_batches_round_trip():
    text = gpt.corpus()
    assert "def attend(" in text and len(text) > 10_000
    tok = gpt.CharTokenizer(text)
    ids = tok.encode(text[:500])
    assert tok.decode(ids) == text[:500] and tok.vocab_size == len(set(text))
    x, y = next(gpt.batches(ids, 4, 16, generator=torch.Generator().manual_seed(0)))
    assert x.shape == y.shape == (4, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.encode("\x00")
    with pytest.raises(ValueError, match="block_size=16"):
        next(gpt.batches(ids[:16], 4, 16))


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_embd=30, n_head=4), "n_embd=30 is not a multiple of n_head=4"),
    (dict(n_head=4, n_kv_head=3), "n_head=4 is not a multiple of n_kv_head=3"),
    (dict(n_layer=0), "n_layer must be a positive int"),
    (dict(block_size=2.5), "block_size must be a positive int"),
])
def test_bad_configs_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        gpt.GPTConfig(vocab_size=11, **kwargs)


def test_bad_generate_arguments_are_named():
    cfg, model, _, _ = _models(5)
    prompt = torch.zeros(1, 20, dtype=torch.long, device=DEV)
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(prompt, 5)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(prompt[:, :3], 2, temperature=0.0)
    with pytest.raises(ValueError, match="block_size=24"):
        model(torch.zeros(1, 25, dtype=torch.long, device=DEV))
    ragged = [gpt.KVCache(2, cfg.n_kv_head, 8, 8, dtype=torch.float32, device=DEV, lengths=[1, 3])
              for _ in range(cfg.n_layer)]
    with pytest.raises(ValueError, match=r"lengths \[1, 3\]"):
        model(torch.zeros(2, 1, dtype=torch.long, device=DEV), caches=ragged)


def test_kv_cache_switch_picks_the_class_new_caches_builds():
    class Recorded(gpt.KVCache):
        pass
    cfg = gpt.GPTConfig(vocab_size=11, block_size=24, n_layer=2, n_head=4, n_kv_head=2, n_embd=32)
    assert all(type(c) is gpt.KVCache for c in gpt.GPT(cfg).to(DEV).new_caches(2, 8))
    caches = gpt.GPT(cfg, kv_cache=Recorded).to(DEV).new_caches(2, 8)
    assert [type(c) for c in caches] == [Recorded] * 2 and caches[0].k.shape == (2, 2, 8, 8)


def test_compiled_model_has_nothing_around_flashlib_that_sdpa_lacks():
    # issue 54: under torch.compile flashlib's ops sit where SDPA's do: one graph (no break), and
    # the forward and backward graphs AOTAutograd builds hold the same operators besides
    # attention (no copy or contiguous call added around the ops; SDPA's alone detaches its outputs,
    # and its CUDA kernels return more outputs to unpack: getitem nodes are not counted)
    from collections import Counter
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from flashlib.bench.model import TINY_GPT, build
    from flashlib.bench.sdpa_attend import sdpa_attend
    idx, targets = (torch.randint(0, TINY_GPT.vocab_size, (2, 32), device=DEV) for _ in range(2))
    graphs = {}
    for name, attention in (("flashlib", gpt.attend), ("sdpa", sdpa_attend)):
        found = graphs[name] = []

        def keep(gm, example_inputs, found=found):
            found.append(Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function"))
            return make_boxed_func(gm.forward)
        torch._dynamo.reset()
        model = torch.compile(build(TINY_GPT, attention), backend=aot_autograd(fw_compiler=keep, bw_compiler=keep))
        model(idx, targets)[1].backward()
    assert len(graphs["flashlib"]) == 2, "one forward and one backward graph: no graph break"
    forward, backward = graphs["flashlib"]
    assert forward["flashlib.fa2_forward.default"] == backward["flashlib.fa2_backward.default"] == TINY_GPT.n_layer
    for ours, sdpa in zip(graphs["flashlib"], graphs["sdpa"]):
        others = [Counter({op: n for op, n in graph.items() if "flash" not in op and "scaled_dot" not in op
                           and op not in ("aten.detach.default", "<built-in function getitem>")})
                  for graph in (ours, sdpa)]
        assert others[0] == others[1]
