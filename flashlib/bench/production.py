"""The production suite (issue 34): attention as training and serving systems call it.

``python -m flashlib.bench --suite production [--quick] [--dtype bfloat16] [--impl NAME|PART ...]``
on a CUDA GPU writes ``production_<dtype>.json`` and ``.png``: ``flashlib.bench``'s records, each
with a ``part`` and a ``case``. Three parts:

1. ``varlen``: ``flash_attention_varlen`` (``flashlib_varlen``) on one causal pack of PACK_DOCS
   documents, PACK_TOKENS tokens in all, lengths from a fixed-seed log-normal (``document_lengths``:
   186 to 6965, mean 2048), H x D = 2048 at d64 and d128, against ``flashlib_dense``
   (``flash_attention`` on the same total tokens as equal sequences, B = 16 x N = 2048) and
   ``flex_document`` (compiled FlexAttention, mask doc[i] == doc[j] and j <= i). FLOPs are summed
   over documents (each causal, halved), so TFLOP/s of different packings compare; a pack's record
   is B=1, Nq=Nk=total with ``density`` = sum(n^2) / total^2 (the harness's FLOP formula holds) and
   ``seqlens``. The varlen call reads its offsets on the host once per offsets tensor (a device
   sync: the suite's first call; ``inputs.read_once``).
2. ``paged_decode``: one new token at the decode suite's cases (``decode.cases``: B=1 H=32 and
   B=8 Hq=32 Hkv=8, d128, L = 1k .. 128k, the ragged batch): ``flashlib_paged16`` / ``_paged256``
   (``decode_attention`` with a ``block_table``, pages of 16 / 256 tokens in a fixed-seed shuffled
   order) against ``flashlib_contiguous`` (the same call on the contiguous cache). Both are called
   as ``KVCache.attend`` and ``PagedKVCache.attend`` call them: ``cache_seqlens`` with its values
   on the host too (``host_lengths``: the split count sized for them), the table not checked on
   the host (a device sync, which a CUDA graph cannot hold). ``gbps`` (K/V bytes read per second,
   eager ``do_bench``) and ``gbps_graph`` (CUDA-graph replay), as the decode suite measures them.
3. ``score_mod``: ``flash_attention`` with ``softcap=30`` (``flashlib_softcap``) and ALiBi's
   geometric slopes (``flashlib_alibi``) against the plain kernel (``flashlib``) and FlexAttention
   with the same ``score_mod`` (``flex_softcap``: 30 tanh(s / 30); ``flex_alibi``: s - slope[h]
   |i - j|, Nq = Nk), at three forward-suite shapes (B x N = 32k, H x D = 2048); matmul FLOPs only.

Varlen and score modifiers time ``fwd`` and ``fwd_bwd``. Every implementation is first checked
against the float64 oracle (``attention_ref``, same options) on a slice of the output of the very
call it times (batch 0, two heads; for a pack, two heads of four documents, each against its own
oracle; the forward only, as in the harness) with ``flashlib.testing``'s tolerance rule; a wrong,
refused or failing one gets ``ms: None`` and a ``note``, and the suite goes on.

Ratios (``add_ratios``): this record's TFLOP/s (decode: TB/s) over the baseline's in the same
part, case and op (the baseline's time over this one's wherever the work is equal, i.e. all but
``flashlib_dense``): ``ratio_vs_flashlib_dense``, ``ratio_vs_flex`` (varlen); ``ratio_vs_flashlib``,
``ratio_vs_flex`` (same modifier; score_mod); ``ratio_vs_contiguous``, ``_graph`` (paged_decode).
Issue 34's bars: 0.9 / 1.0, 0.9, 0.9 / 1.0. On Hopper the baselines ``flashlib_dense`` and
``flashlib`` run FA3, varlen and the modifiers FA2. ``ratio_vs_sdpa_flash`` is None (no SDPA).
``--quick``: the d128 pack, the first modifier shape, the decode suite's quick cases. FlexAttention
runs last (its compile leaves workers that slowed host-bound rows timed after it, see
``flashlib.bench.decode``), compiled once per shape and grad mode.
"""
import functools
import itertools
import json

