"""Print a Markdown table of a committed benchmark result, for the README.

    python tools/results_table.py benchmarks/results/h200/forward_float16.json [--op fwd]

One row per shape, one column per implementation: TFLOP/s, and flashlib's ratio to SDPA's flash
backend measured in the same run.
"""
import argparse
import json


def table(path, op=None):
    data = json.load(open(path))
    records = [r for r in data["records"] if op is None or r["op"] == op]
    impls = list(dict.fromkeys(r["impl"] for r in records))
    shape = lambda r: f"B{r['B']} H{r['Hq']} N{r['Nq']} d{r['D']}{' causal' if r['causal'] else ''}"  # noqa: E731
    rows = list(dict.fromkeys((r["op"], shape(r)) for r in records))
    lines = [f"| op | shape | {' | '.join(impls)} | flashlib / SDPA flash |",
             "|" + " --- |" * (len(impls) + 3)]
    for op_, sh in rows:
        cells, ratio = [], "-"
        for impl in impls:
            hit = [r for r in records if r["op"] == op_ and shape(r) == sh and r["impl"] == impl]
            r = hit[0] if hit else None
            if r is None:
                cells.append("-")
            elif r["tflops"] is None:
                cells.append(r.get("note", "-").split(":")[0])
            else:
                cells.append(f"{r['tflops']:.0f}")
            if r is not None and impl == "flashlib" and r.get("ratio_vs_sdpa_flash"):
                ratio = f"{r['ratio_vs_sdpa_flash']:.2f}x"
        lines.append(f"| {op_} | {sh} | {' | '.join(cells)} | {ratio} |")
    env = data["env"]
    lines.append(f"\n{env['gpu']}, torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}, "
                 f"{env['date'][:10]}; TFLOP/s from the median of `triton.testing.do_bench`.")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("path")
    parser.add_argument("--op", default=None)
    args = parser.parse_args()
    print(table(args.path, args.op))
