"""Grader of exercise 12b (lesson 12): fa3_schedule, FlashAttention-3's consumer schedule
(Algorithm 2's intra-warpgroup pipeline, section 3.2, and the ping-pong barriers between two
consumer warpgroups, section 3.1) as a task graph.

The learner's graph is joined to a producer written here (a ring of two slots per K and V) and
run by lesson 12's simulator (``flashlib.teach.schedule.simulate``) at an H100's peak figures.
The checks: every task once, no unknown or circular dependency; no hazard (each input ready before
its reader starts, for any durations: the required orderings are checked on the graph's
transitive closure, the first one missing is also shown in the timeline); Algorithm 2's order (S_j
issued after softmax_{j-1}, the PV of block j-1 deferred behind S_j); the ping-pong turns (in the
closure and in the tensor cores' lane of the timeline); and the overlap: no wait the algorithm
does not have, and the tensor cores at least as busy as with the reference graph written here
(within 1%), at head dims 64, 128 and 256, one and two consumers. Sizes vary with the seed (1 to
12 key blocks). Pure Python: a few milliseconds a check.
"""
import pytest

from flashlib.course import checks, grading
from flashlib.teach import schedule

pytestmark = pytest.mark.ex12b
FLASHLIB_ALLOWED = ()          # the stub imports nothing of flashlib
FLASHLIB_ANSWERS = ("flashlib.teach.schedule.tasks",)    # flashlib's own FA3 policies
STAGES = 2
KINDS = ("gemm0", "softmax", "gemm1")

HINT_FORMAT = ('return a list of (name, deps) pairs, e.g. ("wg1.softmax[0]", ("wg1.gemm0[0]",)): '
               "the name a string, deps a tuple of names")
HINT_PROLOGUE = ("the prologue is missing: before the loop, each warpgroup computes S_0 = Q K_0^T "
                 "(wg.gemm0[0]) and its softmax (wg.softmax[0])")
HINT_LAST_PV = ("the last block's PV is missing: the loop issues PV of the block before, so after it "
                "the epilogue issues O += P V of the last block (wg.gemm1[n_blocks - 1])")
HINT_RANGE = ("key blocks run from 0 to n_blocks - 1 and iteration j issues S_j and the PV of block "
              "j - 1: the loop runs for j = 1 .. n_blocks - 1, the prologue and epilogue around it")
HINT_WARPGROUPS = 'with consumers=2 both warpgroups, "wg1" and "wg2", have all their tasks'
HINT_CYCLE = ("tasks wait for each other in a circle, so none can start: does a ping-pong barrier "
              "wait for a turn that comes later (wg1's turn t waits for wg2's turn t - 1, not t)?")
HINT_K = "S_j = Q K_j^T reads K_j: wg.gemm0[j] waits for producer.load_k[j]"
HINT_S = ("the softmax of block j reads S_j: wait for the wgmma Q K_j^T (wg.softmax[j] after "
          "wg.gemm0[j]) before computing it")
HINT_MAX = ("the softmax of block j needs the running max and sum of block j - 1: wg.softmax[j] "
            "waits for wg.softmax[j - 1]")
HINT_P = "O += P_j V_j reads P_j: wg.gemm1[j] waits for wg.softmax[j]"
HINT_V = "O += P_j V_j reads V_j: wg.gemm1[j] waits for producer.load_v[j]"
HINT_O = ("each PV adds to O: wg.gemm1[j] must run after wg.gemm1[j - 1] (a warpgroup's wgmmas "
          "run in the order it issues them)")
HINT_REGISTERS = ("S_j goes into a score tile of registers that P_{j-2} held until its PV read it: "
                  "Algorithm 2 waits for PV_{j-2} at the end of iteration j - 1, so wg.gemm0[j] "
                  "comes after wg.gemm1[j - 2] (a warpgroup's GEMMs run in issue order)")
