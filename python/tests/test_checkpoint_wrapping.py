"""How a plan is applied (segments, pass-through blocks, removal), on the host with a stand-in
for the few torch names the wrapping uses. The GPU tests run the same code with real PyTorch."""
from __future__ import annotations

import importlib.util
import sys
import types

import pytest

import vramkit.checkpoint as ck
from vramkit.checkpoint import Chain

if importlib.util.find_spec("torch") is not None:
    pytest.skip("real torch is installed: the GPU tests cover the wrapping", allow_module_level=True)


class Tensor:
    def __init__(self, v):
        self.v = v


class Module:
    def __init__(self):
        object.__setattr__(self, "_kids", {})

    def __setattr__(self, name, value):
        if isinstance(value, Module):
            self._kids[name] = value
        object.__setattr__(self, name, value)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def named_children(self):
        return list(self._kids.items())

    def children(self):
        return list(self._kids.values())

    def named_modules(self, prefix=""):
        yield prefix, self
        for n, c in self._kids.items():
            yield from c.named_modules(f"{prefix}.{n}" if prefix else n)


class ModuleList(Module):
    def __init__(self, mods):
        super().__init__()
        for i, m in enumerate(mods):
            self._kids[str(i)] = m

    def __len__(self):
        return len(self._kids)

    def __iter__(self):
        return iter(self._kids.values())


class Sequential(ModuleList):
    def __init__(self, *mods):
        super().__init__(mods)

    def forward(self, x):
        for m in self:
            x = m(x)
        return x


calls = []


def fake_checkpoint(fn, *args, use_reentrant=None, **kwargs):
    assert use_reentrant is False
    calls.append(len(args))
    return fn(*args, **kwargs)


@pytest.fixture(autouse=True)
def fake_torch(monkeypatch):
    torch = types.ModuleType("torch")
    torch.Tensor = Tensor
    nn = types.ModuleType("torch.nn")
    nn.Module, nn.ModuleList, nn.Sequential = Module, ModuleList, Sequential
    utils = types.ModuleType("torch.utils")
    cp = types.ModuleType("torch.utils.checkpoint")
    cp.checkpoint = fake_checkpoint
    torch.nn, torch.utils, utils.checkpoint = nn, utils, cp
    for name, mod in {"torch": torch, "torch.nn": nn, "torch.utils": utils, "torch.utils.checkpoint": cp}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    calls.clear()
    yield


class Affine(Module):
    def __init__(self, k):
        super().__init__()
        self.k = k

    def forward(self, x):
        return Tensor(x.v * 3 + self.k)


class Layer(Affine):
    """A Hugging Face-style layer: extra arguments, a tuple out."""
    def forward(self, hidden, mask=None, use_cache=False):
        assert mask == "m" and use_cache is False
        return (Tensor(hidden.v * 3 + self.k), None)


class Decoder(Module):
    def __init__(self, n, meddle=False):
        super().__init__()
        self.transformer = Module()
        self.transformer.h = ModuleList([Layer(i) for i in range(n)])
        self.meddle = meddle

    def forward(self, x):
        h = x
        for block in self.transformer.h:
            out = block(h, "m", use_cache=False)
            h = Tensor(out[0].v + 1) if self.meddle else out[0]
        return h


def _plan(segs, names):
    return ck.Plan(segments=segs, peak=0, extra_time=0.0, names=names)


def test_sequential_segments_match_plain_and_remove():
    model = Sequential(*[Affine(i) for i in range(6)])
    want = model(Tensor(1)).v
    names, mods = ck.find_blocks(model)
    assert names == [str(i) for i in range(6)] and len(mods) == 6
    ck.apply_plan(model, _plan([(0, 3, True), (3, 4, False), (4, 6, True)], names))
    assert model(Tensor(1)).v == want
    assert calls == [1, 1]                           # one checkpoint per segment
    assert "forward" in mods[1].__dict__ and "forward" not in mods[3].__dict__
    ck.remove(model)
    assert all("forward" not in m.__dict__ for m in mods)
    assert model(Tensor(1)).v == want and calls == [1, 1]


