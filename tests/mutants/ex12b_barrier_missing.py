"""Mutant of ex12b: two consumers without the ping-pong barriers."""

EXPECTED_HINT = 'barriers are missing'


def fa3_schedule(n_blocks, consumers=1):
    graph, last_gemm, turn_end = [], {}, ""           # turn_end: the last GEMM of the turn before

    def issue(name, *deps):
        graph.append((name, tuple(d for d in deps if d)))
        return name

    warpgroups = [f"wg{w + 1}" for w in range(consumers)]
    for j in range(n_blocks + 1):                     # j = 0: prologue; j = n_blocks: epilogue
        for wg in warpgroups:
            barrier = ""
            if j < n_blocks:                          # S_j, after softmax_{j-1} and PV_{j-2}
                last_gemm[wg] = issue(f"{wg}.gemm0[{j}]", f"producer.load_k[{j}]",
                                      last_gemm.get(wg, ""), barrier,
                                      f"{wg}.softmax[{j - 1}]" if j else "")
                barrier = ""
            if j > 0:                                 # the deferred O += P_{j-1} V_{j-1}
                last_gemm[wg] = issue(f"{wg}.gemm1[{j - 1}]", f"{wg}.softmax[{j - 1}]",
                                      f"producer.load_v[{j - 1}]", last_gemm[wg], barrier)
            turn_end = last_gemm[wg]
            if j < n_blocks:                          # waits for S_j only, runs under PV_{j-1}
                issue(f"{wg}.softmax[{j}]", f"{wg}.gemm0[{j}]",
                      f"{wg}.softmax[{j - 1}]" if j else "")
    return graph
