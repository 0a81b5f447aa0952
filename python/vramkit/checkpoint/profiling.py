"""Measuring a chain: one training step with hooks at every block boundary.

Needs PyTorch and a CUDA device. What is measured (all with ``torch.cuda.memory_allocated`` and
``max_memory_allocated``, which count at the moment of the call, no synchronisation needed):

- forward: at each block's start and end, the memory and the peak in between; the bytes it
  keeps are what it added minus its output (the next block's input);
- what each block saves for backward, through ``torch.autograd.graph.saved_tensors_hooks``:
  the unique storages it saved (parameters excluded), and whether its input is one of them;
- backward: a gradient hook on each block's output marks where that block's backward starts,
  so the memory then and the peak of every block's backward are known;
- a forward without autograd recording gives each block's transient peak when it is
  checkpointed (nothing saved);
- a step with every block checkpointed on its own gives each block's backward peak when its
  activations were recomputed (``bwd_remat``) and what the checkpoints hold besides their inputs
  (``ckpt_extra``, from the head's peak);
- forward time of each block from CUDA events (median of the measured steps).

The model's parameters, buffers, optimizer state and RNG state are restored afterwards: the
profile's steps leave no trace (gradients are set to None).
"""
from __future__ import annotations

import statistics
import warnings

from .blocks import BLOCK_PATHS, _tensors, find_blocks, hidden_of  # noqa: F401 (also this module's API)
from .model import Chain

def _nbytes(t) -> int:
    return int(t.untyped_storage().nbytes())


def _ptr(t) -> int:
    return int(t.untyped_storage().data_ptr())


def call_model(model, sample_input):
    if isinstance(sample_input, dict):
        return model(**sample_input)
    if isinstance(sample_input, (tuple, list)):
        return model(*sample_input)
    return model(sample_input)


def default_loss(out):
    """A scalar to backpropagate: ``out.loss`` (Hugging Face with labels), else the mean of the
    output (logits) in float32."""
    import torch
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    t = getattr(out, "logits", None)
    if t is None:
        t = next(iter(_tensors(out)), None)
    if t is None:
        raise ValueError("the model returned no tensor; pass loss_fn=")
    return t.float().mean()


class Step:
    """One training step in phases: zero the gradients, forward + loss, backward, update."""

    def __init__(self, model, sample_input, loss_fn=None, optimizer=None):
        self.model, self.sample_input, self.optimizer = model, sample_input, optimizer
        self.loss_fn = loss_fn or default_loss

    def zero(self):
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.model.zero_grad(set_to_none=True)

    def forward(self):
        return self.loss_fn(call_model(self.model, self.sample_input))

    def update(self):
        if self.optimizer is not None:
            self.optimizer.step()

    def __call__(self):
        self.zero()
        loss = self.forward()
        loss.backward()
        self.update()
        return loss


def _cpu_copy(obj):
    import torch
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu_copy(v) for v in obj)
    return obj


class _Saved:
    """Model, optimizer and RNG state kept on the host while the profile runs steps."""

    def __init__(self, model, optimizer):
        import torch
        self.model, self.optimizer = model, optimizer
        self.state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict(keep_vars=True).items()}
        self.opt = _cpu_copy(optimizer.state_dict()) if optimizer is not None else None
        self.rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all()

    def restore(self):
        import torch
        with torch.no_grad():
            for k, v in self.model.state_dict(keep_vars=True).items():
                v.copy_(self.state[k])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(self.opt)
            self.optimizer.zero_grad(set_to_none=True)
        self.model.zero_grad(set_to_none=True)
        torch.set_rng_state(self.rng)
        torch.cuda.set_rng_state_all(self.cuda_rng)