def test_a_forward_set_on_the_instance_by_another_tool_is_run_and_put_back():
    # accelerate and others replace a block's forward on the instance: a plan runs that forward
    # inside the checkpoint, and removing the plan (or profiling) leaves it in place.
    model = Sequential(*[Affine(i) for i in range(4)])
    names, mods = ck.find_blocks(model)
    seen = []
    for i in (1, 2):
        own = mods[i].forward
        def hooked(x, own=own, i=i):
            seen.append(i)
            return own(x)
        mods[i].forward = hooked
    theirs = {i: mods[i].__dict__["forward"] for i in (1, 2)}
    want = model(Tensor(1)).v
    seen.clear()
    ck.apply_plan(model, _plan([(0, 2, True), (2, 3, True), (3, 4, False)], names))
    assert model(Tensor(1)).v == want and seen == [1, 2]
    ck.apply_plan(model, _plan([(0, 1, False), (1, 4, True)], names))   # replaces the first plan
    seen.clear()
    assert model(Tensor(1)).v == want and seen == [1, 2]
    ck.remove(model)
    assert {i: mods[i].__dict__.get("forward") for i in (1, 2)} == theirs
    assert all("forward" not in mods[i].__dict__ for i in (0, 3))
    from vramkit.checkpoint.wrapping import _unwrap, _wrap
    for i in range(4):
        _wrap(mods, i, i + 1)
    _unwrap(mods)
    assert {i: mods[i].__dict__.get("forward") for i in (1, 2)} == theirs


def test_hf_style_loop_with_tuple_outputs_and_kwargs():
    model = Decoder(5)
    want = model(Tensor(2)).v
    names, _ = ck.find_blocks(model)
    assert names == [f"transformer.h.{i}" for i in range(5)]
    ck.apply_plan(model, _plan([(0, 1, True), (1, 4, True), (4, 5, False)], names))
    assert model(Tensor(2)).v == want and model(Tensor(2)).v == want
    assert calls == [2, 2, 2, 2]                     # (hidden, mask) positional, use_cache as kwarg


def test_loop_that_changes_the_hidden_state_is_refused():
    model = Decoder(4, meddle=True)
    names, _ = ck.find_blocks(model)
    ck.apply_plan(model, _plan([(0, 2, True), (2, 3, False), (3, 4, False)], names))
    with pytest.raises(RuntimeError, match="max_segment=1"):
        model(Tensor(1))
    ck.apply_plan(model, _plan([(0, 1, True), (1, 2, True), (2, 3, False), (3, 4, False)], names))
    ck.remove(model)
    plain = model(Tensor(1)).v
    ck.apply_plan(model, _plan([(0, 1, True), (1, 2, True), (2, 3, False), (3, 4, False)], names))
    assert model(Tensor(1)).v == plain


def test_plan_for_other_blocks_is_refused():
    model = Sequential(*[Affine(i) for i in range(3)])
    with pytest.raises(ValueError, match="covers 2 blocks, the model has 3"):
        ck.apply_plan(model, _plan([(0, 2, True)], None))
    with pytest.raises(ValueError, match="names differ"):
        ck.apply_plan(model, _plan([(0, 3, True)], ["a", "b", "c"]))
    with pytest.raises(ValueError, match="no chain of blocks"):
        ck.find_blocks(Module())


def test_apply_with_a_chain_plans_and_wraps():
    model = Sequential(*[Affine(i) for i in range(4)])
    want = model(Tensor(1)).v
    chain = Chain(act=[10, 10, 10, 10], inp=[1, 1, 1, 1], time=[1, 1, 1, 1], names=["0", "1", "2", "3"])
    p = ck.apply(model, budget=40, chain=chain, margin=0.0)
    assert p.budget == 40 and p.extra_time == 0 and calls == []
    p = ck.apply(model, budget=25, chain=chain, margin=0.0)
    assert p.peak <= 25 and p.checkpointed and model(Tensor(1)).v == want and calls
    p = ck.apply(model, budget=27, chain=chain)      # 3 % margin: planned for 26 bytes
    assert p.peak <= 26 and p.budget == 27
    assert ck.apply(model, chain=chain, strategy="all").checkpointed == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="needs a budget"):
        ck.apply(model, chain=chain)
    with pytest.raises(ValueError, match="strategy must be"):
        ck.apply(model, budget=30, chain=chain, strategy="best")
    with pytest.raises(ValueError, match="needs sample_input"):
        ck.apply(model, budget=30)
    with pytest.raises(ck.BudgetError, match="least peak"):
        ck.apply(model, budget=5, chain=chain)
