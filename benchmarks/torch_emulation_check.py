"""GPU check of vramkit's emulation of PyTorch's caching allocator against the real one.

    python benchmarks/torch_emulation_check.py TRACE_DIR [--json OUT.json]

Every trace in TRACE_DIR (*.trace.csv.gz, *.vktrace, snapshot pickles) plus three traces recorded
here (GPT-2 training, ResNet-50 training, BERT inference with dynamic shapes, random weights) is
replayed through the REAL allocator (torch.cuda.caching_allocator_alloc/delete following the ops,
one fresh process per allocator setting, PYTORCH_ALLOC_CONF set before torch starts) and through
the emulation, and a table compares peak reserved bytes and device allocations. Needs a GPU and
PyTorch; about 3-4 minutes on one H200. ``--emulate-real`` runs the children on the emulation
instead (a plumbing test for machines without a GPU).

The real run also records where its cudaMalloc calls put each segment (its segment_alloc events),
and the emulation is given those addresses: PyTorch breaks best-fit ties between free blocks of
the same stream and size by address, and the driver picks the addresses (it hands freed ranges
out again, so they depend on what the process did before). Fed the real addresses, the emulation
must match; the "plain %" column is the emulation on its own (addresses counting up), which is
what `vramkit advise` answers, and shows how much the addresses moved the peak.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

# (label, PYTORCH_ALLOC_CONF, per-process fraction as a multiple of the default peak or None)
MODES = [
    ("torch-default", "", None),
    ("torch-expandable", "expandable_segments:True", None),
    ("torch:max_split_size_mb=128", "max_split_size_mb:128", None),
    ("torch:roundup_power2_divisions=4", "roundup_power2_divisions:4", None),
    ("torch-expandable:roundup_power2_divisions=4", "expandable_segments:True,roundup_power2_divisions:4", None),
    ("torch:garbage_collection_threshold=0.6", "garbage_collection_threshold:0.6", 1.3),
]

CHILD = r"""
import json, sys, numpy as np, torch
ops_files, frac = json.loads(sys.argv[1]), json.loads(sys.argv[2])
dev = torch.device("cuda", 0)
total = torch.cuda.mem_get_info(0)[1]
out = []
for path, f in zip(ops_files, frac):
    torch.cuda.empty_cache()
    if f is not None:  # only then: setting any fraction turns PyTorch's limit checks on
        torch.cuda.set_per_process_memory_fraction(f, 0)
    torch.cuda.reset_peak_memory_stats(0)
    torch.cuda.reset_accumulated_memory_stats(0)
    d = np.load(path)
    ops, handles = d["ops"], d["streams"].tolist()
    streams = [torch.cuda.default_stream(0) if h == 0 else torch.cuda.Stream(0) for h in handles] or [torch.cuda.default_stream(0)]
    ptr = {}
    alloc, free = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete
    ooms = 0
    # record where cudaMalloc puts the segments (disabling first clears the previous trace's entries)
    torch.cuda.memory._record_memory_history(enabled=None)
    torch.cuda.memory._record_memory_history(max_entries=4_000_000, context=None, stacks="python")
    for act, i, size, s in ops[:, :4].tolist():
        if act == 0:
            if size:
                try:
                    ptr[i] = alloc(size, 0, streams[s])
                except torch.OutOfMemoryError:
                    ooms += 1
        else:
            p = ptr.pop(i, None)
            if p is not None:
                free(p)
    for p in ptr.values():
        free(p)
    st = torch.cuda.memory_stats(0)
    events = torch.cuda.memory._snapshot()["device_traces"][0]
    torch.cuda.memory._record_memory_history(enabled=None)
    addrs = [int(e["addr"]) for e in events if e["action"] == "segment_alloc"]
    if len(addrs) != st.get("num_device_alloc", -1):
        addrs = None  # the history lost entries, or expandable segments (maps, not cudaMalloc): none given
    out.append({"peak_reserved": st["reserved_bytes.all.peak"], "device_allocs": st.get("num_device_alloc", -1),
                "segments_peak": st.get("segment.all.peak", -1), "retries": st.get("num_alloc_retries", -1),
                "ooms": ooms, "total": total, "segment_addrs": addrs})
    torch.cuda.empty_cache()
