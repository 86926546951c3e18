"""Same-run A/B of the kernels: this checkout's flashlib against another version of it.

Why: a change to the kernels' shared code (the score-modifier hook, a new prologue) must not slow
the default path, and these machines vary 5-15% between processes, so the two versions are timed
on one machine, in alternating processes (A B B A ...), and compared by their medians.

    git archive ae550ac flashlib | tar -x -C build/ab_base          # the baseline, on this machine
    python benchmarks/ab_compare.py --base build/ab_base --out DIR  # on the GPU machine

Each worker process imports flashlib from its own path, checks its output on the timed inputs
against the float64 oracle (first batch element, two heads), then times forward and
forward+backward with ``triton.testing.do_bench`` (median). FLASHLIB_AUTOTUNE=0 and FLASHLIB_FA3=0
(the portable kernels, also on Hopper), so both versions run the same block configs: the
comparison is of the kernels' code, not of autotuning luck (``--fa3``: the Hopper kernels on,
for a change to them). With
``--mods``, the new version is also timed with a softcap and ALiBi (what the modifiers cost).

``--suite block_sparse`` or ``--suite decode``: each worker is instead that suite of
``python -m flashlib.bench`` with flashlib's implementations only, under the same settings and
in the same alternating order; records of the two versions are paired by shape (and mask), and
the table compares their ``ms`` (and ``ms_graph``, decode's time inside a CUDA graph).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (B, H, N, D, causal): batch x seqlen = 32k tokens, heads x headdim = 2048 (the README's suites)
SHAPES = [(8, 32, 4096, 64, False), (8, 16, 4096, 128, False), (8, 16, 4096, 128, True),
          (2, 16, 16384, 128, True)]


def worker(label, mods):
    import torch
    import triton

    import flashlib
    from flashlib.testing import assert_attention_close

    print(f"# {label}: flashlib from {Path(flashlib.__file__).parent}", file=sys.stderr)
    variants = {"none": {}}
    if mods:
        variants.update(softcap={"softcap": 30.0}, alibi={"alibi_slopes": None})
    for B, H, N, D, causal in SHAPES:
        g = torch.Generator("cuda").manual_seed(0)
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16, generator=g)
                   .requires_grad_() for _ in range(3))
        dout = torch.randn_like(q)
        for name, options in variants.items():
            if "alibi_slopes" in options:
                options = {"alibi_slopes": 2.0 ** (-8.0 * torch.arange(1, H + 1, device="cuda") / H)}
            out = flashlib.flash_attention(q, k, v, causal=causal, **options)
            # checked on batch 0, heads 0-1, of the very inputs timed
            few = [t[:1, :2].detach() for t in (q, k, v)]
            few_options = {n: o[:2] if n == "alibi_slopes" else o for n, o in options.items()}
            with torch.no_grad():
                _, lse = flashlib.flash_attention(*few, causal=causal, return_lse=True, **few_options)
            assert_attention_close(out[:1, :2].detach(), lse, *few, causal=causal, **few_options)

            def fwd():
                with torch.no_grad():
                    flashlib.flash_attention(q, k, v, causal=causal, **options)

            def fwd_bwd():
                o = flashlib.flash_attention(q, k, v, causal=causal, **options)
                torch.autograd.grad(o, (q, k, v), dout)
            for op, fn in (("fwd", fwd), ("fwd_bwd", fwd_bwd)):
                ms = triton.testing.do_bench(fn, warmup=25, rep=200)
                print(json.dumps(dict(label=label, mod=name, op=op, B=B, H=H, N=N, D=D, causal=causal,
                                      ms=ms)), flush=True)


SUITE_IMPLS = {"block_sparse": ["flashlib", "flashlib_dense"], "decode": ["flashlib"]}
RECORD_KEY = ("op", "impl", "mask", "B", "Hq", "Hkv", "Nq", "Nk", "D", "causal", "seqlens")


def suite_worker(label, suite, out, env):
    """One version's run of a suite (``env`` picks the version): its flashlib records, tagged
    with ``label``. Run from /tmp: ``python -m`` would put this checkout first on the path."""
    out = out.resolve()
    subprocess.run([sys.executable, "-m", "flashlib.bench", "--suite", suite, "--impl", *SUITE_IMPLS[suite],
                    "--out", str(out)], check=True, stdout=subprocess.DEVNULL, env=env, cwd="/tmp")
    records = json.loads(next(out.glob(f"{suite}_*.json")).read_text())["records"]
    return [dict(r, label=label) for r in records if r["impl"] in SUITE_IMPLS[suite]]


def suite_table(records):
    """Lines of the suite A/B: per paired record, base and new medians of ms (and ms_graph)."""
    lines = ["record | time | base ms (median of rounds) | new ms | new / base | spread of base, new rounds"]
    keys = sorted({tuple(str(r.get(f)) for f in RECORD_KEY) for r in records})
    for key in keys:
        same = [r for r in records if tuple(str(r.get(f)) for f in RECORD_KEY) == key]
        for field in ("ms", "ms_graph"):
            base = [r[field] for r in same if r["label"] == "base" and r.get(field) is not None]
            new = [r[field] for r in same if r["label"] == "new" and r.get(field) is not None]
            if base and new:
                b, n = statistics.median(base), statistics.median(new)
                name = " ".join(f"{f}={v}" for f, v in zip(RECORD_KEY, key) if v != "None")
                lines.append(f"{name} | {field} | {b:.4f} | {n:.4f} | {n / b:.3f} | {min(base):.4f}-{max(base):.4f}, "
                             f"{min(new):.4f}-{max(new):.4f}")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", help="folder holding the baseline's flashlib package")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mods", action="store_true", help="also time the new version's modifiers")
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--suite", default="dense", choices=["dense", *SUITE_IMPLS],
                        help="dense: this file's shapes; otherwise that flashlib.bench suite")
    parser.add_argument("--fa3", action="store_true", help="leave the FA3 kernels on (Hopper): FLASHLIB_FA3=1")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.mods)
    args.out.mkdir(parents=True, exist_ok=True)
    paths = {"base": Path(args.base).resolve(), "new": ROOT}
    records = []
    for r in range(args.rounds):
        for label in (("base", "new") if r % 2 == 0 else ("new", "base")):
            env = dict(os.environ, PYTHONPATH=str(paths[label]), FLASHLIB_AUTOTUNE="0",
                       FLASHLIB_FA3="1" if args.fa3 else "0")
            if args.suite != "dense":
                out = args.out / f"{label}_{r}"
                records += [dict(x, round=r) for x in suite_worker(label, args.suite, out, env)]
                continue
            cmd = [sys.executable, __file__, "--worker", label] + (["--mods"] if args.mods and label == "new" else [])
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd="/tmp")
            sys.stderr.write(done.stderr[-3000:])
            if done.returncode:
                raise SystemExit(f"{label} worker failed ({done.returncode})")
            records += [dict(json.loads(line), round=r) for line in done.stdout.splitlines() if line.startswith("{")]
    (args.out / "ab_records.jsonl").write_text("".join(json.dumps(x) + "\n" for x in records))
    if args.suite != "dense":
        text = "\n".join(suite_table(records))
        print(text)
        (args.out / "ab_summary.txt").write_text(text + "\n")
        return
    lines = ["shape | op | mod | base ms (median of rounds) | new ms | new / base | spread of base rounds"]
    for B, H, N, D, causal in SHAPES:
        for op in ("fwd", "fwd_bwd"):
            def times(label, mod="none"):
                return [x["ms"] for x in records if (x["label"], x["mod"], x["op"], x["N"], x["D"], x["causal"],
                                                      x["B"]) == (label, mod, op, N, D, causal, B)]
            base, new = times("base"), times("new")
            b, n = statistics.median(base), statistics.median(new)
            shape = f"B{B} H{H} N{N} d{D}{' causal' if causal else ''}"
            lines.append(f"{shape} | {op} | none | {b:.3f} | {n:.3f} | {n / b:.3f} | "
                         f"{min(base):.3f}-{max(base):.3f}")
            for mod in ("softcap", "alibi"):
                if times("new", mod):
                    m = statistics.median(times("new", mod))
                    lines.append(f"{shape} | {op} | {mod} | | {m:.3f} | {m / b:.3f} | ")
    text = "\n".join(lines)
    print(text)
    (args.out / "ab_summary.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
