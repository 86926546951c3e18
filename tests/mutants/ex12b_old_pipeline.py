"""Mutant of ex12b: the pipeline the lesson used to print: S_{j+1} issued before softmax_j."""

EXPECTED_HINT = 'does not run S_{j+1} under softmax_j'


def fa3_schedule(n_blocks, consumers=1):
    graph, last_gemm, turn_end = [], {}, ""

    def issue(name, *deps):
        graph.append((name, tuple(d for d in deps if d)))
        return name

    warpgroups = [f"wg{w + 1}" for w in range(consumers)]
    for j in range(-1, n_blocks):                     # j = -1 issues S_0
        for wg in warpgroups:
            barrier = turn_end if consumers > 1 else ""
            if j + 1 < n_blocks:                      # S_{j+1} before softmax_j
                last_gemm[wg] = issue(f"{wg}.gemm0[{j + 1}]", f"producer.load_k[{j + 1}]",
                                      last_gemm.get(wg, ""), barrier)
                barrier = ""
            if j >= 0:
                issue(f"{wg}.softmax[{j}]", f"{wg}.gemm0[{j}]", f"{wg}.softmax[{j - 1}]" if j else "")
                last_gemm[wg] = issue(f"{wg}.gemm1[{j}]", f"{wg}.softmax[{j}]",
                                      f"producer.load_v[{j}]", last_gemm[wg], barrier)
            turn_end = last_gemm[wg]
    return graph
