"""vramkit.torch's step marks for plan_steps: which optimizer paces the steps, and when the marks
give way to the program's own.

PyTorch is not installed on the CI machine (no GPU): these tests drive the hook with plain
objects shaped like an optimizer (``param_groups`` of parameters with a ``device``), on a host
pool. The GPU suite runs the same hook under real PyTorch training GPT-2
(test_gpu_integrations.py, test_gpt2_training_with_step_plans_marked_by_the_optimizer).
"""
from __future__ import annotations

import gc
from collections import OrderedDict
from types import SimpleNamespace

import pytest

import vramkit
import vramkit.torch as vt
from vramkit import _vramkit


class Param:
    def __init__(self, kind="cuda", index=0):
        self.device = SimpleNamespace(type=kind, index=index)


class Optimizer:
    """What the hook reads of a torch.optim.Optimizer."""

    def __init__(self, *params):
        self.param_groups = [{"params": list(params)}]


class Hooks:
    """PyTorch's global optimizer post-hooks as torch.optim.Optimizer keeps and calls them: an
    OrderedDict iterated at each step, and handles whose remove() deletes their entry."""

    def __init__(self):
        self.hooks = OrderedDict()
        self.next_id = 0

    def register(self, hook):
        key = self.next_id
        self.next_id += 1
        self.hooks[key] = hook
        hooks = self.hooks
        return SimpleNamespace(remove=lambda: hooks.pop(key, None))

    def step(self, optimizer):
        for hook in self.hooks.values():
            hook(optimizer, (), {})


def fake_torch(hooks, capturing=False):
    return SimpleNamespace(optim=SimpleNamespace(optimizer=SimpleNamespace(register_optimizer_step_post_hook=hooks.register)),
                           cuda=SimpleNamespace(is_current_stream_capturing=lambda: capturing))


@pytest.fixture
def plan_pool():
    """A host pool with plan_steps as device 0's current resource; the manual-mark flag clear. Its
    plan is made as soon as it is laid out (plan_needs_moves:false): these steps settle without
    one, and the tests count plans to see the marks."""
    previous = _vramkit.current_resource(0)
    pool = vramkit.make_resource("pool:plan_steps:true,plan_needs_moves:false", 0)
    _vramkit.set_current_resource(pool, 0)
    vramkit._manual_marks[0] = False
    yield pool
    _vramkit.set_current_resource(previous, 0)
    vramkit._manual_marks[0] = False


def one_step(pool, sizes=(12 << 20, 3 << 20, 20 << 20)):
    ptrs = [pool.allocate(n) for n in sizes]
    for p, n in zip(reversed(ptrs), reversed(sizes)):
        pool.deallocate(p, n)
    return ptrs


def test_conf_strings_that_turn_plans_on():
    assert vt._plans_steps("plan_steps:true")
    assert vt._plans_steps("upstream=vmm,growth_slack:0.05,plan_steps:ON")
    assert vt._plans_steps(" plan_steps : 1 ")
    assert vt._plans_steps("")  # the pool's default
    assert not vt._plans_steps("plan_steps:false,remap:true")
    assert not vt._plans_steps("plan_steps:maybe")  # the pool refuses it when built; not on here
    assert not vt._plans_steps("my_plan_steps:true")
    # the last mention counts, as when VRAMKIT_ALLOC_CONF and use()'s options are joined
    assert vt._plans_steps("plan_steps:false,plan_steps:true")
    assert not vt._plans_steps("plan_steps:true,growth_slack:0,plan_steps:false")


def test_use_refuses_an_unknown_mark_source_before_anything():
    with pytest.raises(ValueError, match="mark_steps must be one of 'optimizer', 'manual', not 'epoch'"):
        vt.use(mark_steps="epoch", plan_steps=True)
    assert not vt.is_active()


def test_a_device_plans_only_with_a_paged_pool_that_has_the_option(plan_pool):
    assert vt._device_plans(0)
    _vramkit.set_current_resource(vramkit.make_resource("pool", 0), 0)
    assert vt._device_plans(0)  # the pool's default
    _vramkit.set_current_resource(vramkit.make_resource("pool:plan_steps:false", 0), 0)
    assert not vt._device_plans(0)
    _vramkit.set_current_resource(vramkit.make_resource("host", 0), 0)
    assert not vt._device_plans(0)