class _Recorder:
    def __init__(self, mods, params):
        import torch
        self.torch = torch
        self.mods = mods
        self.index = {id(m): i for i, m in enumerate(mods)}
        n = len(mods)
        self.params = params
        self.handles = []
        self.reset(n)

    def reset(self, n):
        self.order = []
        self.cur = None
        self.mem_start, self.mem_end, self.fwd_peak = [0] * n, [0] * n, [0] * n
        self.in_bytes, self.in_ptr, self.out_bytes, self.out_ptr = [0] * n, [0] * n, [0] * n, [0] * n
        self.saved = [dict() for _ in range(n)]
        self.bwd_start, self.bwd_peak = [None] * n, [None] * n
        self.pre_peak = self.head_peak = None
        self.events = []
        self.grad = True

    def _mem(self):
        return self.torch.cuda.memory_allocated()

    def _peak(self):
        return self.torch.cuda.max_memory_allocated()

    def _reset_peak(self):
        self.torch.cuda.reset_peak_memory_stats()

    def pre(self, mod, args, kwargs):
        i = self.index[id(mod)]
        if i in self.order:
            raise ValueError(f"block {i} ran twice in one step: a chain's blocks must each run once")
        if self.order and i != self.order[-1] + 1 or not self.order and i != 0:
            raise ValueError(f"block {i} ran out of order (after {self.order[-1:]}): not a chain")
        self.order.append(i)
        x = hidden_of(args, kwargs)
        if x is None:
            raise ValueError(f"block {i} got no tensor input")
        if i == 0:
            self.pre_peak = self._peak()
            if self.grad and x.requires_grad:
                x.register_hook(self._bwd_hook(-1))
        self.in_bytes[i], self.in_ptr[i] = _nbytes(x), _ptr(x)
        self.mem_start[i] = self._mem()
        self._reset_peak()
        self.cur = i
        ev = (self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True))
        ev[0].record()
        self.events.append(ev)

    def post(self, mod, args, kwargs, out):
        i = self.index[id(mod)]
        self.events[-1][1].record()
        self.fwd_peak[i] = self._peak() - self.mem_start[i]
        self.mem_end[i] = self._mem()
        y = hidden_of((out,) if not isinstance(out, (tuple, list)) else out)
        if y is None:
            raise ValueError(f"block {i} returned no tensor")
        self.out_bytes[i], self.out_ptr[i] = _nbytes(y), _ptr(y)
        if self.grad and y.requires_grad:
            y.register_hook(self._bwd_hook(i))
        self.cur = None
        self._reset_peak()

    def _bwd_hook(self, i):
        def hook(grad):
            # The gradient of block i's output exists: block i's backward starts now, and the phase
            # since the last mark was block i+1's backward (or the head, for the last block).
            n = len(self.mods)
            pk, now = self._peak(), self._mem()
            if i == n - 1:
                self.head_peak = pk
            else:
                self.bwd_peak[i + 1] = pk
            if i >= 0:
                self.bwd_start[i] = now
            self._reset_peak()
        return hook

    def pack(self, t):
        if self.cur is not None:
            try:
                p, nb = _ptr(t), _nbytes(t)
            except (RuntimeError, NotImplementedError):   # a tensor without a plain storage (sparse...)
                p, nb = None, 0
            if p is not None and p not in self.params:
                self.saved[self.cur][p] = nb
        # A detached alias: same storage (so the same memory is kept), but no reference back to
        # the autograd graph (returning t itself would make a cycle for saved outputs).
        return t.detach()

    def install(self):
        for m in self.mods:
            self.handles.append(m.register_forward_pre_hook(self.pre, with_kwargs=True))
            self.handles.append(m.register_forward_hook(self.post, with_kwargs=True))

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []


def _recomputed_backward_peaks(step, mods, rec, n):
    """The peak of each block's backward phase, and of the head, in a step with every block
    checkpointed on its own (one step to warm that path up, one measured)."""
    import torch
    from .segments import _unwrap, _wrap
    for i in range(n):
        _wrap(mods, i, i + 1)
    try:
        rec.reset(n)
        step()
        torch.cuda.synchronize()
        rec.reset(n)
        rec._reset_peak()
        step.zero()
        loss = step.forward()
        loss.backward()
        if rec.bwd_peak[0] is None:
            rec.bwd_peak[0] = rec._peak()
        del loss
        torch.cuda.synchronize()
        if any(v is None for v in rec.bwd_peak) or rec.head_peak is None:
            raise ValueError("with the blocks checkpointed, some block's output got no gradient")
        return list(rec.bwd_peak), rec.head_peak
    finally:
        _unwrap(mods)


