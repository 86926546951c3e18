"""flashlib.teach.mbarrier (lesson 12, exercise 12c): the model of mbarriers and FA3's ring.

A barrier's phases follow PTX's rule (arrivals plus expected bytes, parity waits, a fresh
barrier's previous phase complete); flashlib's producer and consumers run through every variant's
layout without a hazard; the producer without its waits on ``empty`` is caught racing ahead; a
Gluon function's body is logged through stand-ins; and `flashlib check ex12c` on a machine without
Hopper says that its kernel check did not run.
"""
import random

import pytest

from flashlib import course
from flashlib.course import self_check
from flashlib.teach import mbarrier


def test_a_phase_needs_its_arrivals_and_its_bytes():
    bar = mbarrier.Barrier("b", 1)
    assert list(_passes(bar, 1)) == [] and next(_passes(bar, 0)) == "blocked"   # fresh: parity 1 done
    bar.expect(100)
    assert bar.phase == 0                      # the arrival is in, 100 bytes are not
    bar.complete_tx(60)
    assert bar.phase == 0
    bar.complete_tx(40)
    assert bar.phase == 1 and list(_passes(bar, 0)) == []
    bar.complete_tx(8)                         # bytes before the expect: the count goes below 0
    bar.expect(8)
    assert bar.phase == 2
    with pytest.raises(mbarrier.ProtocolError, match="arrivals") as e:
        bar.expect(4)
        bar.arrive()
    assert e.value.kind == "arrivals"


def _passes(bar, parity):
    ring = mbarrier.Ring(1, 1)
    return ring.wait(bar, parity)


@pytest.mark.parametrize("num_wg, overlap, pingpong", [(1, False, False), (2, False, False), (2, True, True)])
def test_flashlibs_producer_and_consumers_have_no_hazard(num_wg, overlap, pingpong):
    for stages in (1, 2, 3):
        for n_blocks in (0, 1, 5, 9):
            for seed in ("first", 0, 1, 2):
                ring = mbarrier.Ring(num_wg, stages)
                parts = {"producer": mbarrier.producer(ring, n_blocks),
                         **{f"consumer {w}": mbarrier.consumer(ring, w, n_blocks, overlap, pingpong)
                            for w in range(num_wg)}}
                mbarrier.interleave(ring, parts, random.Random(0 if seed == "first" else seed),
                                    producer_first=seed == "first")


def test_a_producer_that_does_not_wait_for_empty_is_caught():
    def hasty(ring, n_blocks):
        for j in range(n_blocks):
            for kind in "kv":
                ring.ready[kind][j % ring.stages].expect(1)
                ring.tma(ring.ready[kind][j % ring.stages], (kind, j % ring.stages), j)
                yield

    ring = mbarrier.Ring(2, 2)
    parts = {"producer": hasty(ring, 6),
             **{f"consumer {w}": mbarrier.consumer(ring, w, 6, True, True, q_loaded=False) for w in range(2)}}
    with pytest.raises(mbarrier.ProtocolError) as e:
        mbarrier.interleave(ring, parts, random.Random(0), producer_first=True)
    assert e.value.kind in ("arrivals", "overwrite", "wrong block", "phase")


def test_a_gluon_loop_is_logged_through_stand_ins():
    solution = course.load_module(course.find_root() / "solutions" / "ex12c_tma_producer.py")
    events = mbarrier.record(solution.load_kv, 2, 512, 1, 3, 100, 3, 64)
    assert [e[0] for e in events[:3]] == ["wait", "expect", "copy"]
    assert events[0] == ("wait", ("k_empty", 0), 1)
    assert ("copy", "v", (1, 3, 228, 0), ("v_ready", 0), ("v_smem", 0)) in events    # block 2: stage 0
    assert sum(e[0] == "copy" for e in events) == 6
    def past_the_ring(k_desc, v_desc, k_smem, *rest):
        k_smem.index(2)

    error = mbarrier.record(past_the_ring, 2, 512, 0, 0, 0, 1, 64)[-1]
    assert error[:2] == ("error", "index") and "2 stages" in error[2]


def test_check_says_the_kernel_check_needs_hopper(capsys, monkeypatch):
    from flashlib import runtime
    monkeypatch.setattr(runtime, "HAS_CUDA", False)
    assert self_check.check("ex12c", impl="solutions", seed=1)
    out = capsys.readouterr().out
    assert "ex12c passed" in out and "did not run: no GPU here" in out


def test_a_triton_without_gluon_gets_a_hint_not_just_an_import_error(tmp_path, monkeypatch):
    from flashlib.course import grading
    file = tmp_path / "ex12c_tma_producer.py"
    file.write_text("from triton.experimental.gluon.language.nvidia.nosuch import mbarrier\n")
    for has_gluon, hinted in ((True, False), (False, True)):
        monkeypatch.setattr(grading, "_has_gluon_hopper", lambda: has_gluon)
        report = grading.run_checks("ex12c", path=file, seed=1)
        assert report.status == "error" and "fails on import: ModuleNotFoundError" in report.problem
        assert ("Hopper API (mbarrier, tma) this Triton" in report.problem) == hinted