def test_the_pacing_optimizers_steps_make_the_pools_plan(plan_pool):
    marks = vt._OptimizerMarks()
    opt = Optimizer(Param(), Param())
    seen = []
    for _ in range(7):
        seen.append(one_step(plan_pool))
        marks(opt, (), {})  # after step(): the hook PyTorch calls
    c = plan_pool.pool_counters()
    assert marks.marks == 7 and marks.devices() == [0]
    assert c["plans_made"] == 1 and c["plan_missed"] == 0 and c["plan_placed"] > 0
    # marks after the step: the plan is laid out at the 4th mark, so the 5th step on is planned
    assert seen[4] == seen[5] == seen[6] and seen[4] != seen[3]


def test_only_one_optimizer_marks_a_device(plan_pool):
    marks = vt._OptimizerMarks()
    gen, disc = Optimizer(Param()), Optimizer(Param())
    for _ in range(6):
        one_step(plan_pool)
        marks(disc, (), {})  # a GAN's two optimizers each step once an iteration: the first paces
        marks(gen, (), {})
    assert marks.marks == 6
    assert marks.pacers[0]() is disc
    assert plan_pool.pool_counters()["plans_made"] == 1


def test_each_device_is_marked_by_its_own_optimizer(monkeypatch):
    # Pipeline stages in one process: an optimizer per device. (The host backend has one
    # device: two host pools stand for devices 0 and 1.)
    pools = {d: vramkit.make_resource("pool:plan_steps:true,plan_needs_moves:false", 0) for d in (0, 1)}
    monkeypatch.setattr(vt, "_vramkit", SimpleNamespace(current_resource=lambda d: pools[d]))
    vramkit._manual_marks[0] = False
    marks = vt._OptimizerMarks()
    first, second = Optimizer(Param("cuda", 0)), Optimizer(Param("cuda", 1))
    for _ in range(6):
        for d in (0, 1):
            one_step(pools[d])
        marks(first, (), {})
        marks(second, (), {})
    assert marks.devices() == [0, 1] and marks.marks == 12
    assert all(pools[d].pool_counters()["plans_made"] == 1 for d in (0, 1))


def test_an_optimizer_of_cpu_parameters_does_not_pace(plan_pool):
    marks = vt._OptimizerMarks()
    cpu, gpu = Optimizer(Param("cpu", None)), Optimizer(Param("cuda", 0))
    marks(cpu, (), {})
    assert marks.marks == 0 and marks.devices() == []
    marks(gpu, (), {})
    marks(cpu, (), {})
    assert marks.marks == 1 and marks.pacers[0]() is gpu


def test_an_optimizer_on_a_pool_without_plans_does_not_pace(plan_pool):
    _vramkit.set_current_resource(vramkit.make_resource("pool:plan_steps:false", 0), 0)
    marks = vt._OptimizerMarks()
    marks(Optimizer(Param()), (), {})
    assert marks.marks == 0 and marks.devices() == []


def test_a_new_optimizer_paces_when_the_old_one_is_gone(plan_pool):
    marks = vt._OptimizerMarks()
    old = Optimizer(Param())
    marks(old, (), {})
    new = Optimizer(Param())
    marks(new, (), {})
    assert marks.marks == 1  # the old one still paces
    del old
    gc.collect()
    marks(new, (), {})
    assert marks.marks == 2 and marks.pacers[0]() is new


def test_steps_being_captured_mark_nothing(plan_pool):
    marks = vt._OptimizerMarks(fake_torch(Hooks(), capturing=True))
    marks(Optimizer(Param()), (), {})
    assert marks.marks == 0


def test_the_programs_own_mark_turns_the_optimizers_off(plan_pool, monkeypatch):
    hooks = Hooks()
    marks = vt._OptimizerMarks.install(fake_torch(hooks))
    hooks.register(lambda optimizer, args, kwargs: None)  # someone else's hook, after vramkit's
    monkeypatch.setitem(vt._state, "marks", marks)
    opt = Optimizer(Param())
    hooks.step(opt)
    assert marks.marks == 1
    vt.mark_step(0)  # the program marks its steps itself: the hook goes, outside PyTorch's loop
    assert len(hooks.hooks) == 1 and marks.handle is None
    hooks.step(opt)  # no "OrderedDict mutated during iteration"
    marks(opt, (), {})  # and a call already under way marks nothing
    assert marks.marks == 1
    # each step was marked once: the pool saw the optimizer's first mark and the program's
    assert plan_pool.pool_counters()["plans_made"] == 0


def test_step_marks_without_pytorch_in_use():
    vramkit._manual_marks[0] = False
    assert vt.step_marks() == {"source": "none", "marks": 0, "devices": [], "pool_period": 0}
