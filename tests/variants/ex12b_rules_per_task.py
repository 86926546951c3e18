"""Correct variant of ex12b: every task's waits from rules (its inputs, the register tile freed by
PV_{j-2}, the wgmma before it), no running state; both GEMMs of a turn wait for both of the other
warpgroup's turn before; the list sorted into issue order at the end."""


def _turn(wg, t, n_blocks):
    return [f"{wg}.gemm0[{t}]"] * (t < n_blocks) + [f"{wg}.gemm1[{t - 1}]"] * (t >= 1)


def fa3_schedule(n_blocks, consumers=1):
    warpgroups = ["wg1", "wg2"][:consumers]
    tasks = []
    for w, wg in enumerate(warpgroups):
        for j in range(n_blocks):
            s_deps = [f"producer.load_k[{j}]"]
            if j >= 1:
                s_deps += [f"{wg}.softmax[{j - 1}]", f"{wg}.gemm0[{j - 1}]"]
            if j >= 2:
                s_deps.append(f"{wg}.gemm1[{j - 2}]")
            pv_after = f"{wg}.gemm0[{j + 1}]" if j + 1 < n_blocks else f"{wg}.gemm1[{j - 1}]"
            pv_deps = [f"{wg}.softmax[{j}]", f"producer.load_v[{j}]"]
            pv_deps += [pv_after] if j + 1 < n_blocks or j >= 1 else []
            tasks += [((j, w, 0), f"{wg}.gemm0[{j}]", s_deps),
                      ((j + 1, w, 1), f"{wg}.gemm1[{j}]", pv_deps),
                      ((j, w, 2), f"{wg}.softmax[{j}]",
                       [f"{wg}.gemm0[{j}]"] + ([f"{wg}.softmax[{j - 1}]"] if j else []))]
    if consumers == 2:
        turns = [(wg, t) for t in range(n_blocks + 1) for wg in warpgroups]
        waits = {}
        for (wg_before, t_before), (wg, t) in zip(turns, turns[1:]):
            for gemm in _turn(wg, t, n_blocks):
                waits[gemm] = _turn(wg_before, t_before, n_blocks)
        tasks = [(key, name, deps + waits.get(name, [])) for key, name, deps in tasks]
    return [(name, tuple(deps)) for _, name, deps in sorted(tasks)]
