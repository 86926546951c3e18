"""Mutant of ex12b: prologue, a loop over j = 1 .. n_blocks - 2, epilogue: the last block's S and softmax are never issued."""

EXPECTED_HINT = '1 .. n_blocks - 1'


def fa3_schedule(n_blocks, consumers=1):
    graph = []
    for w in range(1, consumers + 1):
        wg = f"wg{w}"
        graph.append((f"{wg}.gemm0[0]", ("producer.load_k[0]",)))
        graph.append((f"{wg}.softmax[0]", (f"{wg}.gemm0[0]",)))
        for j in range(1, n_blocks - 1):
            graph.append((f"{wg}.gemm0[{j}]", (f"producer.load_k[{j}]", f"{wg}.softmax[{j - 1}]",
                                               f"{wg}.gemm1[{j - 2}]" if j > 1 else f"{wg}.gemm0[0]")))
            graph.append((f"{wg}.gemm1[{j - 1}]", (f"{wg}.softmax[{j - 1}]", f"producer.load_v[{j - 1}]",
                                                   f"{wg}.gemm0[{j}]")))
            graph.append((f"{wg}.softmax[{j}]", (f"{wg}.gemm0[{j}]", f"{wg}.softmax[{j - 1}]")))
        last = n_blocks - 1
        graph.append((f"{wg}.gemm1[{last}]", (f"{wg}.softmax[{last}]", f"producer.load_v[{last}]")))
    return graph
