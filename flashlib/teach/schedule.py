"""Lesson 12's schedule simulator: one SM running FlashAttention's inner loop, task by task.

FlashAttention-3 (Shah et al., 2024) keeps an H100's tensor cores busy by running the softmax's
exponentials, which go through the SM's slow multi-function units, while matmuls run. Its tools:
warp specialisation, a producer warpgroup filling a ring of shared-memory buffers that consumer
warpgroups drain (section 3.1); ping-pong scheduling of two consumer warpgroups, barriers making
one's GEMMs run while the other computes its softmax (section 3.1, Figure 1); and intra-warpgroup
pipelining (section 3.2, Algorithm 2): iteration j issues S_j = Q K_j^T, then the deferred
O += P_{j-1} V_{j-1}, and runs softmax_j while that second GEMM runs. This module models one SM computing
one query tile against ``n_blocks`` key blocks, so the policies can be drawn and compared.

Resources, each running one task at a time: "copy" (the TMA copy engine: K_j and V_j into shared
memory), "tensor" (the SM's tensor cores, shared by its warpgroups: GEMM0 S = Q K_j^T and GEMM1
O += P V_j) and "exp" (the multi-function units: the softmax's exps). Durations come from peak
figures (``durations``); a task starts once its dependencies have ended and its resource is free.

Limits: peak rates, no latencies or issue slots; the softmax is only its exps (max, sum and
rescaling run on other units and are left out); two consumer warpgroups split the tile's rows;
the copy rate is an assumption (``Hardware.copy_bytes_per_clock``), not a measured figure.
"""
from dataclasses import dataclass

RESOURCES = ("copy", "tensor", "exp")
RESOURCE_OF = {"load_k": "copy", "load_v": "copy", "gemm0": "tensor", "softmax": "exp",
               "gemm1": "tensor"}
LABEL = {"load_k": "K", "load_v": "V", "gemm0": "QK", "softmax": "exp", "gemm1": "PV"}


@dataclass(frozen=True)
class Hardware:
    """One GPU's peak figures (datasheet peaks, not measurements) and one assumption."""
    tensor_flops: float = 989e12         # dense fp16/bf16 matmul FLOP/s, the whole GPU
    sms: int = 132
    clock: float = 1.83e9                # Hz (132 SMs x 4096 FLOP per clock = 989 TFLOP/s)
    exp_per_clock: int = 16              # exps per clock per SM (multi-function units)
    copy_bytes_per_clock: float = 64.0   # ASSUMED rate of K/V tiles into one SM (mostly from L2)


H100 = Hardware()


def durations(hw=H100, *, block_m=128, block_n=128, d=128, itemsize=2) -> dict:
    """Microseconds each task takes on one SM at peak rate, for a tile of ``block_m`` query rows
    and ``block_n`` keys of head dim ``d``: K_j and V_j (block_n x d each), GEMM0 and GEMM1
    (2 block_m block_n d FLOPs each) and the softmax (block_m block_n exps)."""
    gemm = 2 * block_m * block_n * d / (hw.tensor_flops / hw.sms) * 1e6
    load = block_n * d * itemsize / (hw.copy_bytes_per_clock * hw.clock) * 1e6
    exps = block_m * block_n / (hw.exp_per_clock * hw.clock) * 1e6
    return {"load_k": load, "load_v": load, "gemm0": gemm, "softmax": exps, "gemm1": gemm}


POLICIES = {   # producer: a producer warp loads (else the consumer, in line); consumers: 1 or 2
    "sequential": dict(producer=False, consumers=1, pingpong=False, pipelined=False),
    "specialised": dict(producer=True, consumers=1, pingpong=False, pipelined=False),
    "pingpong": dict(producer=True, consumers=2, pingpong=True, pipelined=False),
    "intra": dict(producer=True, consumers=1, pingpong=False, pipelined=True),   # Algorithm 2
    "pingpong+intra": dict(producer=True, consumers=2, pingpong=True, pipelined=True),
}


