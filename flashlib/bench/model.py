"""The model suite: what a model's user runs, end to end, on flashlib's attention and on SDPA's.

``python -m flashlib.bench --suite model [--parts train,compiled,decode,first] [--quick] [--tiny]``
times whole models, flashlib against ``F.scaled_dot_product_attention`` with PyTorch's default
dispatch (impl ``sdpa_default``), in one process, in alternating rounds (flashlib, sdpa, flashlib,
sdpa, ...). The attention is the only difference: ``teach.gpt.GPT``'s and ``bench.llama.Llama``'s
``attention=`` switch picks ``teach.gpt.attend`` (flash_attention, causal; KVCache and
flash_decode when sampling) or ``bench.sdpa_attend`` (SDPA, is_causal; a preallocated cache). Parts:

- train (op ``train_step``) and compiled (``train_step_compiled``, ``torch.compile(model,
  dynamic=False)``: one static graph per shape, as a user with fixed shapes gets): forward,
  backward and a fused AdamW step under bfloat16 autocast, of GPT-2 small (12 layers, 12 heads,
  d 768, vocab 50304) at B8 T1024 and B32 T256, and of a Llama-style stack (4 layers, 32 query /
  8 K/V heads of dim 128, SwiGLU, RoPE) at B2 T4096. ms is the median over ``rounds`` x
  ``steps`` steps (CUDA events between steps), warm-up steps excluded; both implementations
  start from the same weights.
- decode (op ``generate``; the decode suite's ``decode`` is attention alone): ``GPT.generate`` of
  GPT-2 small (bfloat16 weights) from a 512-token prompt, B 1 and 8: ms per new token = (median
  time of generating 1 + n tokens - median time of generating 1) / n, so the prefill is not in it
  (``prefill_ms`` beside). SDPA's cache is preallocated like flashlib's (one write per token, no
  re-allocation).
- first (op ``first_step``): the first training step of a fresh process (GPT-2 small B8 T1024,
  eager), default settings (``autotune`` says which), Triton's disk cache warm (from this run's
  train part, or else one untimed process per impl; with ``--tiny`` the interpreter compiles
  nothing); ``process_s`` is the timed process's whole wall time. A timeout is recorded as such.

Every implementation is checked before it is timed (``bench.model_checks``): its attention at the
timed shape (output and gradients) against ``attention_ref``; the model's logits and loss against
a float64 copy of it, SDPA's error the baseline; each part's first step's loss likewise; the
decode logits after a cached prefill and three cached steps against the float64 model
recomputing the sequence; the fresh processes' first losses against each other. A failing (or
raising) one gets a note and no time; the suite goes on.

Records (``benchmarks/results/<gpu>/model_<dtype>.json``, the harness's format, rewritten after
every row so that a run cut short keeps what it measured): ms per step, ``ratio_vs_sdpa_default``
= SDPA's ms / this ms (> 1: flashlib faster), tokens_per_s, tflops (training: 6 x matmul
parameters x tokens + 3.5 x the causal attention's forward FLOPs), model and layers. A run of
some parts keeps the other parts' records of an earlier file. Parts run in the order train,
decode, first, compiled (the longest: one compile per model, shape and attention).

Limits: one process holds both models (peak memory is not recorded); ``--tiny`` (2 layers, d 64,
T 32) runs through the interpreter on a CPU, in float32 without autocast, for tests, not timing.
"""
import json
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn

from .. import runtime
from ..testing import FACTOR, error_floor, max_error, tolerance
from ..teach import gpt
from . import harness
from .llama import Llama, LlamaConfig
from .model_checks import autocast, check_attention, check_decode, check_model, failure, oracle_attend
from .sdpa_attend import SDPACache, sdpa_attend

IMPLS = ("flashlib", "sdpa_default")
PARTS = {"train": "train_step", "compiled": "train_step_compiled", "decode": "generate",
         "first": "first_step"}
