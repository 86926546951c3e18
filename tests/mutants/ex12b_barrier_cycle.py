"""Mutant of ex12b: each warpgroup's turn t waits for the other's turn t (not the one before): a cycle."""

EXPECTED_HINT = 'cycle'


def fa3_schedule(n_blocks, consumers=1):
    graph, last_gemm = [], {}

    def issue(name, *deps):
        graph.append((name, tuple(d for d in deps if d)))
        return name

    def turn_end(wg, t):                              # the last GEMM of wg's turn t
        return f"{wg}.gemm1[{t - 1}]" if t > 0 else f"{wg}.gemm0[0]"

    warpgroups = [f"wg{w + 1}" for w in range(consumers)]
    for j in range(n_blocks + 1):
        for wg in warpgroups:
            other = "wg2" if wg == "wg1" else "wg1"
            barrier = turn_end(other, j) if consumers > 1 else ""
            if j < n_blocks:
                last_gemm[wg] = issue(f"{wg}.gemm0[{j}]", f"producer.load_k[{j}]",
                                      last_gemm.get(wg, ""), barrier,
                                      f"{wg}.softmax[{j - 1}]" if j else "")
                barrier = ""
            if j > 0:
                last_gemm[wg] = issue(f"{wg}.gemm1[{j - 1}]", f"{wg}.softmax[{j - 1}]",
                                      f"producer.load_v[{j - 1}]", last_gemm[wg], barrier)
            if j < n_blocks:
                issue(f"{wg}.softmax[{j}]", f"{wg}.gemm0[{j}]",
                      f"{wg}.softmax[{j - 1}]" if j else "")
    return graph
