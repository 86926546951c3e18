"""A model of Hopper's mbarriers, TMA loads and FA3's ring of K/V stages (lesson 12, exercise 12c).

FlashAttention-3 (Shah et al., 2024, section 3.1) splits a CTA into a producer warp, which issues
TMA loads of K and V into a ring of shared-memory stages, and consumer warpgroups, which read
them with wgmma. They synchronise through mbarriers (PTX ISA, "mbarrier" section): a barrier
completes a *phase* once its expected arrivals have arrived and the transaction bytes it was told
to expect (``expect``, an arrive with expect-tx) have landed; ``wait(bar, parity)`` returns once
the phase of that parity is complete, and a fresh barrier's "previous" phase (parity 1) counts as
complete. flashlib's kernel (``kernels/fa3_fwd.py``) uses, per stage s:

    k_ready[s], v_ready[s]  producer -> consumers: 1 arrival (the expect) + the block's bytes
    k_empty[s], v_empty[s]  consumers -> producer: one arrival per consumer warpgroup

Here the partitions are Python generators over a ``Ring`` that yield where another partition may
run; ``interleave`` runs them and the TMA completions in a random order and raises
``ProtocolError`` on a deadlock, on a TMA write into a stage a wgmma still reads, on a read of a
stage that does not hold the block expected, or on a consumer's wait that passes on the wrong
phase (a barrier two phases ahead). ``consumer`` is flashlib's consumer, step by step; a producer
is either ``producer`` (flashlib's loop, ``fa3_fwd.load_kv_ring``) or ``replay`` of a Gluon
function's Python body run with stand-ins for ``mbarrier``, ``tma`` and ``gl`` (``record``):
exercise 12c's grader checks a learner's producer loop this way before it runs on a GPU.
``benchmarks/probes/hopper_compile_check.py`` checks the kernel's own protocol with it.
"""
import types


class ProtocolError(Exception):
    """The protocol failed; ``kind`` is one of "deadlock", "overwrite", "wrong block",
    "phase", "arrivals", "index", "call" (None: another model's)."""

    def __init__(self, message, kind=None):
        super().__init__(message)
        self.kind = kind


class Barrier:
    """An mbarrier: ``count`` arrivals plus the expected transaction bytes complete a phase."""

    def __init__(self, name, count):
        self.name, self.count, self.arrivals, self.tx, self.phase = name, count, 0, 0, 0

    def _complete(self):
        if self.arrivals == self.count and self.tx == 0:
            self.phase, self.arrivals = self.phase + 1, 0

    def arrive(self):
        self.arrivals += 1
        if self.arrivals > self.count:
            raise ProtocolError(f"{self.name}: {self.arrivals} arrivals in a phase that completes at "
                                f"{self.count}: a new phase's arrival came before the last phase completed",
                                "arrivals")
        self._complete()

    def expect(self, nbytes):        # mbarrier.arrive.expect_tx
        self.tx += nbytes
        self.arrive()

    def complete_tx(self, nbytes):   # the TMA engine, once the bytes have landed
        self.tx -= nbytes
        self._complete()

    def state(self):
        waiting = f", {self.tx} bytes still expected" if self.tx > 0 else (
            f", {-self.tx} bytes more than expected" if self.tx < 0 else "")
        return f"{self.name} (phase {self.phase}, {self.arrivals} of {self.count} arrivals{waiting})"


