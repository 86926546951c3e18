"""Mutant of ex12b: iteration j issues the PV of block j - 1 before S_j."""

EXPECTED_HINT = 'defer the PV'


def fa3_schedule(n_blocks, consumers=1):
    graph, last_gemm, turn_end = [], {}, ""

    def issue(name, *deps):
        graph.append((name, tuple(d for d in deps if d)))
        return name

    warpgroups = [f"wg{w + 1}" for w in range(consumers)]
    for j in range(n_blocks + 1):
        for wg in warpgroups:
            barrier = turn_end if consumers > 1 else ""
            if j > 0:                                 # PV of block j - 1 first
                last_gemm[wg] = issue(f"{wg}.gemm1[{j - 1}]", f"{wg}.softmax[{j - 1}]",
                                      f"producer.load_v[{j - 1}]", last_gemm[wg], barrier)
                barrier = ""
            if j < n_blocks:
                last_gemm[wg] = issue(f"{wg}.gemm0[{j}]", f"producer.load_k[{j}]",
                                      last_gemm.get(wg, ""), barrier,
                                      f"{wg}.softmax[{j - 1}]" if j else "")
            turn_end = last_gemm[wg]
            if j < n_blocks:
                issue(f"{wg}.softmax[{j}]", f"{wg}.gemm0[{j}]",
                      f"{wg}.softmax[{j - 1}]" if j else "")
    return graph