import torch
import torch.nn.functional as F

from .. import runtime
from ..decode import decode_attention
from ..kernels.dispatch import attention_flops
from ..ops import flash_attention, flash_attention_varlen
from ..reference import attention_naive, attention_ref
from ..testing import max_error, tolerance
from . import decode as bench_decode
from .harness import time_ms, environment, make_inputs, shape_for

PACK_TOKENS = 32768
PACK_DOCS = 16                  # mean length 2048: the dense baseline's N
PACK_SIGMA = 1.0                # log-normal spread of the lengths
PACK_DIMS, QUICK_PACK_DIMS = (64, 128), (128,)
WIDTH = 2048                    # heads x head dim
PAGE_SIZES = (16, 256)
SOFTCAP = 30.0
# forward-suite shapes: d64 and d128, 4k and 16k, causal and not, but two (D, causal) pairs only:
# the modifiers' FA2 kernels autotune (compile every config) for each pair
MOD_SHAPES = [(64, 4096, True), (128, 4096, False), (128, 16384, False)]
QUICK_MOD_SHAPES = MOD_SHAPES[:1]
OPS = {"fwd": 1.0, "fwd_bwd": 3.5}   # FLOP multiples of the forward


# --- pure Python: the pack, its FLOPs, slopes, pages (tested on the CPU) -------------------------

def document_lengths(total, count, *, sigma=PACK_SIGMA, seed=0):
    """``count`` lengths >= 1 summing to ``total``: 1 + a share of the rest by fixed-seed log-normal
    weights, rounded by largest remainder."""
    import numpy as np
    if not 1 <= count <= total:
        raise ValueError(f"need 1 <= count <= total, got count={count}, total={total}")
    weights = np.random.default_rng(seed).lognormal(0.0, sigma, count)
    share = weights / weights.sum() * (total - count)
    lengths = 1 + np.floor(share).astype(np.int64)
    left = total - int(lengths.sum())
    lengths[np.argsort(-(share - np.floor(share)), kind="stable")[:left]] += 1
    return [int(n) for n in lengths]


def cu_seqlens(lengths, device=None):
    """int32 offsets (len(lengths) + 1,) from 0: document b is rows [cu[b], cu[b + 1])."""
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)


def document_ids(cu):
    """(total,) int64: the document of each packed row (an empty document owns none)."""
    counts = (cu[1:] - cu[:-1]).long()
    return torch.repeat_interleave(torch.arange(counts.numel(), device=cu.device), counts)


def packed_flops(lengths, heads, D, *, causal):
    """Forward FLOPs of attention within each document: sum of 4 H n^2 D (halved for causal)."""
    return sum(attention_flops(1, heads, n, n, D, causal=causal) for n in lengths)


def packed_density(lengths):
    """sum(n^2) / total^2: the pack's FLOPs over those of one sequence of all its tokens."""
    return sum(n * n for n in lengths) / sum(lengths) ** 2


def checked_documents(lengths):
    """(start, end) rows of the documents to check: first, last, longest, shortest non-empty."""
    cu, docs = cu_seqlens(lengths).tolist(), [b for b, n in enumerate(lengths) if n]
    picks = {docs[0], docs[-1], max(docs, key=lengths.__getitem__), min(docs, key=lengths.__getitem__)}
    return [(cu[b], cu[b + 1]) for b in sorted(picks)]


def alibi_slopes(heads):
    """ALiBi's slopes (Press et al., 2022): 2^(-8h/H), h = 1..H, for H a power of two; otherwise
    those of the largest power of two n < H, then every other slope of 2n. float32 (heads,)."""
    def geometric(n):
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]
    n = 1 << (heads.bit_length() - 1)
    return torch.tensor(geometric(n) + geometric(2 * n)[0::2][:heads - n], dtype=torch.float32)