GPT2 = gpt.GPTConfig(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768)
LLAMA = LlamaConfig(n_layer=4)
TINY_GPT = gpt.GPTConfig(vocab_size=96, block_size=64, n_layer=2, n_head=2, n_embd=64)
TINY_LLAMA = LlamaConfig(vocab_size=96, block_size=32, n_layer=1, n_head=4, n_kv_head=2,
                         n_embd=64, ffn_hidden=128)


def plan(*, tiny=False, quick=False):
    """The suite's sizes: training rows (name, config, B, T), decode, the first step, step counts."""
    if tiny:
        return dict(train=[("gpt2", TINY_GPT, 2, 32), ("llama", TINY_LLAMA, 1, 32)],
                    decode=dict(cfg=TINY_GPT, batches=(1, 2), prompt=16, new_tokens=8),
                    first=("gpt2", TINY_GPT, 2, 32), warmup=1, rounds=2, steps=2, decode_rounds=3,
                    timeout_s=120, warm_processes=False)   # the interpreter caches nothing on disk
    train = [("gpt2", GPT2, 8, 1024)]
    if not quick:
        train += [("gpt2", GPT2, 32, 256), ("llama", LLAMA, 2, 4096)]
    return dict(train=train, decode=dict(cfg=GPT2, batches=(1, 8), prompt=512, new_tokens=128),
                first=("gpt2", GPT2, 8, 1024), warmup=3, rounds=2, steps=10, decode_rounds=10,
                timeout_s=150, warm_processes=True)   # a first step: 33 s with autotuning (issue 54)


ATTENTION = {"flashlib": gpt.attend, "sdpa_default": sdpa_attend}
CACHE = {"flashlib": None, "sdpa_default": SDPACache}     # None: GPT's default, flashlib's KVCache


def float64_copy(cfg, model):
    """The model in float64 with ``attention_ref`` (recomputing, no cache): the checks' oracle."""
    oracle = build(cfg, oracle_attend)
    oracle.load_state_dict(model.state_dict())
    return oracle.to(torch.float64)


def build(cfg, attention, kv_cache=None, *, device=runtime.DEVICE):
    """GPT or Llama (by the config's type) with the given attention, weights from seed 0."""
    torch.manual_seed(0)
    with torch.device(device):
        if isinstance(cfg, LlamaConfig):
            return Llama(cfg, attention=attention)
        return gpt.GPT(cfg, attention=attention, kv_cache=kv_cache)


def shape_of(cfg):
    """(Hq, Hkv, D) of the model's attention (GPTConfig fills n_kv_head in when it is None)."""
    return cfg.n_head, cfg.n_kv_head, cfg.n_embd // cfg.n_head


def sync():
    if runtime.DEVICE.type == "cuda":
        torch.cuda.synchronize()


def timed_calls(fn, n):
    """Milliseconds of each of n back-to-back calls: CUDA events between calls on a GPU (the
    host runs ahead, so each interval is a call's share of the stream), wall time on a CPU."""
    sync()
    if runtime.DEVICE.type != "cuda":
        times = []
        for _ in range(n):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return times
    events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    events[0].record()
    for i in range(n):
        fn()
        events[i + 1].record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in zip(events, events[1:])]