HINT_OLD_PIPELINE = ("iteration j issues S_j only after softmax_{j-1}: Algorithm 2 does not run "
                     "S_{j+1} under softmax_j; it is the deferred PV_{j-1} that runs under softmax_j")
HINT_DEFER = ("defer the PV: in iteration j Algorithm 2 issues S_j = Q K_j^T first, then O += "
              "P_{j-1} V_{j-1}, and a warpgroup's wgmmas run in issue order, so wg.gemm1[j-1] "
              "waits for wg.gemm0[j]")
HINT_BARRIER = ("ping-pong: the first GEMM of a warpgroup's turn waits for the last GEMM of the "
                "other warpgroup's turn before it, so that one warpgroup's softmax runs while the "
                "other's GEMMs use the tensor cores")
HINT_BARRIER_MISSING = ("the ping-pong barriers are missing: with two consumers, a warpgroup's GEMMs "
                        "between two of its softmaxes (a turn) wait for the other warpgroup's turn "
                        "before them, wg1, wg2, wg1, ... ")
HINT_BARRIER_ONE_WAY = ("the barriers go both ways: wg2's turn waits for wg1's turn before it, and "
                        "wg1's next turn waits for wg2's turn, so that the turns alternate")
HINT_SOFTMAX_WAITS = ("the softmax of block j needs only S_j and the softmax of block j - 1: waiting "
                      "for a PV as well puts the softmax after the matmul it should overlap")
HINT_EXTRA = "wait only for what Algorithm 2 waits for: every extra wait costs overlap"
HINT_OTHER_WG = ("the warpgroups wait for each other only at the ping-pong barriers (a turn's "
                 "first GEMM after the other warpgroup's previous turn), not for the other's "
                 "softmax or a later turn")

REQUIRED_HINT = {"K": HINT_K, "S": HINT_S, "max": HINT_MAX, "P": HINT_P, "V": HINT_V, "O": HINT_O,
                 "registers": HINT_REGISTERS, "issue": HINT_OLD_PIPELINE, "defer": HINT_DEFER}


# ---------------------------------------------------------------------------------------------
# the reference, written here from the spec

def _wgs(consumers):
    return [f"wg{w + 1}" for w in range(consumers)]


def _required(n, consumers):
    """[(reader, writer, why)]: reader must not start before writer has ended (per warpgroup)."""
    out = []
    for wg in _wgs(consumers):
        t = lambda kind, j: f"{wg}.{kind}[{j}]"  # noqa: E731
        for j in range(n):
            out += [(t("gemm0", j), f"producer.load_k[{j}]", "K"), (t("softmax", j), t("gemm0", j), "S"),
                    (t("gemm1", j), t("softmax", j), "P"), (t("gemm1", j), f"producer.load_v[{j}]", "V")]
            if j >= 1:
                out += [(t("softmax", j), t("softmax", j - 1), "max"),
                        (t("gemm1", j), t("gemm1", j - 1), "O"),
                        (t("gemm0", j), t("softmax", j - 1), "issue"),
                        (t("gemm1", j - 1), t("gemm0", j), "defer")]
            if j >= 2:
                out.append((t("gemm0", j), t("gemm1", j - 2), "registers"))
    return out


def _turns(n, consumers):
    """The ping-pong turns in their order: [(warpgroup, [its GEMMs in the turn])]."""
    return [(wg, [f"{wg}.gemm0[{t}]"] * (t < n) + [f"{wg}.gemm1[{t - 1}]"] * (t >= 1))
            for t in range(n + 1) for wg in _wgs(consumers)]


def _reference(n, consumers):
    """The graph of Algorithm 2 (and the barriers), in issue order, from the relations above."""
    deps = {}
    for reader, writer, _ in _required(n, consumers):
        deps.setdefault(reader, []).append(writer)
    if consumers > 1:
        turns = _turns(n, consumers)
        for (_, before), (_, after) in zip(turns, turns[1:]):
            deps.setdefault(after[0], []).append(before[-1])
    order = []
    for k, (wg, gemms) in enumerate(_turns(n, consumers)):      # a turn's GEMMs, then its softmax
        t = k // consumers
        order += gemms + [f"{wg}.softmax[{t}]"] * (t < n)
    return [(name, tuple(deps.get(name, ()))) for name in order]