@dataclass(frozen=True)
class Task:
    name: str              # "wg1.softmax[3]": who, what, which key block
    kind: str              # load_k, load_v, gemm0, softmax, gemm1
    owner: str             # "producer", "wg1", "wg2"
    block: int             # the key block j
    duration: float        # microseconds
    deps: tuple = ()       # names of the tasks that must end before this one starts

    @property
    def resource(self) -> str:
        return RESOURCE_OF[self.kind]


def tasks(policy="sequential", n_blocks=8, dur=None, *, stages=2) -> list:
    """The task graph of one query tile over ``n_blocks`` key blocks, in issue order (an earlier
    task wins a resource both could start on). policy: a name in POLICIES or a dict of its four
    flags; dur: ``durations()`` of the whole tile (two consumers take half the rows each, so
    half of each GEMM and softmax); stages: slots of the K ring and of the V ring."""
    p = POLICIES[policy] if isinstance(policy, str) else policy
    dur = durations() if dur is None else dur
    c = p["consumers"]
    if not p["producer"] and (c != 1 or p["pipelined"]):
        raise ValueError("without a producer warp, one consumer warpgroup loads and computes, "
                         "in order (consumers=1, pipelined=False)")
    wgs = [f"wg{i + 1}" for i in range(c)]
    made, deps = [], {}                               # Task fields, name -> its dependencies

    def add(kind, owner, j, *after):
        name = f"{owner}.{kind}[{j}]"
        share = c if kind in ("gemm0", "softmax", "gemm1") else 1
        made.append((name, kind, owner, j, dur[kind] / share))
        deps[name] = [a for a in after if a]
        return name

    def of(kind, j, owner=None):                      # step j's task of each consumer (or of
                                                      # owner); none if there is no step j
        return [f"{w}.{kind}[{j}]" for w in ([owner] if owner else wgs)] if 0 <= j < n_blocks else []

    loaded = {}
    if p["producer"]:                                 # one warp, in order; a slot frees once
        last = ""                                     # every consumer has read it (mbarriers)
        for j in range(n_blocks):
            for kind, reader in (("load_k", "gemm0"), ("load_v", "gemm1")):
                last = loaded[kind, j] = add(kind, "producer", j, last, *of(reader, j - stages))
    issued = {w: [] for w in wgs}                     # each consumer's own tasks, issue order
    last_gemm = dict.fromkeys(wgs, "")                # a warpgroup's wgmmas run in issue order
    if p["pipelined"]:
        # FA3's Algorithm 2 (section 3.2): the prologue computes S_0 and softmax_0; iteration j
        # issues S_j, then the deferred PV_{j-1}, and runs softmax_j while PV_{j-1} runs; the
        # epilogue issues the last PV. softmax_j waits only for S_j and the running max; S_j is
        # issued after softmax_{j-1} and after PV_{j-2} (two score tiles in registers: S_next,
        # and P_{j-1} until PV_{j-1} has read it)
        for j in range(n_blocks + 1):
            for w in wgs:
                mine = issued[w]
                if j < n_blocks:
                    last_gemm[w] = add("gemm0", w, j, loaded["load_k", j], last_gemm[w],
                                       *of("softmax", j - 1, w))
                    mine.append(last_gemm[w])
                if j >= 1:
                    last_gemm[w] = add("gemm1", w, j - 1, f"{w}.softmax[{j - 1}]",
                                       loaded["load_v", j - 1], last_gemm[w])
                    mine.append(last_gemm[w])
                if j < n_blocks:
                    mine.append(add("softmax", w, j, f"{w}.gemm0[{j}]", *of("softmax", j - 1, w)))
    else:                                             # FA2's order: wait for each result
        for j in range(n_blocks):
            for w in wgs:
                mine = issued[w]
                if not p["producer"]:
                    loaded["load_k", j] = add("load_k", w, j, *mine[-1:])
                    loaded["load_v", j] = add("load_v", w, j, loaded["load_k", j])
                    mine += [loaded["load_k", j], loaded["load_v", j]]
                mine.append(add("gemm0", w, j, loaded["load_k", j], *mine[-1:]))
                mine.append(add("softmax", w, j, mine[-1]))
                mine.append(add("gemm1", w, j, mine[-1], loaded["load_v", j]))
    if p["pingpong"]:                                 # barriers: the GEMMs between two softmaxes
        phases = {w: [[]] for w in wgs}               # of wg1, then those of wg2, then wg1's ...
        for w in wgs:
            for name in issued[w]:
                if ".softmax" in name:
                    phases[w].append([])
                elif ".gemm" in name:
                    phases[w][-1].append(name)
        turns = [ph for pair in zip(*(phases[w] for w in wgs)) for ph in pair if ph]
        for before, after in zip(turns, turns[1:]):
            deps[after[0]].append(before[-1])
    return [Task(*fields, deps=tuple(deps[fields[0]])) for fields in made]


