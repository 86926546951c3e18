"""The launch layer (flashlib/kernels/launch.py) on a CPU: plan keys, and what a recorded launch
passes to Triton's launcher, checked against a stand-in for a compiled kernel. The real launches
are checked on a GPU (test_flash_attention's test_gpu_planned_launches_replay_the_plain_ones)."""
import types

import pytest
import torch

from flashlib import runtime
from flashlib.kernels import launch


@pytest.fixture
def enabled(monkeypatch):
    # direct launches stand-in for a GPU with a tested Triton (a capability, not a switch)
    monkeypatch.setattr(launch, "SUPPORTED", True)


def test_plan_key_tells_apart_what_a_launch_depends_on(enabled):
    a, b = torch.zeros(2, 3, 64), torch.ones(2, 3, 64)
    key = lambda *ts, options=("causal",): launch.plan_key(ts, options)   # noqa: E731
    assert key(a) == key(b)                                   # other data, same launch
    assert key(a) != key(torch.zeros(400)[2:2 + 384].view(2, 3, 64))   # 8 bytes off 16-byte alignment
    assert key(a) != key(a.half())
    assert key(a) != key(a[:, :2])                            # shape
    assert key(a) != key(torch.zeros(3, 2, 64).transpose(0, 1))   # strides
    assert key(a) != key(a, options=("not causal",))
    assert key(a, b) != key(a)
    assert key(a.transpose(1, 2)) is None                     # strided last dim: the plain path
    on_gpu = types.SimpleNamespace(shape=b.shape, stride=b.stride, dtype=b.dtype,
                                   data_ptr=b.data_ptr, get_device=lambda: 0)
    assert key(a, b) != key(a, on_gpu)                        # every tensor's device, not only q's


def test_plan_key_keys_on_the_options_and_is_none_where_launches_must_be_plain(enabled, monkeypatch):
    x = (torch.zeros(4),)
    assert launch.plan_key(x, ()) is not None
    assert launch.plan_key(x, (), runtime.OPTIONS.replace(fa3_fold_scale=False)) != launch.plan_key(x, ())
    assert launch.plan_key(x, (), runtime.OPTIONS.replace(fast_launch=False)) is None
    with runtime.kernel_options(fast_launch=False):
        assert launch.plan_key(x, ()) is None
    with runtime.kernel_options(launch_hook=print):
        assert launch.plan_key(x, ()) is None
    monkeypatch.setattr(launch, "SUPPORTED", False)       # the interpreter, another Triton
    assert launch.plan_key(x, ()) is None


def test_a_launch_hook_sees_every_launch_instead_of_triton():
    kernel = FakeKernel(["X", "BLOCK"])
    seen = []
    with runtime.kernel_options(launch_hook=lambda *call: seen.append(call) or "hooked"):
        assert launch.run(kernel, (3,), torch.zeros(4), BLOCK=16) == "hooked"
        assert launch.fast_launch(kernel, (3,), torch.zeros(4), BLOCK=16) is None
    assert [(grid, kw) for _, grid, _, kw in seen] == [((3,), {"BLOCK": 16})] * 2 and kernel.plain_calls == []
    launch.run(kernel, (3,), torch.zeros(4), BLOCK=16)
    assert len(kernel.plain_calls) == 1


class FakeLauncher:
    """What Triton 3.6 compiles a kernel's launcher into: a C entry point, metadata."""
    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid, launch_pdl = 0, 1

    def __init__(self):
        self.calls = []

    def launch(self, *args):
        self.calls.append(args)


class FakeKernel:
    """kernel[grid](*args, **kwargs) as Triton runs it: compiles once, launches, returns the
    compiled kernel."""
    def __init__(self, names):
        self.params = [types.SimpleNamespace(name=n) for n in names]
        self.compiled = types.SimpleNamespace(run=FakeLauncher(), function=0xF00, packed_metadata=(4, 1, 0))
        self.plain_calls = []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.plain_calls.append((grid, args, kwargs))
            return self.compiled
        return run


def test_fast_launch_records_a_launch_that_replays_the_same_arguments(enabled, monkeypatch):
    fake_driver = types.SimpleNamespace(get_current_device=lambda: 0,
                                        get_current_stream=lambda device: 1000 + device)
    monkeypatch.setattr(launch, "_driver", lambda: fake_driver)
    monkeypatch.setattr(launch, "_hooks_set", lambda: False)
    kernel = FakeKernel(["X", "Y", "n", "scale", "BLOCK", "EVEN"])
    x, y = torch.zeros(100), torch.zeros(100)
    grid = lambda meta: (launch_count(100, meta["BLOCK"]),)    # noqa: E731
    first = launch.fast_launch(kernel, grid, x, y, 100, 0.5, BLOCK=32, EVEN=False)
    assert len(kernel.plain_calls) == 1 and kernel.compiled.run.calls == []   # Triton launched it
    assert first.grid == (4, 1, 1) and first.scalars == (100, 0.5, 32, False)
    again = launch.fast_launch(kernel, grid, x, y, 100, 0.5, BLOCK=32, EVEN=False)
    assert len(kernel.plain_calls) == 1 and again == first    # a memo hit: launched directly
    x2, y2 = torch.ones(100), torch.ones(100)
    first(x2, y2)                                             # a plan's replay
    head = (4, 1, 1, 1000, 0xF00, 0, 1, None, None, (4, 1, 0), None, None, None)
    assert [c[:13] for c in kernel.compiled.run.calls] == [head, head]
    # tensors go to Triton as they are on its own launch, as addresses on a replay
    assert kernel.compiled.run.calls[0][13:] == (x.data_ptr(), y.data_ptr(), 100, 0.5, 32, False)
    assert kernel.compiled.run.calls[1][13:] == (x2.data_ptr(), y2.data_ptr(), 100, 0.5, 32, False)
    launch.fast_launch(kernel, grid, x, y, 101, 0.5, BLOCK=32, EVEN=False)
    assert len(kernel.plain_calls) == 2                       # another signature: Triton again


def launch_count(n, block):
    return -(-n // block)


def test_remember_keeps_only_complete_plans():
    plans = {}
    launch.remember(plans, None, ("a",))
    launch.remember(plans, ("k",), ("a", None))
    assert plans == {}
    launch.remember(plans, ("k",), ("a", "b"))
    assert plans == {("k",): ("a", "b")}