print("RESULT " + json.dumps(out))
"""

RECORD = r"""
import sys, pickle, torch
kind, path = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
torch.cuda.memory._record_memory_history(max_entries=2_000_000, context=None, stacks="python")
dev = "cuda"
if kind == "gpt2_small_train":
    from transformers import GPT2Config, GPT2LMHeadModel
    m = GPT2LMHeadModel(GPT2Config(n_layer=6)).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    for _ in range(3):
        x = torch.randint(0, 50257, (4, 512), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = m(x, labels=x).loss
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
elif kind == "resnet50_train_b64":
    import timm
    m = timm.create_model("resnet50", pretrained=False).to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        x = torch.randn(64, 3, 224, 224, device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = m(x).float().logsumexp(1).mean()
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
else:  # bert_infer_dynamic
    from transformers import BertConfig, BertModel
    m = BertModel(BertConfig()).to(dev).half().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _ in range(30):
            b = int(torch.randint(1, 33, (1,), generator=g)); n = int(torch.randint(16, 385, (1,), generator=g))
            m(torch.randint(0, 30000, (b, n), device=dev))
torch.cuda.synchronize()
snap = torch.cuda.memory._snapshot()
with open(path, "wb") as f:
    pickle.dump(snap, f)
print("RESULT", torch.cuda.max_memory_reserved(), torch.cuda.memory_stats()["num_device_alloc"])
"""


def run_child(code: str, args: list[str], env: dict[str, str], timeout: int) -> str:
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                       timeout=timeout)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT")), None)
    if p.returncode != 0 or line is None:
        raise RuntimeError(f"child failed ({p.returncode}): {p.stderr.strip()[-600:]}")
    return line[len("RESULT "):]


def load_ops(path: str):
    from vramkit.cli import replay_ops
    from vramkit.trace import load_trace
    t = load_trace(path)
    return t.name, replay_ops(t), list(t.streams)


def emulate(ops, spec: str, capacity: int | None, segment_addresses=None):
    from vramkit.advise import profile
    p = profile(ops, spec, capacity, segment_addresses=segment_addresses)
    return {"peak_reserved": p["peak_reserved_bytes"], "device_allocs": p.get("device_allocs", 0),
            "segments_peak": p.get("segments_peak", 0), "retries": p.get("alloc_retries", 0), "ooms": p["ooms"],
            "given_addresses_used": p.get("given_addresses_used")}


def emulated_child(ops_files, fracs, spec, total):
    out = []
    for path, f in zip(ops_files, fracs):
        ops = np.load(path)["ops"]
        full = spec + ("," if ":" in spec else ":") + f"per_process_memory_fraction={f}" if f else spec
        r = emulate(ops, full, total if f else None)
        r["total"] = total
        out.append(r)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace_dir")
    ap.add_argument("--json", help="also write the rows as JSON here")
    ap.add_argument("--no-record", action="store_true", help="only the traces in TRACE_DIR")
    ap.add_argument("--emulate-real", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    t0 = time.time()
    paths = sorted(p for pat in ("*.trace.csv.gz", "*.vktrace", "*.csv")
                   for p in glob.glob(os.path.join(args.trace_dir, pat)))
    if not paths:
        print(f"no traces in {args.trace_dir}", file=sys.stderr)
        return 1
    tmp = tempfile.mkdtemp(prefix="vk-emul-check-")
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)
    model_runs = {}
    if not args.no_record and not args.emulate_real:
        for kind in ("gpt2_small_train", "resnet50_train_b64", "bert_infer_dynamic"):
            snap = os.path.join(tmp, kind + ".snapshot.pickle")
            try:
                res = run_child(RECORD, [kind, snap], env, 240).split()
                model_runs[kind] = (int(res[0]), int(res[1]))
                paths.append(snap)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                print(f"note: recording {kind} failed: {e}", file=sys.stderr)
    traces = []
    for p in paths:
        name, ops, streams = load_ops(p)
        f = os.path.join(tmp, f"{len(traces)}.npz")
        np.savez(f, ops=ops, streams=np.array(streams or [0], dtype=np.uint64))
        traces.append((name, ops, f))
    rows = []
    total = None
    for label, conf, frac_mult in MODES:
        fracs = []
        for name, ops, _ in traces:
            if frac_mult is None:
                fracs.append(None)
            else:  # a fraction that allows 1.3x the default peak, so that the threshold acts
                fracs.append(frac_mult * emulate(ops, "torch-default", None)["peak_reserved"])
        if args.emulate_real:
            total = total or (141 << 30)
            fr = [None if x is None else x / total for x in fracs]
            real = emulated_child([t[2] for t in traces], fr, label, total)
        else:
            if total is None and frac_mult is not None:
                total = json.loads(run_child(CHILD, [json.dumps([traces[0][2]]), "[null]"], env, 120))[0]["total"]
            fr = [None if x is None else x / total for x in fracs]
            # both names: PYTORCH_ALLOC_CONF is read first by 2.11, the older name by older releases
            cenv = dict(env, PYTORCH_ALLOC_CONF=conf, PYTORCH_CUDA_ALLOC_CONF=conf) if conf else env
            real = json.loads(run_child(CHILD, [json.dumps([t[2] for t in traces]), json.dumps(fr)], cenv, 300))
        for (name, ops, _), f, rr in zip(traces, fr, real):
            spec = label if f is None else label + ",per_process_memory_fraction=" + repr(f)
            cap = rr["total"] if f is not None else None
            addrs = rr.get("segment_addrs") if "expandable" not in label else None
            em = emulate(ops, spec, cap, addrs)
            plain = emulate(ops, spec, cap) if addrs is not None else em
            diff = 100.0 * (em["peak_reserved"] - rr["peak_reserved"]) / max(rr["peak_reserved"], 1)
            pdiff = 100.0 * (plain["peak_reserved"] - rr["peak_reserved"]) / max(rr["peak_reserved"], 1)
            rows.append({"trace": name, "mode": label, "real": rr, "emulated": em, "diff_pct": diff,
                         "plain": plain, "plain_diff_pct": pdiff})
    hdr = f"{'trace':<28} {'mode':<44} {'real peak MiB':>13} {'emul peak MiB':>13} {'diff %':>7} " \
          f"{'dev allocs r/e':>15} {'seg peak r/e':>12} {'retries r/e':>11} {'addrs':>9} {'plain %':>8}"
    print(hdr)
    print("-" * len(hdr))
    worst = worst_plain = 0.0
    for r in rows:
        a, b = r["real"], r["emulated"]
        worst = max(worst, abs(r["diff_pct"]))
        worst_plain = max(worst_plain, abs(r["plain_diff_pct"]))
        # segment addresses used / given: fewer used than given means the emulation took another path
        given = a.get("segment_addrs")
        used = "-" if b["given_addresses_used"] is None else f"{b['given_addresses_used']}/{len(given)}"
        print(f"{r['trace'][:28]:<28} {r['mode'][:44]:<44} {a['peak_reserved'] / 2**20:>13.1f} "
              f"{b['peak_reserved'] / 2**20:>13.1f} {r['diff_pct']:>+7.2f} "
              f"{str(a['device_allocs']) + '/' + str(b['device_allocs']):>15} "
              f"{str(a['segments_peak']) + '/' + str(b['segments_peak']):>12} "
              f"{str(a['retries']) + '/' + str(b['retries']):>11} {used:>9} {r['plain_diff_pct']:>+8.2f}")
    for kind, (peak, ndev) in model_runs.items():
        em = next(r for r in rows if r["trace"].startswith(kind) and r["mode"] == "torch-default")["emulated"]
        print(f"model run {kind}: max_memory_reserved {peak / 2**20:.1f} MiB, {ndev} device allocs; "
              f"emulated from its trace {em['peak_reserved'] / 2**20:.1f} MiB, {em['device_allocs']} "
              f"({100.0 * (em['peak_reserved'] - peak) / max(peak, 1):+.2f} %)")
    print(f"\n{len(rows)} rows ({len(traces)} traces x {len(MODES)} settings); worst peak difference "
          f"{worst:.2f} % given the real segment addresses; {'PASS' if worst <= 1.0 else 'FAIL'} (<= 1 %); "
          f"without them (plain emulation) {worst_plain:.2f} %; {time.time() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "model_runs": model_runs}, f, indent=1)
    return 0 if worst <= 1.0 else 2


if __name__ == "__main__":
    sys.exit(main())
