"""The gradient-checkpoint planner on the host: exact against brute force, monotonic, the
published uniform-chain optima, baselines, budgets and the ``checkpoint-plan`` command."""
from __future__ import annotations

import json
import random

import pytest

import vramkit.checkpoint as ck
from vramkit.checkpoint import BudgetError, Chain
from vramkit.checkpoint.model import evaluate
from vramkit.cli import main as cli_main

MiB = 1 << 20


def random_chain(rng: random.Random, n: int, scale: int = 1) -> Chain:
    """Every field random, including the transients, so each term of the model can bind."""
    act = [rng.randint(1, 20) * scale for _ in range(n)]
    inp = [rng.randint(1, 8) * scale for _ in range(n)]
    ch = Chain(act=act, inp=inp, time=[rng.choice([0.5, 1.0, 1.5, 2.0, 3.25]) * rng.randint(1, 4) for _ in range(n)],
               saves_input=[rng.random() < 0.5 for _ in range(n)],
               fwd=[rng.randint(0, 12) * scale for _ in range(n)],
               fwd_nograd=[rng.randint(0, 8) * scale for _ in range(n)],
               bwd=[rng.randint(0, 15) * scale for _ in range(n)],
               grad_in=[rng.randint(0, 6) * scale for _ in range(n)],
               base=rng.randint(0, 30) * scale, head=rng.randint(0, 25) * scale,
               fixed_peak=rng.randint(0, 40) * scale)
    if rng.random() < 0.5:  # a recomputed block's backward measured apart, above or below the kept one's
        ch.bwd_remat = [max(0, b + rng.randint(-6, 3) * scale) for b in ch.bwd]
    if rng.random() < 0.5:  # what checkpoints hold besides their inputs (an attention mask)
        ch.ckpt_extra = rng.randint(1, 12) * scale
    return ch


def all_outcomes(ch: Chain):
    return [(evaluate(ch, segs)) for segs in ck.all_plans(len(ch))]


def brute_best(outcomes, budget):
    fits = [t for p, t in outcomes if p <= budget]
    return min(fits) if fits else None


def test_plan_count_is_every_segmentation():
    # Plain blocks and checkpointed segments of any length: F(2n+1) plans (odd Fibonacci numbers).
    assert [sum(1 for _ in ck.all_plans(n)) for n in range(1, 7)] == [2, 5, 13, 34, 89, 233]
    assert sum(1 for _ in ck.all_plans(12)) == 75025


@pytest.mark.parametrize("seed", range(40))
def test_dp_equals_brute_force_small(seed):
    rng = random.Random(seed)
    ch = random_chain(rng, rng.randint(1, 8))
    outs = all_outcomes(ch)
    least = min(p for p, _ in outs)
    assert ck.minimum_budget(ch, resolution=1) == least
    for budget in sorted({p for p, _ in outs} | {least - 1, least + 3}):
        want = brute_best(outs, budget)
        if want is None:
            with pytest.raises(BudgetError, match=f"least peak any plan reaches is .*{least} bytes"):
                ck.plan(ch, budget, resolution=1)
            continue
        got = ck.plan(ch, budget, resolution=1)
        assert got.extra_time == pytest.approx(want, abs=1e-9), (budget, got.segments)
        assert got.peak <= budget
        assert evaluate(ch, got.segments) == (got.peak, pytest.approx(got.extra_time))