def _producer(n, consumers):
    """The producer's loads: in order, a slot freed once every consumer has read it."""
    out, last = [], ()
    for j in range(n):
        for kind, reader in (("load_k", "gemm0"), ("load_v", "gemm1")):
            freed = tuple(f"{wg}.{reader}[{j - STAGES}]" for wg in _wgs(consumers)) if j >= STAGES else ()
            out.append((f"producer.{kind}[{j}]", last + freed))
            last = (out[-1][0],)
    return out


def _task_list(graph, n, consumers, dur):
    def kind(name):
        return name.split(".")[1].split("[")[0]

    def block(name):
        return int(name.split("[")[1].rstrip("]"))

    share = {"load_k": 1, "load_v": 1, "gemm0": consumers, "softmax": consumers, "gemm1": consumers}
    return [schedule.Task(name, kind(name), name.split(".")[0], block(name),
                          dur[kind(name)] / share[kind(name)], deps=tuple(deps))
            for name, deps in _producer(n, consumers) + list(graph)]


def _closure(graph_with_producer):
    """{task: every task that must end before it starts}, through chains of deps."""
    deps = {name: set(d) for name, d in graph_with_producer}
    memo = {}

    def ancestors(name):
        if name not in memo:
            found = set()
            for d in deps.get(name, ()):
                found |= {d} | ancestors(d)
            memo[name] = found
        return memo[name]

    for name in deps:
        ancestors(name)
    return memo


# ---------------------------------------------------------------------------------------------
# calling the learner's function

def _graph(impl, n, consumers):
    """The learner's graph for (n, consumers), checked for shape: [(name, tuple of names)]."""
    result = checks.function(impl, "fa3_schedule")(n, consumers)
    what = f"fa3_schedule({n}, consumers={consumers})"
    if not isinstance(result, (list, tuple)):
        checks.fail(f"{what} returned {type(result).__name__}, not a list", HINT_FORMAT)
    graph = []
    for entry in result:
        if not (isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[0], str)
                and isinstance(entry[1], (list, tuple)) and all(isinstance(d, str) for d in entry[1])):
            checks.fail(f"{what} returned an entry {entry!r:.80}", HINT_FORMAT)
        graph.append((entry[0], tuple(entry[1])))
    return graph


def _problems_with_tasks(graph, n, consumers):
    """What is wrong with the set of tasks (missing, extra, twice, unknown deps), or None."""
    what = f"fa3_schedule({n}, consumers={consumers})"
    names = [name for name, _ in graph]
    want = [name for name, _ in _reference(n, consumers)]
    twice = sorted({x for x in names if names.count(x) > 1})
    if twice:
        return f"{what} lists {twice[0]} more than once", "issue each task once"
    extra = [x for x in names if x not in want]
    missing = [x for x in want if x not in names]
    if extra:
        blocks = [x for x in extra if x.startswith("wg") and "[" in x]
        return (f"{what} has tasks that do not exist: {', '.join(extra[:3])}",
                HINT_RANGE if blocks else 'names are "wg1.gemm0[3]": warpgroup, task, key block')
    if missing:
        mine = set(missing)
        hint = HINT_RANGE
        if consumers > 1 and all(x.startswith("wg2.") for x in missing):
            hint = HINT_WARPGROUPS
        elif {f"wg1.gemm1[{n - 1}]"} >= mine or all(x.endswith(f"gemm1[{n - 1}]") for x in mine):
            hint = HINT_LAST_PV
        elif all(x.endswith("[0]") and ".gemm1" not in x for x in mine):
            hint = HINT_PROLOGUE
        return f"{what} leaves out {len(missing)} task(s): {', '.join(missing[:4])}", hint
    known = set(want) | {name for name, _ in _producer(n, consumers)}
    for name, deps in graph:
        unknown = [d for d in deps if d not in known]
        if unknown:
            return (f"{what}: {name} waits for {unknown[0]!r}, which is not a task of the loop",
                    HINT_RANGE if "[" in unknown[0] else 'deps name tasks, e.g. "producer.load_k[0]"')
        if name in deps:
            return f"{what}: {name} waits for itself", "a task waits for other tasks only"
    try:
        schedule.simulate(_task_list(graph, n, consumers, schedule.durations()))
    except ValueError as e:
        if "cycle" in str(e):
            return f"{what}: the dependencies form a cycle ({str(e)[:120]})", HINT_CYCLE
        raise
    return None


