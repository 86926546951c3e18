"""Correct variant of ex12b: each warpgroup's prologue, loop and epilogue written out as in the
paper's listing, its tasks kept in a list per iteration; the ping-pong barriers added afterwards
from the turns (the GEMMs between two softmaxes), then the iterations emitted wg1, wg2, ..."""


def fa3_schedule(n_blocks, consumers=1):
    per_iteration = {}                                # (iteration, wg) -> [[name, [deps]], ...]
    for w in range(1, consumers + 1):
        wg = f"wg{w}"
        per_iteration[0, wg] = [[f"{wg}.gemm0[0]", ["producer.load_k[0]"]],
                                [f"{wg}.softmax[0]", [f"{wg}.gemm0[0]"]]]
        for j in range(1, n_blocks):
            s_prev, pv_prev = f"{wg}.softmax[{j - 1}]", f"{wg}.gemm1[{j - 2}]"
            per_iteration[j, wg] = [
                [f"{wg}.gemm0[{j}]", [f"producer.load_k[{j}]", s_prev]
                 + ([pv_prev] if j >= 2 else [f"{wg}.gemm0[0]"])],
                [f"{wg}.gemm1[{j - 1}]", [s_prev, f"producer.load_v[{j - 1}]", f"{wg}.gemm0[{j}]"]],
                [f"{wg}.softmax[{j}]", [f"{wg}.gemm0[{j}]", s_prev]],
            ]
        last = n_blocks - 1
        before = f"{wg}.gemm1[{last - 1}]" if last >= 1 else f"{wg}.gemm0[0]"
        per_iteration[n_blocks, wg] = [[f"{wg}.gemm1[{last}]",
                                        [f"{wg}.softmax[{last}]", f"producer.load_v[{last}]", before]]]
    order = [(j, f"wg{w}") for j in range(n_blocks + 1) for w in range(1, consumers + 1)]
    if consumers == 2:
        previous_turn = None
        for key in order:
            gemms = [task for task in per_iteration[key] if ".gemm" in task[0]]
            if previous_turn is not None:
                gemms[0][1].append(previous_turn[-1][0])
            previous_turn = gemms
    return [(name, tuple(deps)) for key in order for name, deps in per_iteration[key]]