def page_order(batch, max_pages, *, seed=0, shuffled=True):
    """Shuffled pages: logical page s of sequence b is physical page order[b * max_pages + s]
    (shuffled=False: in order, each sequence's pages one run of the pool). Returns (order int64
    (batch * max_pages,), block table int32 (batch, max_pages)), on the CPU."""
    n = batch * max_pages
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)) if shuffled else torch.arange(n)
    return order, order.reshape(batch, max_pages).to(torch.int32)


def to_pages(cache, page_size, order):
    """A cache (B, Hkv, L, D) as pages (B * max_pages, Hkv, page_size, D) in ``page_order``'s order."""
    B, Hkv, L, D = cache.shape
    max_pages = -(-L // page_size)
    padded = F.pad(cache, (0, 0, 0, max_pages * page_size - L))            # (B, Hkv, P*pages, D)
    logical = (padded.reshape(B, Hkv, max_pages, page_size, D).transpose(1, 2)
               .reshape(B * max_pages, Hkv, page_size, D))                  # (B*pages, Hkv, P, D)
    return torch.empty_like(logical).index_copy_(0, order.to(cache.device), logical)


def add_ratios(records):
    """The suite's ratio fields (see the module docstring); None where either side has no time."""
    def ratio(name, part, baseline, value, match=("case", "op")):
        mine = [r for r in records if r["part"] == part]
        base = {tuple(r.get(m) for m in match): r.get(value) for r in mine if baseline(r)}
        for r in mine:
            theirs = base.get(tuple(r.get(m) for m in match))
            r[name] = round(r[value] / theirs, 3) if theirs and r.get(value) else None
    ratio("ratio_vs_flashlib_dense", "varlen", lambda r: r["impl"] == "flashlib_dense", "tflops")
    ratio("ratio_vs_flex", "varlen", lambda r: r["impl"] == "flex_document", "tflops")
    ratio("ratio_vs_flashlib", "score_mod", lambda r: r["impl"] == "flashlib", "tflops")
    ratio("ratio_vs_flex", "score_mod", lambda r: r["impl"].startswith("flex"), "tflops",
          match=("case", "op", "mod"))
    for suffix in ("", "_graph"):
        ratio(f"ratio_vs_contiguous{suffix}", "paged_decode", lambda r: r["impl"] == "flashlib_contiguous",
              f"gbps{suffix}")
    return records


def record(part, case, op, impl, dtype, *, B, H, Nq, Nk, D, causal, Hkv=None, density=1.0,
           flops=None, ms=None, note=None, **extra):
    """One record in the harness's format (Hkv = H unless given), tflops from forward ``flops``."""
    rec = dict(part=part, case=case, op=op, impl=impl, dtype=str(dtype).replace("torch.", ""),
               B=B, Hq=H, Hkv=H if Hkv is None else Hkv, Nq=Nq, Nk=Nk, D=D, causal=causal,
               density=density, ms=ms, tflops=None, gbps=None, peak_mem_gb=None,
               ratio_vs_sdpa_flash=None, **extra, **({"note": note} if note else {}))
    if ms is not None and flops is not None:
        rec["tflops"] = flops * OPS.get(op, 1.0) / ms / 1e9
    return rec


# --- measuring ---------------------------------------------------------------------------------

def _why(kind, e):
    return f"{kind}: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}"


def oracle_check(pairs, dtype, **options):
    """(max error, passed) of each (out, q, k, v), (1, h, n, D) slices, against ``attention_ref``
    with ``options``; the tolerance rule's baseline is naive attention in ``dtype``."""
    worst, ok = 0.0, True
    for out, q, k, v in pairs:
        q, k, v = (t.detach() for t in (q, k, v))
        ref, _ = attention_ref(q, k, v, **options)
        err = max_error(out, ref)
        worst, ok = max(worst, err), ok and err <= tolerance(ref, attention_naive(q, k, v, **options), dtype)
    return worst, ok


def measure(setup):
    """setup() -> (call, inputs, check): check the whole call's output (no autograd) with
    check(out) -> (err, ok), then time each of OPS (``do_bench`` median; fwd_bwd: a fresh forward
    and ``autograd.grad`` of every input). {op: (ms, peak GB, note)}; failures are notes."""
    note = None
    try:
        call, inputs, check = setup()
        with torch.no_grad():
            err, ok = check(call(*inputs))
        note = None if ok else f"wrong: max error {err:.3g} over tolerance"
    except torch.cuda.OutOfMemoryError:
        note = "out of memory"
    except Exception as e:  # FlexAttention missing, a refused shape, ...
        note = _why("unsupported", e)
    results = {op: (None, None, note) for op in OPS}
    for op in OPS if note is None else ():
        try:
            torch.cuda.reset_peak_memory_stats()
            with torch.no_grad():
                ms = time_ms(lambda: call(*inputs)) if op == "fwd" else None
                dout = None if ms else torch.randn_like(call(*inputs))
            if ms is None:
                ms = time_ms(lambda: torch.autograd.grad(call(*inputs), inputs, dout))  # noqa: B023
            results[op] = (ms, round(torch.cuda.max_memory_allocated() / 1e9, 3), None)
        except torch.cuda.OutOfMemoryError:
            results[op] = (None, None, "out of memory")
        except Exception as e:
            results[op] = (None, None, _why("failed", e))
    torch.cuda.empty_cache()
    return results


def timed_records(setup, part, case, impl, dtype, flops, **shape):
    """``measure(setup)`` as one record per op."""
    return [dict(record(part, case, op, impl, dtype, flops=flops, ms=ms, note=note, **shape), peak_mem_gb=peak)
            for op, (ms, peak, note) in measure(setup).items()]


@functools.cache
def _flex():
    """FlexAttention compiled once (a graph per shape, grad mode, modifier) and create_block_mask."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    import torch._dynamo
    torch._dynamo.config.cache_size_limit = 256   # else a silent fallback to unfused attention
    return torch.compile(flex_attention, dynamic=False), create_block_mask


# --- part 1: varlen ----------------------------------------------------------------------------

def varlen_setup(impl, lengths, H, D, dtype):
    """(call, inputs, check) of one varlen-part implementation on the pack ``lengths``."""
    T, dev = sum(lengths), runtime.DEVICE
    if impl == "flashlib_dense":     # the same total tokens as equal sequences
        B, N = len(lengths), T // len(lengths)
        q, k, v = make_inputs(B, H, H, N, N, D, dtype, dev, requires_grad=True)
        return ((lambda q, k, v: flash_attention(q, k, v, causal=True)), (q, k, v),
                lambda out: oracle_check([tuple(t[:1, :2] for t in (out, q, k, v))], dtype, causal=True))
    if impl == "flashlib_varlen":
        q, k, v = (t[0].transpose(0, 1).contiguous().requires_grad_()          # (T, H, D)
                   for t in make_inputs(1, H, H, T, T, D, dtype, dev))
        cu, longest = cu_seqlens(lengths, dev), max(lengths)
        call = lambda q, k, v: flash_attention_varlen(q, k, v, cu, cu, longest, longest, causal=True)  # noqa: E731
        rows = lambda t, s, e: t[s:e, :2].transpose(0, 1).unsqueeze(0)         # noqa: E731 (1, 2, n, D)
    else:                            # flex_document: the same values as (1, H, T, D)
        compiled, create_block_mask = _flex()
        q, k, v = make_inputs(1, H, H, T, T, D, dtype, dev, requires_grad=True)
        doc = document_ids(cu_seqlens(lengths, dev))
        mask = create_block_mask(lambda b, h, i, j: (doc[i] == doc[j]) & (j <= i), None, None, T, T,
                                 device=dev)
        call = lambda q, k, v: compiled(q, k, v, block_mask=mask)   # noqa: E731
        rows = lambda t, s, e: t[:, :2, s:e]                         # noqa: E731
    docs = checked_documents(lengths)
    return call, (q, k, v), lambda out: oracle_check(
        [tuple(rows(t, s, e) for t in (out, q, k, v)) for s, e in docs], dtype, causal=True)


def varlen_records(impl, lengths, D, dtype):
    """Records (fwd, fwd_bwd) of one implementation at head dim D (H = WIDTH / D)."""
    H, T, B = WIDTH // D, sum(lengths), len(lengths)
    if impl == "flashlib_dense":
        shape, flops = dict(B=B, Nq=T // B, Nk=T // B), attention_flops(B, H, T // B, T // B, D, causal=True)
    else:
        shape = dict(B=1, Nq=T, Nk=T, density=packed_density(lengths), seqlens=list(lengths))
        flops = packed_flops(lengths, H, D, causal=True)
    return timed_records(functools.partial(varlen_setup, impl, lengths, H, D, dtype), "varlen",
                         f"d{D} causal, {B} docs", impl, dtype, flops, H=H, D=D, causal=True, **shape)


# --- part 2: paged decode ----------------------------------------------------------------------

def paged_record(case, impl, shape, seqlens, page_size, dtype):
    """Check, then time (eager and CUDA graph) one decode call; returns [record]."""
    B, Hq, Hkv, D, dev = shape["B"], shape["Hq"], shape["Hkv"], shape["D"], runtime.DEVICE
    Lmax = max(seqlens)
    rec = record("paged_decode", case, "decode", impl, dtype, B=B, H=Hq, Hkv=Hkv, Nq=1, Nk=Lmax, D=D,
                 causal=False, density=sum(seqlens) / (B * Lmax), page_size=page_size, ms_graph=None,
                 gbps_graph=None, **({"seqlens": list(seqlens)} if case == "ragged" else {}))
    try:
        q, _, _ = make_inputs(B, Hq, Hkv, 1, 1, D, dtype, dev)
        _, k, v = make_inputs(B, 1, Hkv, 1, Lmax, D, dtype, dev)
        lens = bench_decode.device_lengths(seqlens, dev)
        table, caches = None, (k, v)
        if page_size is not None:
            order, table = page_order(B, -(-Lmax // page_size))
            table = table.to(dev)
            caches = (to_pages(k, page_size, order), to_pages(v, page_size, order))
        # as KVCache.attend and PagedKVCache.attend call it: the lengths known on the host (the
        # split count sized for them), the table's entries not read back (a device sync per call)
        fn = lambda q, k, v, _: decode_attention(q, k, v, cache_seqlens=lens, block_table=table,  # noqa: E731
                                                 check_table=False, host_lengths=list(seqlens))
        with torch.no_grad():
            out = fn(q, *caches, None)
        # the timed call's output, its first heads against the oracle on the contiguous cache
        err, ok = bench_decode.check_decode(lambda qs, *_: out[:, :qs.shape[1]], q, k, v, list(seqlens))
        del k, v    # the contiguous cache stays alive as caches when page_size is None
        if not ok:
            rec["note"] = f"wrong: max error {err:.3g} over tolerance"
        else:
            torch.cuda.reset_peak_memory_stats()
            with torch.no_grad():
                ms = time_ms(lambda: fn(q, *caches, None))
            nbytes = bench_decode.kv_bytes(shape, seqlens, dtype.itemsize)
            rec.update(ms=ms, gbps=nbytes / ms / 1e6, tflops=4 * B * Hq * Lmax * D * rec["density"] / ms / 1e9,
                       peak_mem_gb=round(torch.cuda.max_memory_allocated() / 1e9, 3),
                       host_us=bench_decode.host_time(lambda: fn(q, *caches, None)))
            try:
                ms_graph = bench_decode.graph_time(fn, q, *caches, None)
                rec.update(ms_graph=ms_graph, gbps_graph=nbytes / ms_graph / 1e6)
            except Exception as e:  # a call that cannot be captured
                rec["note_graph"] = _why("no graph time", e)
    except torch.cuda.OutOfMemoryError:
        rec.update(ms=None, tflops=None, gbps=None, note="out of memory")
    except Exception as e:
        rec.update(ms=None, tflops=None, gbps=None, note=_why("failed", e))
    torch.cuda.empty_cache()
    return [rec]


# --- part 3: score modifiers -------------------------------------------------------------------

MOD_IMPLS = [("flashlib", "none"), ("flashlib_softcap", "softcap"), ("flashlib_alibi", "alibi"),
             ("flex_softcap", "softcap"), ("flex_alibi", "alibi")]


def score_mod_setup(impl, mod, B, H, N, D, causal, dtype):
    """(call, inputs, check) of flashlib or FlexAttention with modifier ``mod`` (none, softcap,
    alibi) at one dense shape; the check uses the same modifier (the checked heads' slopes)."""
    dev = runtime.DEVICE
    slopes = alibi_slopes(H).to(dev)
    options = {"none": {}, "softcap": dict(softcap=SOFTCAP), "alibi": dict(alibi_slopes=slopes)}[mod]
    q, k, v = make_inputs(B, H, H, N, N, D, dtype, dev, requires_grad=True)
    if impl.startswith("flex"):      # Nq == Nk here: ALiBi's distance i + Nk - Nq - j is i - j
        score_mod = {"softcap": lambda s, b, h, i, j: SOFTCAP * torch.tanh(s / SOFTCAP),
                     "alibi": lambda s, b, h, i, j: s - slopes[h] * (i - j).abs()}[mod]
        compiled, create_block_mask = _flex()
        mask = create_block_mask(lambda b, h, i, j: j <= i, None, None, N, N, device=dev) if causal else None
        call = lambda q, k, v: compiled(q, k, v, score_mod=score_mod, block_mask=mask)   # noqa: E731
    else:
        call = lambda q, k, v: flash_attention(q, k, v, causal=causal, **options)         # noqa: E731
    sliced = {n: (o[:2] if isinstance(o, torch.Tensor) else o) for n, o in options.items()}
    return call, (q, k, v), lambda out: oracle_check([tuple(t[:1, :2] for t in (out, q, k, v))], dtype,
                                                     causal=causal, **sliced)


def score_mod_records(impl, mod, D, N, causal, dtype):
    """Records (fwd, fwd_bwd) of one implementation and modifier at a forward-suite shape."""
    B, H = shape_for(D, N)["B"], WIDTH // D
    return timed_records(functools.partial(score_mod_setup, impl, mod, B, H, N, D, causal, dtype),
                         "score_mod", f"d{D} N{N}{' causal' if causal else ''}", impl, dtype,
                         attention_flops(B, H, N, N, D, causal=causal), mod=mod,
                         B=B, H=H, Nq=N, Nk=N, D=D, causal=causal)


# --- the suite -----------------------------------------------------------------------------------

def jobs(dtype, quick=False, impls=None):
    """Every (part, impl, job) to run, job() -> records: paged decode first (host-sensitive),
    FlexAttention last. ``impls``: keep only these implementation or part names."""
    partial, lengths = functools.partial, tuple(document_lengths(PACK_TOKENS, PACK_DOCS))
    work = [("paged_decode", impl, partial(paged_record, label if ragged else f"{label} L{max(seqlens)}",
                                           impl, shape, tuple(seqlens), page, dtype))
            for label, shape, seqlens, ragged in bench_decode.cases(quick)
            for page, impl in ((None, "flashlib_contiguous"), *((p, f"flashlib_paged{p}") for p in PAGE_SIZES))]
    work += [("varlen", impl, partial(varlen_records, impl, lengths, D, dtype))
             for D in (QUICK_PACK_DIMS if quick else PACK_DIMS)
             for impl in ("flashlib_varlen", "flashlib_dense", "flex_document")]
    work += [("score_mod", impl, partial(score_mod_records, impl, mod, D, N, causal, dtype))
             for D, N, causal in (QUICK_MOD_SHAPES if quick else MOD_SHAPES) for impl, mod in MOD_IMPLS]
    work = [w for w in work if impls is None or w[0] in impls or w[1] in impls]
    return sorted(work, key=lambda w: w[1].startswith("flex"))


def run_suite(dtype, out_dir, *, quick=False, impls=None, progress=lambda x, **_: x):
    """Run the suite; write production_<dtype>.json and .png to out_dir; print a table."""
    records = []
    for part, impl, job in progress(jobs(dtype, quick, impls), desc="production"):
        try:
            records += job()
        except Exception as e:  # a bug in a job: say so, keep the rest of the suite
            print(f"production: {part} {impl}: {_why('failed', e)}")
    add_ratios(records)
    stem = f"production_{str(dtype).replace('torch.', '')}"
    (out_dir / f"{stem}.json").write_text(json.dumps(dict(env=environment(), records=records), indent=1))
    plot(records, out_dir / f"{stem}.png", f"production {stem[11:]}")
    print_table(records)
    return records


def plot(records, path, title):
    """Bars per case and implementation: varlen and score-modifier TFLOP/s (forward,
    forward+backward), paged decode TB/s (eager, CUDA graph)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    decode = [dict(r, tbps=(r.get("gbps") or 0) / 1e3, tbps_graph=(r.get("gbps_graph") or 0) / 1e3)
              for r in records if r["part"] == "paged_decode"]
    panels = [(f"{part} {op}", [r for r in records if r["part"] == part and r["op"] == op], "tflops", "TFLOP/s")
              for part in ("varlen", "score_mod") for op in OPS]
    panels += [(f"paged decode ({how})", decode, value, "K/V read, TB/s")
               for value, how in (("tbps", "eager"), ("tbps_graph", "CUDA graph"))]
    fig, axes = plt.subplots(3, 2, figsize=(15, 13))
    for ax, (name, rs, value, ylabel) in zip(axes.flat, panels):
        cases = list(dict.fromkeys(r["case"] for r in rs))
        impls = list(dict.fromkeys(r["impl"] for r in rs))
        width = 0.8 / max(1, len(impls))
        for i, impl in enumerate(impls):
            got = {r["case"]: r.get(value) or 0 for r in rs if r["impl"] == impl}
            ax.bar([x + i * width for x in range(len(cases))], [got.get(c, 0) for c in cases], width, label=impl)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(cases))], cases, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title}: {name}", fontsize=9)
        if impls:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def print_table(records):
    fmt = lambda x, f: f"{'-':>{f.split('.')[0]}}" if x is None else format(x, f)   # noqa: E731
    for part, rates, ratios in (
            ("varlen", ("tflops",), ("ratio_vs_flashlib_dense", "ratio_vs_flex")),
            ("score_mod", ("tflops",), ("ratio_vs_flashlib", "ratio_vs_flex")),
            ("paged_decode", ("gbps", "gbps_graph"), ("ratio_vs_contiguous", "ratio_vs_contiguous_graph"))):
        rows = [r for r in records if r["part"] == part]
        names = {"tflops": "TFLOP/s", "gbps": "TB/s", "gbps_graph": "TB/s graph"}
        print(f"\n{part}\n{'case':22}{'op':8}{'impl':20}{'ms':>9}" + "".join(f"{names[n]:>11}" for n in rates)
              + "".join(f"{n[6:]:>20}" for n in ratios) + "  note" if rows else "")
        for r in rows:
            scaled = [r.get(n) and (r[n] / 1e3 if n.startswith("gbps") else r[n]) for n in rates]
            print(f"{r['case']:22}{r['op']:8}{r['impl']:20}{fmt(r['ms'], '9.3f')}"
                  + "".join(fmt(x, "11.2f") for x in scaled) + "".join(fmt(r.get(n), "20.3f") for n in ratios)
                  + f"  {r.get('note', '')} {r.get('note_graph', '')}")