def _valid_graph(impl, n, consumers):
    graph = _graph(impl, n, consumers)
    problem = _problems_with_tasks(graph, n, consumers)
    if problem:
        checks.fail(*problem)
    return graph


def _sizes(rng, consumers):
    return [1, 2, int(rng.integers(3, 7)), int(rng.integers(7, 13))]


# ---------------------------------------------------------------------------------------------
# the checks

def check_tasks(impl, rng):
    """every task of every consumer warpgroup once (prologue, loop, epilogue), deps that name
    tasks of the loop, no cycle; 1 to 12 key blocks, one and two consumers"""
    for consumers in (1, 2):
        for n in _sizes(rng, consumers):
            _valid_graph(impl, n, consumers)


def _first_missing(graph, n, consumers, relations):
    """The missing ordering whose reader comes first in the learner's list, or None."""
    closure = _closure(_producer(n, consumers) + list(graph))
    position = {name: i for i, (name, _) in enumerate(graph)}
    missing = [(position[reader], k, (reader, writer, why))
               for k, (reader, writer, why) in enumerate(relations)
               if writer not in closure.get(reader, set())]
    return min(missing)[2] if missing else None


def _timeline_note(graph, n, consumers, reader, writer):
    """Where the hazard shows in the timeline at H100 figures (it may not show at these)."""
    result = schedule.simulate(_task_list(graph, n, consumers, schedule.durations()))
    at = {t.name: (s, e) for t, s, e in result.slots}
    start, end = at[reader][0], at[writer][1]
    if start < end - 1e-12:
        return f" (at an H100's figures it starts at {start:.2f} us, before {writer} ends at {end:.2f} us)"
    return " (nothing makes it wait: with other durations it starts too early)"


def _expect_relations(impl, rng, kinds, consumers_list=(1, 2)):
    for consumers in consumers_list:
        for n in _sizes(rng, consumers):
            graph = _valid_graph(impl, n, consumers)
            relations = [r for r in _required(n, consumers) if r[2] in kinds]
            missing = _first_missing(graph, n, consumers, relations)
            if missing:
                reader, writer, why = missing
                checks.fail(f"fa3_schedule({n}, consumers={consumers}): {reader} may start before "
                            f"{writer} has ended" + _timeline_note(graph, n, consumers, reader, writer),
                            REQUIRED_HINT[why])


def check_inputs_ready(impl, rng):
    """no hazard: K_j, V_j, S_j, P_j, the running max and O ready before their reader starts, and
    S_j only once P_{j-2} has left its registers, whatever the durations"""
    _expect_relations(impl, rng, ("K", "S", "P", "V", "max", "O", "registers"))


def check_algorithm_2_order(impl, rng):
    """Algorithm 2's order: S_j issued after softmax_{j-1}; the PV of block j-1 deferred behind
    S_j (a warpgroup's wgmmas in issue order)"""
    _expect_relations(impl, rng, ("issue", "defer"))