class Ring:
    """One CTA's barriers and stages. ``block(kind, j)``: what stage ``(kind, s)`` must hold when
    a consumer reads block j of ``kind`` ("k" or "v"); by default j itself."""

    def __init__(self, num_wg, stages, block=None):
        self.num_wg, self.stages = num_wg, stages
        self.block = block or (lambda kind, j: j)
        self.q_bar = [Barrier(f"q_bar[{w}]", 1) for w in range(num_wg)]
        self.turn = [Barrier(f"turn[{w}]", 1) for w in range(num_wg)]
        self.ready = {kind: [Barrier(f"{kind}_ready[{s}]", 1) for s in range(stages)] for kind in "kv"}
        self.empty = {kind: [Barrier(f"{kind}_empty[{s}]", num_wg) for s in range(stages)] for kind in "kv"}
        self.held, self.readers, self.tma_queue, self.waiting = {}, {}, [], {}

    def wait(self, bar, parity, index=None, who=""):
        """mbarrier.wait(bar, parity): passes once the phase of that parity is complete. index:
        the completion the waiter means (-1: the fresh barrier's "previous" phase), to catch a
        parity that passes on another phase; None: not checked."""
        while (bar.phase & 1) == parity:
            if index is not None and bar.phase > index + 1:    # its phase came and went: never passes
                break
            self.waiting[who] = f"{who} waits on {bar.state()} for parity {parity}"
            yield "blocked"
        self.waiting.pop(who, None)
        if index is not None and bar.phase != index + 1:
            raise ProtocolError(f"{who}: its wait on {bar.name} for completion {index} passed at phase "
                                f"{bar.phase}: the barrier ran two phases ahead of it", "phase")

    def tma(self, bar, stage, value, nbytes=1):
        """A TMA load into ``stage`` (("k", s), ...), completing ``nbytes`` on ``bar`` once landed."""
        self.tma_queue.append((bar, stage, value, nbytes))

    def read(self, stage, kind, j):   # a wgmma starts reading block j from a stage
        want = self.block(kind, j)
        if self.held.get(stage) != want:
            raise ProtocolError(f"a consumer reads {kind.upper()} block {j} from {stage[0]}_smem[{stage[1]}], "
                                f"which holds {self.held.get(stage)}, not {want}", "wrong block")
        self.readers[stage] = self.readers.get(stage, 0) + 1

    def done(self, stage):           # ... and has finished (warpgroup_mma_wait)
        self.readers[stage] -= 1