@pytest.mark.parametrize("seed,n", [(100, 10), (101, 11), (102, 12)])
def test_dp_equals_brute_force_up_to_12_blocks(seed, n):
    rng = random.Random(seed)
    ch = random_chain(rng, n)
    outs = all_outcomes(ch)
    peaks = sorted({p for p, _ in outs})
    for budget in peaks[:: max(1, len(peaks) // 12)] + [peaks[-1]]:
        got = ck.plan(ch, budget, resolution=1)
        assert got.extra_time == pytest.approx(brute_best(outs, budget), abs=1e-9)
        assert got.peak <= budget


def test_brute_force_helper_agrees():
    ch = random_chain(random.Random(7), 6)
    for budget in range(ck.minimum_budget(ch), ck.no_checkpoint(ch).peak + 1, 3):
        assert ck.brute_force(ch, budget).extra_time == pytest.approx(ck.plan(ch, budget).extra_time)


@pytest.mark.parametrize("seed", range(12))
def test_larger_budget_never_slower(seed):
    rng = random.Random(1000 + seed)
    # Real-sized chains (MiB-scale, odd byte counts) also exercise the rounded model.
    scale = rng.choice([1, MiB + 512 * rng.randint(1, 99), 4099])
    ch = random_chain(rng, rng.randint(4, 30), scale)
    lo, hi = ck.minimum_budget(ch), ck.no_checkpoint(ch).peak
    budgets = sorted({lo + (hi - lo) * k // 40 for k in range(41)} | {hi + scale})
    prev = None
    for b, p in ck.sweep(ch, budgets):
        assert p is not None, f"budget {b} >= the least budget {lo} must fit"
        assert p.peak <= b
        if prev is not None:
            assert p.extra_time <= prev + 1e-9, f"budget {b} gave a slower plan than a smaller budget"
        prev = p.extra_time
    assert ck.sweep(ch, [lo - 1])[0][1] is None
    assert ck.plan(ch, hi).extra_time == 0


def test_rounded_model_still_fits_and_is_near_exact():
    # 1.5 million odd byte sizes: the planner rounds K up; the plan must still fit and be
    # no slower than the exact optimum one step of budget further down.
    rng = random.Random(5)
    ch = random_chain(rng, 9, 1_000_003)
    outs = all_outcomes(ch)
    for budget in sorted({p for p, _ in outs})[::7]:
        got = ck.plan(ch, budget)
        assert got.peak <= budget
        # Rounding K up costs at most 9 blocks x 1/65536 of the total: the exact optimum 0.1 %
        # below the budget is never faster.
        tighter = brute_best(outs, int(budget * 0.999))
        if tighter is not None:
            assert got.extra_time <= tighter + 1e-9


def test_allocator_sized_chains_are_planned_exactly():
    # Sizes in multiples of 512 bytes (what the caching allocator counts): the default
    # resolution is their common divisor, so the default planner is the exact optimum.
    rng = random.Random(77)
    for _ in range(4):
        ch = random_chain(rng, 7)
        for f in ("act", "inp", "fwd", "fwd_nograd", "bwd", "grad_in"):
            setattr(ch, f, [512 * rng.randint(1, 20000) for _ in range(7)])
        ch.base, ch.head = 512 * rng.randint(0, 30000), 512 * rng.randint(0, 30000)
        assert ck.planner._resolution(ch, None) == 512
        outs = all_outcomes(ch)
        for budget in sorted({p for p, _ in outs})[::3]:
            assert ck.plan(ch, budget).extra_time == pytest.approx(brute_best(outs, budget), abs=1e-9)


def _uniform(n):
    return Chain(act=[1] * n, inp=[1] * n, time=[1] * n)


@pytest.mark.parametrize("n,expect", [
    (9, {4: None, 5: 6, 6: 4, 7: 3, 8: 2, 9: 0}),
    (16, {5: None, 6: 14, 7: 11, 8: 10, 9: 8, 10: 7, 11: 6, 12: 5, 13: 4, 14: 3, 15: 2, 16: 0}),
    (25, {7: None, 8: 21, 9: 19, 10: 17, 11: 16, 12: 15, 13: 14, 14: 12, 15: 11, 16: 10, 17: 9, 18: 8, 19: 7,
          20: 6, 21: 5, 22: 4, 23: 3, 24: 2, 25: 0}),
])
def test_uniform_chain_reference_optima(n, expect):
    ch = _uniform(n)
    for budget, cost in expect.items():
        if cost is None:
            with pytest.raises(BudgetError):
                ck.plan(ch, budget)
        else:
            assert ck.plan(ch, budget).extra_time == cost


def test_heterogeneous_reference_optima():
    ch = Chain(act=[8, 2, 2, 8, 4, 2], inp=[2] * 6, time=[4, 1, 1, 6, 2, 1])
    with pytest.raises(BudgetError, match="least peak any plan reaches is 14 B"):
        ck.plan(ch, 12)
    p = ck.plan(ch, 14)
    assert p.extra_time == 11 and p.checkpoint_segments == [(0, 2), (3, 4)]
    assert ck.plan(ch, 16).extra_time == 6 and ck.plan(ch, 16).checkpoint_segments == [(0, 3)]
    assert ck.plan(ch, 18).extra_time == 5
    assert ck.plan(ch, 20).extra_time == 4 and ck.plan(ch, 22).checkpoint_segments == [(0, 1)]
    assert ck.plan(ch, 26).extra_time == 0


def test_optimal_no_slower_than_baselines_at_their_memory():
    for seed in range(20):
        rng = random.Random(300 + seed)
        ch = random_chain(rng, rng.randint(2, 20), 4096)
        for base in ck.baselines(ch):
            p = ck.plan(ch, base.peak)
            assert p.extra_time <= base.extra_time + 1e-9 and p.peak <= base.peak
    # n = 16 uniform, budget 8: 10 forward steps against 16 for four checkpointed segments of 4.
    assert ck.plan(_uniform(16), 8).extra_time == 10


def test_baselines_layout():
    ch = _uniform(16)
    chen = ck.chen_sqrt(ch)
    assert chen.checkpoint_segments == [(0, 4), (4, 8), (8, 12)] and chen.checkpointed == list(range(12))
    assert ck.checkpoint_all(ch).checkpoint_segments == [(i, i + 1) for i in range(16)]
    assert ck.no_checkpoint(ch).extra_time == 0 and ck.no_checkpoint(ch).peak == 16
    assert ck.chen_sqrt(_uniform(1)).checkpointed == []


def test_max_segment_limits_segments():
    ch = Chain(act=[8, 2, 2, 8, 4, 2], inp=[2] * 6, time=[4, 1, 1, 6, 2, 1])
    p = ck.plan(ch, 16, max_segment=1)
    assert all(e - s == 1 for s, e in p.checkpoint_segments) and p.peak <= 16
    assert ck.minimum_budget(ch, max_segment=1) >= ck.minimum_budget(ch)
    with pytest.raises(ValueError, match="max_segment"):
        ck.plan(ch, 16, max_segment=0)


@pytest.mark.parametrize("budget,bytes_", [("12GiB", 12 << 30), ("1.5 GB", 1_500_000_000), (1000, 1000),
                                           ("800MB", 800_000_000), (2.0 ** 30, 1 << 30), (" 64 MiB ", 64 << 20)])
def test_budget_sizes(budget, bytes_):
    assert ck.parse_budget(budget) == bytes_


@pytest.mark.parametrize("budget,msg", [
    (-1, "must not be negative"), ("-2GiB", "must not be negative"), ("12 apples", "is not a size"),
    ("", "is not a size"), ("GiB", "is not a size"), (1.5, "not a whole number"), (True, "must be a size"),
    ([1], "must be a size"), (None, "must be a size"), (float("nan"), "not a whole number"),
])
def test_bad_budgets(budget, msg):
    ch = _uniform(4)
    with pytest.raises(BudgetError, match=msg):
        ck.plan(ch, budget)


def test_too_small_budget_names_the_least():
    ch = Chain(act=[100 * MiB] * 4, inp=[10 * MiB] * 4, time=[0.01] * 4, base=1 << 30)
    least = ck.minimum_budget(ch)
    with pytest.raises(BudgetError) as e:
        ck.plan(ch, least - 1)
    assert f"({least} bytes)" in str(e.value) and "no plan fits" in str(e.value)
    assert ck.plan(ch, least).peak == least


def _rounded_chain() -> Chain:
    """Near-uniform blocks of allocator sizes whose default resolution (5 x 512 bytes) rounds K up
    enough that checkpoint-all's exact peak is 4 KiB below the least peak the planner reaches (as a
    ViT-B/16 profile did on an H200, by 352 KiB)."""
    u = 512
    return Chain(act=[u * v for v in (53807, 53807, 53807, 53806, 53807, 53807)],
                 inp=[u * v for v in (8139, 8138, 8137, 8138, 8139, 8137)], time=[1.0] * 6,
                 fwd=[u * v for v in (53805, 53807, 53805, 53804, 53804, 53807)],
                 fwd_nograd=[u * v for v in (16276, 16275, 16277, 16274, 16277, 16275)],
                 bwd=[u * v for v in (53806, 161412, 161415, 161413, 161415, 53806)],
                 grad_in=[u * v for v in (8138, 8140, 8137, 8140, 8139, 8138)], base=1 << 30, head=82642944)


def test_exact_resolution_reaches_a_baseline_the_rounding_misses():
    ch = _rounded_chain()
    allp = ck.checkpoint_all(ch)
    assert ck.planner._resolution(ch, None) > ck.planner.exact_resolution(ch) == 512
    with pytest.raises(BudgetError, match="least peak any plan reaches"):
        ck.plan(ch, allp.peak)
    p = ck.plan(ch, allp.peak, resolution=ck.planner.exact_resolution(ch))
    assert p.peak <= allp.peak and p.extra_time <= allp.extra_time


def test_benchmark_plans_never_raise():
    # What the GPU test and the benchmark measure (harness.plans_for, no torch needed): every
    # baseline, the sweep and optimal=<baseline> come out as plans even where the rounded model
    # misses the baseline's peak; a budget below the least is a NoFit row, not an exception.
    from vramkit.checkpoint import harness
    ch = _rounded_chain()
    least = ck.minimum_budget(ch)
    entries = harness.plans_for(ch, budgets=[least // 2, "2GiB"])
    by = {e.name: e for e in entries}
    assert [e.name for e in entries][:3] == ["none", "sqrt(n)", "all"] and len(entries) == 3 + 4 + 2 + 2
    miss = [e for e in entries if isinstance(e, harness.NoFit)]
    assert len(miss) == 1 and miss[0].budget == least // 2 and miss[0].least == least
    assert "least peak any plan reaches" in miss[0].error and miss[0].row()["fits"] is False
    sweep = [e for e in entries if isinstance(e, ck.Plan) and e.budget is not None]
    assert len(sweep) == 5
    for p in sweep:
        assert p.peak <= 0.97 * p.budget
    for base in ("sqrt(n)", "all"):
        o, b = by[f"optimal={base}"], by[base]
        assert isinstance(o, ck.Plan) and o.budget is None
        assert o.peak <= b.peak and o.extra_time <= b.extra_time


def test_chain_validation_and_json_roundtrip(tmp_path):
    with pytest.raises(ValueError, match="at least one block"):
        Chain(act=[], inp=[], time=[])
    with pytest.raises(ValueError, match="'inp' has 1 entries for 2 blocks"):
        Chain(act=[1, 2], inp=[1], time=[1, 1])
    with pytest.raises(ValueError, match="negative"):
        Chain(act=[-1], inp=[1], time=[1])
    with pytest.raises(ValueError, match="times"):
        Chain(act=[1], inp=[1], time=[float("inf")])
    ch = random_chain(random.Random(3), 5, 512)
    ch.meta = {"step_time": 0.1}
    path = tmp_path / "c.json"
    ch.save(str(path))
    back = Chain.load(str(path))
    assert back == ch
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a chain JSON"):
        Chain.load(str(bad))


def test_recomputed_backward_peak_is_used_for_checkpointed_blocks():
    # ViT-B/16 as profiled on an H200 (MiB): a recomputed block's backward peaks 70 MiB below the
    # kept one's. Without bwd_remat the model says checkpointing the last block saves nothing;
    # with it, checkpoint-all is the least-memory plan and the planner reaches it.
    n = 12
    kw = dict(act=[592 * MiB] * n, inp=[37 * MiB] * n, time=[1.1e-3] * n, saves_input=[True] * n,
              fwd=[629 * MiB] * n, fwd_nograd=[370 * MiB] * n, bwd=[(570 - 27 * i) * MiB for i in range(n)],
              grad_in=[(339 - 27 * i) * MiB for i in range(n)], base=1093 * MiB, head=114 * MiB,
              fixed_peak=1756 * MiB)
    old = Chain(**kw)
    new = Chain(**kw, bwd_remat=[b - 70 * MiB for b in kw["bwd"]])
    eleven = [(i, i + 1, True) for i in range(11)] + [(11, 12, False)]
    assert evaluate(old, eleven) == evaluate(new, eleven)          # the plain last block: unchanged
    assert ck.checkpoint_all(old).peak == evaluate(old, eleven)[0]
    assert ck.checkpoint_all(new).peak == ck.checkpoint_all(old).peak - 70 * MiB
    least = ck.minimum_budget(new, resolution=1)
    assert least <= ck.checkpoint_all(new).peak < evaluate(new, eleven)[0]
    p = ck.plan(new, ck.checkpoint_all(new).peak)
    assert p.checkpointed == list(range(n)) and p.extra_time <= ck.checkpoint_all(new).extra_time + 1e-12
    # The plain blocks of a plan keep using bwd: the un-checkpointed plan is unchanged.
    assert ck.no_checkpoint(new).peak == ck.no_checkpoint(old).peak
    with pytest.raises(ValueError, match="'bwd_remat' has 11 entries for 12 blocks"):
        Chain(**kw, bwd_remat=kw["bwd"][:11])


def test_what_checkpoints_hold_counts_from_the_first_checkpointed_segment():
    # GPT-2 as profiled on an H200: the head (logits, loss) is the peak; a plan with any checkpointed
    # block measured 30-36 MiB above the model without ckpt_extra (the attention mask the blocks are
    # called with lives on in the checkpoint until its backward).
    n = 4
    kw = dict(act=[100 * MiB] * n, inp=[24 * MiB] * n, time=[1e-3] * n, saves_input=[True] * n,
              fwd=[110 * MiB] * n, fwd_nograd=[60 * MiB] * n, bwd=[50 * MiB] * n, grad_in=[30 * MiB] * n,
              base=1000 * MiB, head=900 * MiB, fixed_peak=1200 * MiB)
    old, new = Chain(**kw), Chain(**kw, ckpt_extra=32 * MiB)
    plain = [(i, i + 1, False) for i in range(n)]
    assert evaluate(new, plain) == evaluate(old, plain)              # nothing checkpointed: nothing held
    last = plain[:3] + [(3, 4, True)]
    assert evaluate(new, last)[0] == evaluate(old, last)[0] + 32 * MiB     # the head holds it
    # Held through the backward of the first checkpointed segment and every later one, not before:
    # the backward of a plain block before it, when it is the peak, does not change.
    big = Chain(**{**kw, "bwd": [2000 * MiB, 50 * MiB, 50 * MiB, 50 * MiB]}, ckpt_extra=32 * MiB)
    first_plain = [(0, 1, False), (1, 4, True)]
    assert evaluate(big, first_plain, detail=True)[2] == "block 0"
    assert evaluate(big, first_plain)[0] == evaluate(Chain(**{**kw, "bwd": big.bwd}), first_plain)[0]
    big0 = Chain(**{**kw, "bwd": [50 * MiB] * 3 + [2000 * MiB]}, ckpt_extra=32 * MiB)
    ck_first = [(0, 1, True)] + [(i, i + 1, False) for i in range(1, n)]
    assert evaluate(big0, ck_first, detail=True)[2] == "block 3"
    assert evaluate(big0, ck_first)[0] == evaluate(Chain(**{**kw, "bwd": big0.bwd}), ck_first)[0] + 32 * MiB
    # The planner meets budgets with it: a plan whose peak is within 32 MiB of the budget without
    # it is not taken.
    for b in range(evaluate(new, last)[0] - 40 * MiB, evaluate(new, last)[0] + 1, 4 * MiB):
        try:
            p = ck.plan(new, b, resolution=1)
        except BudgetError:
            continue
        assert evaluate(new, p.segments)[0] == p.peak <= b
    with pytest.raises(ValueError, match="ckpt_extra"):
        Chain(**kw, ckpt_extra=-1)


def test_chain_json_without_bwd_remat_still_loads(tmp_path):
    ch = random_chain(random.Random(11), 4, 512)
    ch.bwd_remat, ch.ckpt_extra = None, 0
    d = ch.to_dict()
    del d["bwd_remat"], d["ckpt_extra"]      # a chain saved before the fields existed
    path = tmp_path / "old.json"
    path.write_text(json.dumps(d))
    back = Chain.load(str(path))
    assert back.bwd_remat is None and back == ch


def test_evaluate_rejects_bad_segments():
    ch = _uniform(4)
    with pytest.raises(ValueError, match="cover"):
        evaluate(ch, [(0, 2, True), (3, 4, False)])
    with pytest.raises(ValueError, match="end at block 2"):
        evaluate(ch, [(0, 2, True)])
    with pytest.raises(ValueError, match="plain segment is one block"):
        evaluate(ch, [(0, 4, False)])


@pytest.mark.parametrize("fields, msg", [
    ({"act": [float("inf"), 1]}, "'act' holds inf, not a whole number"),
    ({"act": [2 ** 70, 1]}, "'act' holds 1180591620717411303424 bytes, beyond 2\\^62"),
    ({"head": -2 ** 70}, "'head' holds -1180591620717411303424 bytes, beyond 2\\^62 in magnitude"),
    ({"ckpt_extra": False}, "'ckpt_extra' holds False"),
    ({"time": [0.1, -1]}, "'time' holds -1: block times must be finite"),
    ({"act": [1.5, 1]}, "not a whole number of bytes"),
    ({"act": "ab"}, "'act' must be a list, not str"),
    ({"inp": [1, "x"]}, "'inp' holds 'x', not a number of bytes"),
    ({"base": -1e20}, "'base' holds a negative size"),
    ({"fwd": [True, 1]}, "'fwd' holds True"),
    ({"time": ["a", 1]}, "'time' holds 'a', not a number of seconds"),
    ({"meta": "x"}, "'meta' must be an object, not str"),
    ({"meta": {"step_time": "x"}}, "'meta.step_time' must be a number of seconds"),
])
def test_chain_fields_of_the_wrong_kind_are_named(tmp_path, capsys, fields, msg):
    """Every field of a chain file that is not what it should be gets a ValueError naming it, from
    the Python API and from checkpoint-plan (one line, exit 1, no traceback)."""
    d = dict({"act": [100, 200], "inp": [10, 20], "time": [0.1, 0.2]}, **fields)
    with pytest.raises(ValueError, match=msg):
        Chain.from_dict(d)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(d, allow_nan=True).replace("Infinity", "1e400"))
    assert cli_main(["checkpoint-plan", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and str(path) in err, err


def test_chain_files_nested_too_deeply_or_not_text(tmp_path, capsys):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(ValueError, match="nested too deeply"):
        Chain.load(str(deep))
    raw = tmp_path / "raw.json"
    raw.write_bytes(b'{"act": [1], "inp": [1], "time": [1], "names": ["\xff"]}')
    with pytest.raises(ValueError, match="not UTF-8"):
        Chain.load(str(raw))
    assert cli_main(["checkpoint-plan", str(deep)]) == 1
    assert capsys.readouterr().err.count(str(deep)) == 1  # the path once, not twice


def test_chain_save_leaves_nothing_half_written(tmp_path, monkeypatch):
    ch = Chain(act=[1, 2], inp=[1, 1], time=[0.1, 0.1])
    path = tmp_path / "c.json"
    path.write_text("before")

    import vramkit._atomic as atomic

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(atomic.os, "replace", broken_replace)
    with pytest.raises(OSError):
        ch.save(str(path))
    assert path.read_text() == "before" and [p.name for p in tmp_path.iterdir()] == ["c.json"]


def test_cli_checkpoint_plan(tmp_path, capsys):
    ch = Chain(act=[8 * MiB, 2 * MiB, 2 * MiB, 8 * MiB, 4 * MiB, 2 * MiB], inp=[2 * MiB] * 6,
               time=[4e-3, 1e-3, 1e-3, 6e-3, 2e-3, 1e-3], meta={"step_time": 0.05, "model": "demo"})
    path = str(tmp_path / "demo.json")
    ch.save(path)
    assert cli_main(["checkpoint-plan", path]) == 0
    out = capsys.readouterr().out
    assert "least feasible peak 14.00 MiB" in out and "sqrt(n)" in out and "11.00 ms" in out and "[0-1] [3]" in out
    assert cli_main(["checkpoint-plan", path, "--budget", "20MiB", "--budget", "1MiB", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["plans"][0]["extra_time"] == pytest.approx(4e-3) and d["plans"][0]["checkpointed"] == [0]
    assert "least peak any plan reaches is 14.00 MiB" in d["plans"][1]["error"]
    assert cli_main(["checkpoint-plan", path, "--budget", "12 apples"]) == 1
    assert "is not a size" in capsys.readouterr().err
    assert cli_main(["checkpoint-plan", str(tmp_path / "none.json")]) == 1
    assert "no such chain file" in capsys.readouterr().err
    assert cli_main(["checkpoint-plan", path, "--sweep", "0"]) == 1


def test_apply_without_torch_fails_clearly():
    try:
        import torch  # noqa: F401
        pytest.skip("torch is installed: the GPU tests cover apply")
    except ImportError:
        pass
    with pytest.raises(ImportError):
        ck.apply(object(), budget="1GiB", sample_input=1)
    with pytest.raises(BudgetError):
        ck.apply(object(), budget="-1GiB", sample_input=1)