def check_pingpong(impl, rng):
    """two consumers: the GEMMs of each turn after those of the turn before (wg1, wg2, wg1, ...),
    in the graph and in the tensor cores' lane of the timeline"""
    for n in _sizes(rng, 2):
        graph = _valid_graph(impl, n, 2)
        closure = _closure(_producer(n, 2) + graph)
        turns = _turns(n, 2)
        waits = {(name[:3], d[:3]) for name, deps in graph for d in deps if d[:3] != name[:3]}
        both = {("wg1", "wg2"), ("wg2", "wg1")}
        hint = (HINT_BARRIER if both <= waits else
                HINT_BARRIER_ONE_WAY if waits & both else HINT_BARRIER_MISSING)
        for k in range(1, len(turns)):
            (wg_before, before), (wg, after) = turns[k - 1], turns[k]
            for gemm in after:
                loose = [g for g in before if g not in closure[gemm]]
                if loose:
                    checks.fail(f"fa3_schedule({n}, consumers=2): {gemm} (in {wg}'s turn {k // 2}) "
                                f"may run before {loose[0]} ({wg_before}'s turn before it) has ended",
                                hint)
        turn_of = {g: k for k, (_, gemms) in enumerate(turns) for g in gemms}
        result = schedule.simulate(_task_list(graph, n, 2, schedule.durations()))
        lane = [t.name for t, _, _ in result.slots if t.resource == "tensor"]
        for a, b in zip(lane, lane[1:]):
            if turn_of[b] < turn_of[a]:
                checks.fail(f"fa3_schedule({n}, consumers=2): on the tensor cores {b} runs after "
                            f"{a}, a GEMM of a later turn", HINT_BARRIER)


def _extra_hint(reader, writer):
    if reader.split(".")[0] != writer.split(".")[0] and not writer.startswith("producer"):
        return HINT_OTHER_WG
    if ".softmax" in reader and ".gemm1" in writer:
        return HINT_SOFTMAX_WAITS
    if ".gemm0" in reader and ".gemm1" in writer or ".softmax" in reader and ".gemm0" in writer:
        return HINT_DEFER + " (and no more: the PV of block j is issued after S_{j+1})"
    return HINT_EXTRA


def check_overlap(impl, rng):
    """the overlap achieved: no wait Algorithm 2 and the barriers do not have, and the tensor
    cores at least as busy as with the reference graph (within 1%) at head dims 64, 128 and 256"""
    for consumers in (1, 2):
        for n in _sizes(rng, consumers)[1:]:
            graph = _valid_graph(impl, n, consumers)
            mine = _closure(_producer(n, consumers) + graph)
            ref = _closure(_producer(n, consumers) + _reference(n, consumers))
            for name, _ in graph:
                extra = sorted(mine[name] - ref[name], key=lambda x: (x.startswith("producer"), x))
                if extra:
                    checks.fail(f"fa3_schedule({n}, consumers={consumers}): {name} waits for "
                                f"{extra[0]}, which Algorithm 2 does not make it wait for",
                                _extra_hint(name, extra[0]))
            for d in (64, 128, 256):
                dur = schedule.durations(d=d)
                got = schedule.simulate(_task_list(graph, n, consumers, dur))
                want = schedule.simulate(_task_list(_reference(n, consumers), n, consumers, dur))
                if got.total > want.total * 1.01 + 1e-12:
                    checks.fail(f"fa3_schedule({n}, consumers={consumers}) at d={d}: the loop takes "
                                f"{got.total:.2f} us (tensor cores {got.utilisation():.0%} busy), "
                                f"Algorithm 2 {want.total:.2f} us ({want.utilisation():.0%})",
                                "list the tasks in the order the warpgroups issue them (ties go to "
                                "the earlier task): iteration by iteration, wg1's part then wg2's")


CHECKS = [check_tasks, check_inputs_ready, check_algorithm_2_order, check_pingpong, check_overlap]


@pytest.mark.parametrize("check", CHECKS, ids=grading.check_id)
def test_ex12b(check, exercise_impl, grader_seed):
    grading.pytest_run(check, exercise_impl, grader_seed)