def train_step(model, optimizer, idx, targets, dtype):
    """Forward, backward, optimizer step; returns the loss (a tensor: no sync)."""
    with autocast(dtype):
        _, loss = model(idx, targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def random_tokens(vocab, B, T, seed):
    g = torch.Generator(device=runtime.DEVICE).manual_seed(seed)
    return torch.randint(0, vocab, (B, T), device=runtime.DEVICE, generator=g)


def record(op, impl, name, cfg, B, Nq, Nk, dtype, **extra):
    """One record in the harness's format, plus model and layers; extra adds or overrides fields."""
    Hq, Hkv, D = shape_of(cfg)
    rec = dict(op=op, impl=impl, model=name, layers=cfg.n_layer, dtype=str(dtype).replace("torch.", ""),
               B=B, Hq=Hq, Hkv=Hkv, Nq=Nq, Nk=Nk, D=D, causal=True, density=1.0, ms=None,
               tflops=None, gbps=None, peak_mem_gb=None, ratio_vs_sdpa_flash=None,
               ratio_vs_sdpa_default=None, tokens_per_s=None)
    rec.update(extra)
    return rec


def train_rows(name, cfg, B, T, dtype, part, p, say):
    """Records of one part, "train" (eager) or "compiled", for one (model, B, T)."""
    op = PARTS[part]
    say(f"{op} {name} B{B} T{T}: checks, then first steps" + (" (compiling)" if part == "compiled" else ""))
    models = {impl: build(cfg, ATTENTION[impl]) for impl in IMPLS}
    models["sdpa_default"].load_state_dict(models["flashlib"].state_dict())
    idx, targets = random_tokens(cfg.vocab_size, B, T, 1), random_tokens(cfg.vocab_size, B, T, 2)
    notes = {}
    for impl in IMPLS:             # a check that raises (out of memory, a refused shape) is a note
        try:
            notes[impl] = check_attention(ATTENTION[impl], *shape_of(cfg), B, T, dtype)
        except Exception as e:
            notes[impl] = f"attention check {failure(e)}"
    try:
        model_notes, ref_loss, sdpa_loss = check_model(models, float64_copy(cfg, models["sdpa_default"]),
                                                       idx, targets, dtype)
        notes = {impl: notes[impl] or model_notes[impl] for impl in IMPLS}
    except Exception as e:
        notes = {impl: notes[impl] or f"model check {failure(e)}" for impl in IMPLS}
    times = runners = optimizers = steps = {}
    try:
        runners = {impl: torch.compile(m, dynamic=False) if part == "compiled" else m
                   for impl, m in models.items()}
        optimizers = {impl: torch.optim.AdamW(m.parameters(), lr=1e-4, fused=runtime.DEVICE.type == "cuda")
                      for impl, m in models.items()}
        steps = {impl: (lambda r=runners[impl], o=optimizers[impl]: train_step(r, o, idx, targets, dtype))
                 for impl in IMPLS}
        for impl in IMPLS:         # the first step (compiles, autotunes) from the checked weights
            if notes[impl] is None:
                loss = steps[impl]()
                if not max_error(loss, ref_loss) <= tolerance(ref_loss, sdpa_loss, dtype):
                    notes[impl] = f"wrong first-step loss {loss.item():.5g}, float64 {ref_loss.item():.5g}"
        live = [impl for impl in IMPLS if notes[impl] is None]
        for impl in live:
            timed_calls(steps[impl], p["warmup"] - 1)
        say(f"{op} {name} B{B} T{T}: timing {p['rounds']} x {p['steps']} steps")
        times = {impl: [] for impl in live}
        for _ in range(p["rounds"]):
            for impl in live:
                times[impl] += timed_calls(steps[impl], p["steps"])
    except Exception as e:         # a failed compile or step: the row says so, the suite goes on
        notes, times = {impl: notes[impl] or failure(e) for impl in IMPLS}, {}
    matmul_params = sum(m.weight.numel() for m in models["flashlib"].modules() if isinstance(m, nn.Linear))
    Hq, _, D = shape_of(cfg)
    # 6 FLOPs per matmul weight and token (forward 2, backward 4), 3.5x causal attention's forward
    flops = 6 * matmul_params * B * T + 3.5 * cfg.n_layer * 2 * B * Hq * T * T * D
    records = []
    for impl in IMPLS:
        rec = record(op, impl, name, cfg, B, T, T, dtype)
        if impl in times:
            ms = statistics.median(times[impl])
            rec.update(ms=ms, tokens_per_s=round(B * T / ms * 1e3), tflops=flops / ms / 1e9)
        else:
            rec["note"] = notes[impl]
        records.append(rec)
    del models, runners, optimizers, steps
    if runtime.DEVICE.type == "cuda":
        torch.cuda.empty_cache()
    return records


def decode_rows(dtype, p, say):
    """Records of the decode part: ms per new token of GPT.generate, B in p["decode"]["batches"]."""
    d = p["decode"]
    cfg, T0, n = d["cfg"], d["prompt"], d["new_tokens"]
    models = {impl: build(cfg, ATTENTION[impl], CACHE[impl]).to(dtype) for impl in IMPLS}
    models["sdpa_default"].load_state_dict(models["flashlib"].state_dict())
    records = []
    for B in d["batches"]:
        prompt = random_tokens(cfg.vocab_size, B, T0, 4)
        say(f"decode gpt2 B{B}: check, then {p['decode_rounds']} rounds of generate({T0} + {n})")
        try:
            extra = random_tokens(cfg.vocab_size, B, 3, 3)                 # three cached steps
            notes = check_decode(models, float64_copy(cfg, models["sdpa_default"]), prompt, extra, dtype)
            live = [impl for impl in IMPLS if notes[impl] is None]
            times = {(impl, k): [] for impl in live for k in (1, 1 + n)}
            for impl in live:                                              # warm-up, untimed
                for k in (1, 1 + n):
                    models[impl].generate(prompt, k)
            for _ in range(p["decode_rounds"]):
                for impl in live:
                    for k in (1, 1 + n):
                        times[impl, k] += timed_calls(lambda: models[impl].generate(prompt, k), 1)
        except Exception as e:     # the row says so, the suite goes on
            notes, live = {impl: failure(e) for impl in IMPLS}, []
        for impl in IMPLS:
            rec = record("generate", impl, "gpt2", cfg, B, 1, T0 + n, dtype, prompt=T0, new_tokens=n,
                         prefill_ms=None)
            if impl in live:
                # medians on a GPU; on a shared CPU (--tiny) other processes only ever add time
                summary = statistics.median if runtime.DEVICE.type == "cuda" else min
                prefill, total = (summary(times[impl, k]) for k in (1, 1 + n))
                ms = (total - prefill) / n
                rec.update(prefill_ms=prefill)
                if ms > 0:
                    rec.update(ms=ms, tokens_per_s=round(B / ms * 1e3, 1))
                else:                      # noise larger than n tokens' time: only --tiny's sizes
                    rec["note"] = (f"no decode time: generate(1 + {n}) {total:.3g} ms, "
                                   f"generate(1) {prefill:.3g}")
            else:
                rec["note"] = notes[impl]
            records.append(rec)
    return records


def first_step_rows(dtype, p, tiny, say, *, warm):
    """Records of the first part: a fresh process's first step, per impl, after a warming one if
    ``warm`` (else Triton's disk cache is warm already: this run's train part compiled the same)."""
    name, cfg, B, T = p["first"]
    command = [sys.executable, "-m", "flashlib.bench.model", "--dtype", str(dtype).replace("torch.", "")]
    results = {}
    for attempt in ("warm-up", "timed") if warm else ("timed",):
        for impl in IMPLS:
            if results.get(impl, {}).get("note"):           # the warm-up failed: say so, go on
                results[impl]["note"] = f"warm-up process {results[impl]['note']}"
                continue
            say(f"first_step {name} B{B} T{T}: {attempt} process, {impl}")
            start = time.perf_counter()
            try:
                done = subprocess.run(command + ["--first-step", impl] + (["--tiny"] if tiny else []),
                                      capture_output=True, text=True, timeout=p["timeout_s"])
                why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1][:160]
                out = (json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0
                       else dict(note=f"failed: {why}"))
            except subprocess.TimeoutExpired:
                out = dict(note=f"timed out after {p['timeout_s']} s")
            results[impl] = dict(out, process_s=round(time.perf_counter() - start, 2))
    sdpa_loss = results["sdpa_default"].get("loss")
    records = []
    for impl in IMPLS:
        got = results[impl]
        rec = record("first_step", impl, name, cfg, B, T, T, dtype, process_s=got["process_s"],
                     autotune=got.get("autotune"))
        note = got.get("note")
        if note is None and sdpa_loss is None:
            note = "unchecked: SDPA's process gave no first loss to compare with"
        elif note is None and not abs(got["loss"] - sdpa_loss) <= FACTOR * error_floor(
                dtype, torch.tensor(sdpa_loss)):
            note = f"wrong: first loss {got['loss']:.5g} against SDPA's {sdpa_loss:.5g}"
        if note is None:
            rec["ms"] = got["ms"]
        else:
            rec["note"] = note
        records.append(rec)
    return records


