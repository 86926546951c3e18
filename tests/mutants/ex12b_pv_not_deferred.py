"""Mutant of ex12b: FA2's order in each warpgroup: S_j, softmax_j, then PV_j at once (not deferred)."""

EXPECTED_HINT = 'defer the PV'


def fa3_schedule(n_blocks, consumers=1):
    graph, turn_end = [], ""
    warpgroups = [f"wg{w + 1}" for w in range(consumers)]
    for j in range(n_blocks):
        for wg in warpgroups:
            barrier = (turn_end,) if consumers > 1 and turn_end else ()
            previous = (f"{wg}.gemm1[{j - 1}]", f"{wg}.softmax[{j - 1}]") if j else ()
            graph.append((f"{wg}.gemm0[{j}]", (f"producer.load_k[{j}]",) + previous + barrier))
            graph.append((f"{wg}.softmax[{j}]", (f"{wg}.gemm0[{j}]",) + previous[1:]))
            graph.append((f"{wg}.gemm1[{j}]", (f"{wg}.softmax[{j}]", f"producer.load_v[{j}]",
                                               f"{wg}.gemm0[{j}]")))
            turn_end = f"{wg}.gemm0[{j}]"
    return graph