def profile(model, sample_input, *, loss_fn=None, optimizer=None, blocks=None, steps: int = 3,
            warmup: int = 1) -> Chain:
    """Measure the chain of ``model`` over training steps on ``sample_input``.

    ``loss_fn(output) -> scalar`` (default: ``output.loss`` or the output's mean); with an
    ``optimizer`` the step includes ``zero_grad(set_to_none=True)`` and ``step()`` (its state then
    counts in the peak), as in training. Returns a :class:`Chain` for :func:`plan`."""
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("vramkit.checkpoint.profile needs a CUDA device")
    if steps < 1 or warmup < 0:
        raise ValueError("steps must be at least 1 and warmup not negative")
    names, mods = find_blocks(model, blocks)
    n = len(mods)
    if any(getattr(m.__dict__.get("forward"), "_vramkit_checkpoint", False) for m in mods):
        raise ValueError("the model has a checkpoint plan applied: call vramkit.checkpoint.remove(model) before "
                         "profiling it")
    params = {_ptr(p) for p in model.parameters()} | {_ptr(b) for b in model.buffers()}
    external = {_ptr(t) for t in _tensors(sample_input)}
    step = Step(model, sample_input, loss_fn, optimizer)
    saved = _Saved(model, optimizer)
    rec = _Recorder(mods, params)
    try:
        for _ in range(warmup):
            step()
        torch.cuda.synchronize()
        rec.install()
        times, step_ms = [], []
        for _ in range(steps):
            rec.reset(n)
            torch.cuda.synchronize()
            t0 = torch.cuda.Event(enable_timing=True)
            t1 = torch.cuda.Event(enable_timing=True)
            rec._reset_peak()
            t0.record()
            step.zero()
            with torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda t: t):
                loss = step.forward()
            if len(rec.order) != n:
                raise ValueError(f"only {len(rec.order)} of the {n} blocks ran in the step")
            loss.backward()
            if rec.bwd_peak[0] is None:          # block 0's input needs no gradient
                rec.bwd_peak[0] = rec._peak()
                rec._reset_peak()
            del loss
            step.update()
            t1.record()
            tail_peak = rec._peak()
            torch.cuda.synchronize()
            times.append([a.elapsed_time(b) / 1e3 for a, b in rec.events])
            step_ms.append(t0.elapsed_time(t1))
        if any(v is None for v in rec.bwd_start) or rec.head_peak is None:
            raise ValueError("the output of some block got no gradient: the blocks must form a chain "
                             "that the loss depends on")
        # The transient peak of each block when nothing is saved (a checkpointed forward).
        rec.grad = False
        first = dict(mem_start=rec.mem_start, fwd_peak=rec.fwd_peak, mem_end=rec.mem_end,
                     in_bytes=rec.in_bytes, out_bytes=rec.out_bytes, in_ptr=rec.in_ptr, out_ptr=rec.out_ptr,
                     saved=rec.saved, bwd_start=rec.bwd_start, bwd_peak=rec.bwd_peak,
                     pre_peak=rec.pre_peak, head_peak=rec.head_peak)
        rec.reset(n)
        rec.grad = False
        with torch.no_grad():
            call_model(model, sample_input)
        fwd_nograd = list(rec.fwd_peak)
        torch.cuda.synchronize()
        try:
            remat_peak, remat_head_peak = _recomputed_backward_peaks(step, mods, rec, n)
        except Exception as e:  # a block that cannot run twice (a cache updated in place, say)
            warnings.warn(f"vramkit.checkpoint.profile: the step with every block checkpointed failed ({e!r:.200}); "
                          "the chain models a recomputed block like a kept one (no bwd_remat, no ckpt_extra)",
                          stacklevel=2)
            remat_peak = remat_head_peak = None
            step.zero()
            torch.cuda.synchronize()
    finally:
        rec.remove()
        saved.restore()
    r = first
    ext = [r["in_ptr"][i] in external or r["in_ptr"][i] in params for i in range(n)]
    inp = [0 if ext[i] else r["in_bytes"][i] for i in range(n)]
    saves_input = [r["in_ptr"][i] in r["saved"][i] for i in range(n)]
    act = []
    for i in range(n):
        new_out = r["out_ptr"][i] != r["in_ptr"][i]
        a = r["mem_end"][i] - r["mem_start"][i] - (r["out_bytes"][i] if new_out else 0)
        act.append(max(0, a + (inp[i] if saves_input[i] else 0)))
    base = r["mem_start"][0] - inp[0]
    cum, bwd, grad_in = 0, [], []
    for i in range(n):
        cum += act[i]
        bwd.append(r["bwd_peak"][i] - base - cum)
        grad_in.append(r["bwd_start"][i] - base - cum)
    # With every block checkpointed on its own, block i's backward runs above base, the inputs the
    # blocks before it keep, its own recomputed activations (its input among them or not), and what
    # the checkpoints hold besides their inputs (tensors the blocks were called with, such as an
    # attention mask the model's forward made: ckpt_extra, from the head's peak with every block
    # checkpointed against without).
    head = r["head_peak"] - base - cum
    ckpt_extra, bwd_remat = 0, None
    if remat_peak is not None:
        ckpt_extra = max(0, (remat_head_peak - base - sum(inp)) - head)
        bwd_remat, kept = [], 0
        for i in range(n):
            own = act[i] + (0 if saves_input[i] else inp[i])
            bwd_remat.append(remat_peak[i] - base - kept - own - ckpt_extra)
            kept += inp[i]
    t = [statistics.median(col) for col in zip(*times)]
    return Chain(act=act, inp=inp, time=t, names=names, saves_input=saves_input, fwd=r["fwd_peak"],
                 fwd_nograd=fwd_nograd, bwd=bwd, grad_in=grad_in, bwd_remat=bwd_remat, base=base, head=head,
                 ckpt_extra=ckpt_extra,
                 fixed_peak=max(r["pre_peak"], tail_peak),
                 meta={"saved_bytes": [sum(s.values()) for s in r["saved"]], "step_time": statistics.median(step_ms)
                       / 1e3, "model": type(model).__name__, "device": torch.cuda.get_device_name(),
                       "torch": torch.__version__})