def first_step(impl, dtype, tiny):
    """In a fresh process: build the model, time its first training step; print one JSON line."""
    name, cfg, B, T = plan(tiny=tiny)["first"]
    model = build(cfg, ATTENTION[impl])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=runtime.DEVICE.type == "cuda")
    idx, targets = random_tokens(cfg.vocab_size, B, T, 1), random_tokens(cfg.vocab_size, B, T, 2)
    losses = []
    ms, = timed_calls(lambda: losses.append(train_step(model, optimizer, idx, targets, dtype)), 1)
    print(json.dumps(dict(ms=ms, loss=losses[0].item(), autotune=harness.environment()["autotune"])))


def run_suite(dtype, out_dir, *, parts=tuple(PARTS), quick=False, tiny=False, say=print):
    """Run the parts, add ratios, write model_<dtype>.json (merged with an earlier file's records
    of the parts not run) and its PNG, print a table; returns the records."""
    start = time.perf_counter()

    def stamp(msg):                # a progress line per stage, shown at once even through a pipe
        say(f"[model {time.perf_counter() - start:6.0f} s] {msg}")
        sys.stdout.flush()

    p = plan(tiny=tiny, quick=quick)
    stem = f"model_{str(dtype).replace('torch.', '')}"
    path = out_dir / f"{stem}.json"
    ran = {PARTS[q] for q in parts}
    kept = [r for r in json.loads(path.read_text())["records"] if r["op"] not in ran] if path.exists() else []
    timing = {k: p[k] for k in ("warmup", "rounds", "steps", "decode_rounds")}
    records = []

    def save(new):                 # after every row: a run cut short keeps what it measured
        records.extend(new)
        harness.add_ratios(records, "sdpa_default")
        path.write_text(json.dumps(dict(env=dict(harness.environment(), parts=list(parts), timing=timing),
                                        records=kept + records), indent=1))
        harness.plot(kept + records, out_dir / f"{stem}.png", f"model {stem[6:]}", value="ms",
                     ylabel="ms per step (generate: per new token)", label=row_label)

    # the compiled part last: the longest (a compile per model and shape), and the least sure
    for part in [q for q in ("train", "decode", "first", "compiled") if q in parts]:
        if part in ("train", "compiled"):
            for name, cfg, B, T in p["train"]:
                save(train_rows(name, cfg, B, T, dtype, part, p, stamp))
        elif part == "decode":
            save(decode_rows(dtype, p, stamp))
        else:
            warm = p["warm_processes"] and not ("train" in parts and p["first"] in p["train"])
            save(first_step_rows(dtype, p, tiny, stamp, warm=warm))
    stamp(f"wrote {path}")
    print_table(kept + records)
    return records


def row_label(r):
    return f"{r['model']} L{r['layers']} B{r['B']} T{r['prompt'] if r['op'] == 'generate' else r['Nq']}"


def print_table(records):
    cell = lambda x, width, spec: f"{'-':>{width}}" if x is None else f"{x:>{width}{spec}}"  # noqa: E731
    print(f"{'op':21}{'impl':14}{'row':24}{'ms':>10}{'tokens/s':>12}{'vs sdpa':>9}  note")
    for r in records:
        print(f"{r['op']:21}{r['impl']:14}{row_label(r):24}{cell(r['ms'], 10, '.2f')}"
              f"{cell(r['tokens_per_s'], 12, ',.0f')}{cell(r['ratio_vs_sdpa_default'], 9, '.2f')}"
              f"  {r.get('note', '')}")


if __name__ == "__main__":   # the first part's fresh process: --first-step IMPL [--tiny] --dtype D
    args = sys.argv[1:]
    first_step(args[args.index("--first-step") + 1], getattr(torch, args[args.index("--dtype") + 1]),
               "--tiny" in args)