def producer(ring, n_blocks):
    """flashlib's producer (``fa3_fwd._producer``: Q, then ``load_kv_ring``), step by step."""
    for w in range(ring.num_wg):
        ring.q_bar[w].expect(1)
        ring.tma(ring.q_bar[w], ("q", w), 0)
    for j in range(n_blocks):
        s, phase = j % ring.stages, (j // ring.stages) & 1
        for kind in "kv":
            yield from ring.wait(ring.empty[kind][s], phase ^ 1, j // ring.stages - 1, "the producer")
            ring.ready[kind][s].expect(1)
            ring.tma(ring.ready[kind][s], (kind, s), ring.block(kind, j))
            yield


def consumer(ring, w, n_blocks, overlap, pingpong, q_loaded=True):
    """``fa3_fwd._consumer`` (warpgroup w), step by step; a yield is where others may run.
    q_loaded: a producer loads Q (flashlib's); False: Q is taken as there (a replayed loop)."""
    st, who = ring.stages, f"consumer {w}"

    def take(kind, j):               # wait for block j of kind, start reading it
        s = j % st
        yield from ring.wait(ring.ready[kind][s], (j // st) & 1, j // st, who)
        ring.read((kind, s), kind, j)

    def release(kind, j):
        ring.done((kind, j % st))
        ring.empty[kind][j % st].arrive()

    if q_loaded:
        yield from ring.wait(ring.q_bar[w], 0, 0, who)
    if overlap and n_blocks > 0:
        yield from take("k", 0)
        yield
        release("k", 0)
        yield
        for j in range(1, n_blocks):
            if pingpong:   # consumer 0's k-th turn follows the last consumer's (k-1)-th
                yield from ring.wait(ring.turn[w], ((j - 1) & 1) ^ (1 if w == 0 else 0), j - 1 - (w == 0), who)
            yield from take("k", j)
            yield from take("v", j - 1)
            if pingpong:
                ring.turn[(w + 1) % ring.num_wg].arrive()
            yield
            release("k", j)              # warpgroup_mma_wait(1): S_j done
            yield
            release("v", j - 1)          # warpgroup_mma_wait(0): P V done
            yield
        yield from take("v", n_blocks - 1)
        yield
        release("v", n_blocks - 1)
    elif not overlap:
        for j in range(n_blocks):
            for kind in "kv":
                yield from take(kind, j)
                yield
                release(kind, j)
                yield
    if q_loaded and ring.held.get(("q", w)) != 0:      # O is stored through the Q buffer
        raise ProtocolError(f"consumer {w} writes O into a Q buffer whose load has not landed", "wrong block")


def interleave(ring, parts, rng, producer_first=False):
    """Run the partitions (generators over ``ring``) and the TMA completions in a random order
    until all are done; raises ProtocolError on a deadlock or a TMA write into a stage a wgmma
    still reads. producer_first: run "producer" whenever it is not blocked (it races ahead of
    the consumers, as a warp that only issues loads does)."""
    stuck, blocked = 0, False
    while parts or ring.tma_queue:
        if producer_first and "producer" in parts and not blocked:
            pick = "producer"
        else:
            pick = rng.choice(list(parts) + (["tma"] if ring.tma_queue else []))
        if pick == "tma":
            bar, stage, value, nbytes = ring.tma_queue.pop(rng.randrange(len(ring.tma_queue)))
            if ring.readers.get(stage, 0):
                raise ProtocolError(f"a TMA load writes {stage[0]}_smem[{stage[1]}] while a consumer's wgmma "
                                    f"still reads {ring.held.get(stage)} there", "overwrite")
            ring.held[stage] = value
            bar.complete_tx(nbytes)
            stuck, blocked = 0, False
            continue
        try:
            state = next(parts[pick])
        except StopIteration:
            del parts[pick]
            state = None
        if state == "blocked":
            stuck, blocked = stuck + 1, blocked or pick == "producer"
        else:
            stuck, blocked = 0, False
        if stuck > 50 * (len(parts) + 1) and not ring.tma_queue:
            raise ProtocolError("deadlock: every partition waits and no TMA load is in flight: "
                                + "; ".join(ring.waiting.values() or parts), "deadlock")


# ---------------------------------------------------------------------------------------------
# a Gluon producer loop, run as Python with stand-ins, then replayed

class _Descriptor:
    def __init__(self, kind, nbytes):
        self.kind, self.block_type = kind, types.SimpleNamespace(nbytes=nbytes)


class _Indexed:
    """k_smem, k_ready, ...: ``.index(s)`` of a ring of ``stages``."""

    def __init__(self, name, stages):
        self.name, self.stages = name, stages

    def index(self, s):
        if not isinstance(s, int) or not 0 <= s < self.stages:
            raise ProtocolError(f"{self.name}.index({s!r}): the ring has {self.stages} stages, "
                                f"0 .. {self.stages - 1}", "index")
        return (self.name, s)


BARRIERS, BUFFERS = ("k_ready", "k_empty", "v_ready", "v_empty"), ("k_smem", "v_smem")


def _stand_ins(events):
    """Stand-ins for Gluon's ``mbarrier``, ``tma`` and ``gl`` that append what is called to
    ``events``; {the real module's or function's id: its stand-in}."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

    def add(event):
        if len(events) > 200_000:
            raise ProtocolError("the loop made more than 200000 calls: does it end after n_blocks blocks?", "call")
        events.append(event)

    def ref(x, names, what, call):
        if not (isinstance(x, tuple) and len(x) == 2 and x[0] in names):
            raise ProtocolError(f"{call}: {x!r} is not {what}", "call")
        return x

    def wait(bar, phase, pred=True, deps=None):
        add(("wait", ref(bar, BARRIERS, "a barrier (k_empty.index(s), ...)", "mbarrier.wait"), phase))

    def expect(bar, nbytes, pred=True):
        add(("expect", ref(bar, BARRIERS, "a barrier", "mbarrier.expect"), nbytes))

    def arrive(bar, *, count=1, pred=True):
        add(("arrive", ref(bar, BARRIERS, "a barrier", "mbarrier.arrive"), count))

    def copy(desc, coord, bar, result, pred=True):
        call = "tma.async_copy_global_to_shared(descriptor, coordinates, barrier, buffer)"
        if not isinstance(desc, _Descriptor):
            raise ProtocolError(f"{call}: its first argument {desc!r} is not k_desc or v_desc", "call")
        add(("copy", desc.kind, tuple(coord), ref(bar, BARRIERS, "a barrier", call),
                       ref(result, BUFFERS, "a stage of k_smem or v_smem", call)))

    def module(name, **attrs):
        def missing(attr):
            raise ProtocolError(f"{name}.{attr} is not part of the producer's loop: it needs range, "
                                "mbarrier.wait, mbarrier.expect and tma.async_copy_global_to_shared", "call")
        m = types.ModuleType(name)
        m.__dict__.update(attrs, __getattr__=missing)
        return m

    fake = dict(mbarrier=module("mbarrier", wait=wait, expect=expect, arrive=arrive),
                tma=module("tma", async_copy_global_to_shared=copy),
                gl=module("gl", static_range=range, range=range))
    real = dict(mbarrier=mbarrier, tma=tma, gl=gl)
    swap = {id(real[name]): fake[name] for name in fake}
    swap.update({id(getattr(real[name], attr)): getattr(fake[name], attr)       # imported one by one
                 for name in ("mbarrier", "tma") for attr in vars(fake[name])
                 if not attr.startswith("_") and hasattr(real[name], attr)})
    return swap


def record(fn, stages, nbytes, batch, kv_head, first_row, n_blocks, block_n):
    """The events of a Gluon function with ``load_kv_ring``'s arguments (less V_T), its Python
    body run with stand-ins for Gluon's ``mbarrier``, ``tma`` and ``gl``: ("wait", (barrier, s),
    parity), ("expect", (barrier, s), nbytes), ("arrive", (barrier, s), count), ("copy", "k" or
    "v", coordinates, (barrier, s), (buffer, s)); barriers k_ready ... v_empty, buffers k_smem,
    v_smem. A stage past the ring or a call that is not the loop's ends the log with ("error",
    kind, message), kind "index" or "call" (plain data: the log may cross a process boundary)."""
    events = []
    swap = _stand_ins(events)
    body = getattr(fn, "fn", fn)                      # a @gluon.jit function's Python function
    scope = {name: swap.get(id(value), value) for name, value in body.__globals__.items()}
    run = types.FunctionType(body.__code__, scope, body.__name__, body.__defaults__, body.__closure__)
    rings = {name: _Indexed(name, stages) for name in BUFFERS + BARRIERS}
    try:
        run(_Descriptor("k", nbytes), _Descriptor("v", nbytes), rings["k_smem"], rings["v_smem"],
            rings["k_ready"], rings["k_empty"], rings["v_ready"], rings["v_empty"], batch, kv_head, first_row,
            n_blocks, block_n, stages)
    except ProtocolError as e:
        events.append(("error", e.kind, str(e)))
    return events


def replay(ring, events, nbytes):
    """A producer partition from ``record``'s events: waits block, the rest is issued."""
    barriers = {f"{kind}_{role}": getattr(ring, role)[kind] for kind in "kv" for role in ("ready", "empty")}
    for event in events:
        kind, *rest = event
        if kind == "wait":
            (name, s), parity = rest
            yield from ring.wait(barriers[name][s], parity, None, "the producer")
        elif kind == "expect":
            (name, s), n = rest
            barriers[name][s].expect(n)
        elif kind == "arrive":
            (name, s), count = rest
            for _ in range(count):
                barriers[name][s].arrive()
        else:                                  # a copy: (desc kind, coordinates, barrier, buffer)
            desc, coord, (name, s), (buffer, stage) = rest
            ring.tma(barriers[name][s], (buffer[0], stage), (desc, coord), nbytes)
        yield