@dataclass
class Schedule:
    """What ``simulate`` returns: ``slots``, (task, start, end) in start order, microseconds."""
    slots: list

    @property
    def total(self) -> float:
        return max((end for _, _, end in self.slots), default=0.0)

    def busy(self, resource: str) -> float:
        return sum(end - start for t, start, end in self.slots if t.resource == resource)

    def utilisation(self, resource="tensor") -> float:
        return self.busy(resource) / self.total if self.total else 0.0

    def summary(self) -> str:
        used = ", ".join(f"{r} {self.utilisation(r):4.0%}" for r in RESOURCES)
        return f"{self.total:7.2f} us; busy: {used}"


def simulate(task_list) -> Schedule:
    """List scheduling: again and again, start the task that can start earliest (its
    dependencies have ended and its resource is free), ties going to the earlier-issued task;
    a started task runs to its end, and each resource runs one task at a time."""
    order = {t.name: i for i, t in enumerate(task_list)}
    unknown = {d for t in task_list for d in t.deps} - set(order)
    if unknown:
        raise ValueError(f"dependencies on tasks not in the list: {sorted(unknown)}")
    end, free, slots, waiting = {}, dict.fromkeys(RESOURCES, 0.0), [], list(task_list)

    def earliest(t):
        return max([free[t.resource], *(end[d] for d in t.deps)])

    while waiting:
        ready = [t for t in waiting if all(d in end for d in t.deps)]
        if not ready:
            raise ValueError(f"a dependency cycle among {[t.name for t in waiting][:6]} ...")
        task = min(ready, key=lambda t: (earliest(t), order[t.name]))
        start = earliest(task)
        end[task.name] = free[task.resource] = start + task.duration
        slots.append((task, start, end[task.name]))
        waiting.remove(task)
    return Schedule(slots)


def run(policy="sequential", n_blocks=8, dur=None, **kwargs) -> Schedule:
    """``simulate(tasks(policy, n_blocks, dur, **kwargs))``."""
    return simulate(tasks(policy, n_blocks, dur, **kwargs))


def plot_schedule(schedule, *, title=None, ax=None, until=None):
    """The timeline: one lane per resource, a bar per task labelled K, V, QK, exp or PV and its
    key block, coloured by who issued it (producer grey, wg1 blue, wg2 orange)."""
    from .viz import detached, figure_axes
    colour = {"producer": "0.6", "wg1": "tab:blue", "wg2": "tab:orange"}
    fig, ax = figure_axes(ax, (10, 1.9))
    until = schedule.total if until is None else until
    for t, start, end in schedule.slots:
        if start >= until:
            continue
        y = RESOURCES.index(t.resource)
        ax.barh(y, end - start, left=start, height=0.7, color=colour[t.owner], edgecolor="white")
        label = f"{LABEL[t.kind]}{t.block}"
        if end - start > len(label) * until / 130:                    # only where it fits
            ax.text((start + end) / 2, y, label, ha="center", va="center", fontsize=6,
                    color="white")
    ax.set_yticks(range(len(RESOURCES)), RESOURCES)
    ax.set_ylim(len(RESOURCES) - 0.5, -0.5)
    ax.set_xlim(0, until)
    ax.set_xlabel("microseconds")
    ax.set_title(title or schedule.summary(), fontsize=9)
    return detached(fig)
