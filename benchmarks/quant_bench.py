"""Bandwidth, accuracy and memory of vramkit's block-wise quantization on one GPU.

    python3 benchmarks/quant_bench.py [--out quant_bench.json] [--sizes 256,1024] [--iters 20] [--no-model]

1. Copy bandwidth: a device-to-device copy through PyTorch (bytes read + bytes written / time),
   measured at each size; it is the 100 % of the "% copy" column.
2. Each kernel (encode and decode of int8, int8_dynamic, fp8_e4m3, fp8_e5m2, nf4, fp4; fp32 and bf16
   data; default blocks: 256 for 8-bit formats, 64 for 4-bit) on 256 MiB and 1 GiB of input, called
   through the C interface on preallocated buffers; GB/s counts the bytes it must move (values, codes
   and absmax). Then vramkit.quant.quantize/dequantize through Python for two formats (allocation from
   vramkit's pool and the launch included), and a block-size sweep for int8 and nf4.
3. Anchors in the same run: PyTorch's x.to(torch.float8_e4m3fn) cast, and the block-wise int8 and
   fp8 recipes written in eager PyTorch (absmax per block, scale, round, cast); bitsandbytes and
   torchao when they are installed (they are reported as absent otherwise).
4. Errors on randn(1024, 1024): mean absolute, mean relative and max/absmax per format, from the GPU
   codes, and whether they equal the NumPy reference bit for bit.
5. Weight-only quantization of GPT-2 (transformers GPT2Config(), 124M parameters, bf16): a pretrained
   checkpoint when one is in the local Hugging Face cache, else random weights from a fixed seed (said
   so in the output); linear weight memory before/after, and the loss, KL divergence and top-1
   agreement of the next-token distributions on fixed data.

Timing: CUDA events around each call after warm-up calls; the median of --iters. Prints a table and
writes every figure to --out as JSON. About a minute on an H200.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

MiB = 1 << 20


def timed_ms(torch, fn, iters: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def copy_bandwidth(torch, nbytes: int, iters: int) -> float:
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = timed_ms(torch, lambda: dst.copy_(src), iters)
    return 2 * nbytes / ms / 1e6


def launch_tag(tile, grid, table, cap):
    """A launch shape's suffix to a row's kind: @TILE/GRID/TABLE, and /CAP blocks when capped."""
    return f"@{tile}/{grid}/{table}" + (f"/{cap}" if cap not in ("", "0") else "")


def kernel_rows(torch, lib, check, sizes_mib, iters, rows, tag="", sweep=True):
    from vramkit.quant._formats import DEFAULT_BLOCK, DTYPES, FORMATS, FOUR_BIT
    stream = torch.cuda.current_stream().cuda_stream
    dev = torch.cuda.current_device()
    tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}

    def one(size_mib, dname, fmt, block, tag=""):
        isz = 4 if dname == "float32" else 2
        n = size_mib * MiB // isz
        x = torch.randn(n, dtype=tdt[dname], device="cuda")
        codes = torch.empty(n // 2 if fmt in FOUR_BIT else n, dtype=torch.uint8, device="cuda")
        nb = -(-n // block)
        absmax = torch.empty(nb, dtype=torch.float32, device="cuda")
        out = torch.empty_like(x)
        f, d = FORMATS[fmt], DTYPES[dname]
        enc = lambda: check(lib.vk_quant_encode(f, d, x.data_ptr(), n, block, codes.data_ptr(), absmax.data_ptr(), dev, stream))  # noqa: E731
        dec = lambda: check(lib.vk_quant_decode(f, d, codes.data_ptr(), absmax.data_ptr(), None, None, n, block,  # noqa: E731
                                                out.data_ptr(), dev, stream))
        moved = n * isz + codes.numel() + 4 * nb
        for what, fn in (("encode", enc), ("decode", dec)):
            ms = timed_ms(torch, fn, iters)
            rows.append({"kind": "kernel" + tag, "op": what, "format": fmt, "dtype": dname, "block": block,
                         "size_mib": size_mib, "ms": ms, "gbps": moved / ms / 1e6})

    for size in sizes_mib:
        for dname in ("float32", "bfloat16"):
            for fmt in FORMATS:
                one(size, dname, fmt, DEFAULT_BLOCK[fmt], tag)
    if not sweep:
        return
    for fmt in ("int8", "nf4"):  # block sweep, 1 GiB of fp32
        for block in (32, 128, 1024, 4096):
            one(max(sizes_mib), "float32", fmt, block, tag="-blocks")


def vector_bytes(r):
    """(bytes read, bytes written) per 16-byte vector of values, as the kernel of row r moves them."""
    v = 4 if r["dtype"] == "float32" else 8
    code = v // 2 if r["format"] in ("nf4", "fp4") else v
    return (16, code) if r["op"] == "encode" else (code, 16)


def ceiling_rows(torch, lib, check, rows, iters):
    """What the same reads and writes reach with no arithmetic (vk_quant_probe_traffic), per shape
    and size; each kernel row gets its ceiling and the share of it that it reaches."""
    stream = torch.cuda.current_stream().cuda_stream
    dev = torch.cuda.current_device()
    out = {}
    for r in rows:
        if not r["kind"].startswith("kernel"):
            continue
        rb, wb = vector_bytes(r)
        key = (rb, wb, r["size_mib"])
        if key not in out:
            vectors = r["size_mib"] * MiB // 16
            src = torch.randint(0, 255, (vectors * rb,), dtype=torch.uint8, device="cuda")
            dst = torch.empty(vectors * wb, dtype=torch.uint8, device="cuda")
            ms = timed_ms(torch, lambda: check(lib.vk_quant_probe_traffic(src.data_ptr(), rb, dst.data_ptr(), wb, vectors,
                                                                          dev, stream)), iters)
            out[key] = vectors * (rb + wb) / ms / 1e6
            del src, dst
        r["ceiling_gbps"] = out[key]
    return {f"{rb}->{wb} @ {size} MiB": g for (rb, wb, size), g in out.items()}


def api_rows(torch, iters, size_mib, rows):
    import vramkit.quant as vq
    n = size_mib * MiB // 2
    x = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    for fmt in ("int8", "nf4"):
        q = vq.quantize(x, fmt)
        moved = n * 2 + (n // 2 if fmt == "nf4" else n) + 4 * q.nblocks
        for what, fn in (("quantize()", lambda: vq.quantize(x, fmt)), ("dequantize()", lambda: q.dequantize())):
            ms = timed_ms(torch, fn, iters)
            rows.append({"kind": "python api", "op": what, "format": fmt, "dtype": "bfloat16", "block": q.block,
                         "size_mib": size_mib, "ms": ms, "gbps": moved / ms / 1e6})


def anchor_rows(torch, iters, size_mib, rows, notes):
    n = size_mib * MiB // 4
    x = torch.randn(n, dtype=torch.float32, device="cuda")

    def add(name, fn, moved, block=None, fmt=""):
        ms = timed_ms(torch, fn, iters)
        rows.append({"kind": "anchor", "op": name, "format": fmt, "dtype": "float32", "block": block,
                     "size_mib": size_mib, "ms": ms, "gbps": moved / ms / 1e6})

    add("torch x.to(float8_e4m3fn)", lambda: x.to(torch.float8_e4m3fn), n * 5, fmt="fp8_e4m3")

    def eager_int8(b=256):
        xb = x.view(-1, b)
        a = xb.abs().amax(dim=1, keepdim=True)
        return (xb * (127.0 / a)).round().to(torch.int8), a

    def eager_fp8(b=256):
        xb = x.view(-1, b)
        a = xb.abs().amax(dim=1, keepdim=True)
        return (xb * (448.0 / a)).to(torch.float8_e4m3fn), a

    add("torch eager block int8", eager_int8, n * 5 + n // 64, 256, "int8")
    add("torch eager block fp8", eager_fp8, n * 5 + n // 64, 256, "fp8_e4m3")
    try:
        import bitsandbytes.functional as bnbf
        add("bitsandbytes quantize_blockwise", lambda: bnbf.quantize_blockwise(x, blocksize=256), n * 5 + n // 64, 256,
            "int8_dynamic")
        add("bitsandbytes quantize_4bit nf4", lambda: bnbf.quantize_4bit(x, blocksize=64, quant_type="nf4"),
            n * 4 + n // 2 + n // 16, 64, "nf4")
    except Exception as e:  # noqa: BLE001 - absent or broken: say so
        notes.append(f"bitsandbytes: not measured ({type(e).__name__}: {e})")
    try:
        import torchao  # noqa: F401
        notes.append("torchao: installed, but its block-wise FP8 cast kernels are a prototype API; not measured")
    except Exception as e:  # noqa: BLE001
        notes.append(f"torchao: not measured ({type(e).__name__}: {e})")


def error_rows(torch):
    import vramkit.quant as vq
    from vramkit.quant import _reference as R
    g = torch.Generator(device="cpu").manual_seed(0)
    xh = torch.randn(1024, 1024, generator=g)
    x = xh.cuda()
    out = []
    for fmt in vq.FORMATS:
        for block in (64, 256):
            q = vq.quantize(x, fmt, block=block)
            y = q.dequantize().cpu().double()
            err = (y - xh.double()).abs()
            absmax = torch.from_dlpack(q.absmax).view(torch.float32).cpu().double()
            codes, am = R.encode(xh.numpy().reshape(-1), fmt, block)
            same = bool(np.array_equal(torch.from_dlpack(q.codes).cpu().numpy(), codes) and
                        np.array_equal(absmax.float().numpy(), am))
            out.append({"format": fmt, "block": block, "mean_abs": float(err.mean()),
                        "mean_rel": float((err / (xh.double().abs() + 1e-8)).mean()),
                        "max_over_absmax": float((err.view(-1, block).amax(1) / absmax).max()),
                        "equals_reference": same, "bits_per_value": 8 * q.nbytes / xh.numel()})
    return out


def model_rows(torch, notes):
    from transformers import GPT2Config, GPT2LMHeadModel

    import vramkit
    from vramkit.quant.torch import quantize_linear_weights
    source, tok = "random", None
    try:
        from transformers import AutoTokenizer
        GPT2LMHeadModel.from_pretrained("gpt2", local_files_only=True)
        tok = AutoTokenizer.from_pretrained("gpt2", local_files_only=True)
        source = "pretrained gpt2 (local cache)"
    except Exception:  # noqa: BLE001 - no network, usually no cache
        notes.append("GPT-2: no pretrained checkpoint in the local cache: random weights (seed 0), random tokens "
                     "(seed 1); the loss change shows what quantization does to these weights, not to a trained model")

    def build():
        torch.manual_seed(0)
        m = GPT2LMHeadModel.from_pretrained("gpt2", local_files_only=True) if tok else GPT2LMHeadModel(GPT2Config())
        return m.to("cuda", torch.bfloat16).eval()

    if tok:
        text = ("Memory on a graphics card is the scarce resource of deep learning. Weights, activations and "
                "optimizer state compete for it, and storing numbers in fewer bits is one way to fit more. ") * 40
        ids = tok(text, return_tensors="pt").input_ids[:, :1024].cuda()
    else:
        ids = torch.randint(0, 50257, (8, 512), generator=torch.Generator().manual_seed(1)).cuda()
    out = {"source": source, "tokens": int(ids.numel())}
    with torch.no_grad():
        base = build()
        ref = base(ids, labels=ids)
        out["loss_bf16"] = float(ref.loss)
        ref_logp = torch.log_softmax(ref.logits.float(), -1)
        del base, ref
        for fmt, block in (("int8", 256), ("nf4", 64)):
            model = build()
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated() + vramkit.memory_allocated()
            rep = quantize_linear_weights(model, fmt, block)
            torch.cuda.synchronize()
            after = torch.cuda.memory_allocated() + vramkit.memory_allocated()
            res = model(ids, labels=ids)
            logp = torch.log_softmax(res.logits.float(), -1)
            kl = float((ref_logp.exp() * (ref_logp - logp)).sum(-1).mean())
            top1 = float((ref_logp.argmax(-1) == logp.argmax(-1)).float().mean())
            out[fmt] = {"block": block, "layers": len(rep["quantized"]), "skipped": rep["skipped"],
                        "weight_bytes_before": rep["weight_bytes_before"], "weight_bytes_after": rep["weight_bytes_after"],
                        "weight_ratio": rep["ratio"], "device_bytes_before": before, "device_bytes_after": after,
                        "loss": float(res.loss), "loss_change": float(res.loss) - out["loss_bf16"], "kl": kl,
                        "top1_agreement": top1}
            del model, res
            torch.cuda.empty_cache()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="quant_bench.json")
    ap.add_argument("--sizes", default="256,1024", help="input sizes in MiB")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--no-model", action="store_true")
    ap.add_argument("--launch", default="", help="also time the kernels under these launch shapes, comma-separated "
                    "TILE:GRID[:TABLE[:MAX_BLOCKS]] with TILE 4096 or 8192, GRID auto, persistent or tiles, TABLE auto, "
                    "buckets or direct, MAX_BLOCKS a cap on a persistent grid's thread blocks, N or NxSM (N a "
                    "multiprocessor) (vramkit.quant.set_launch)")
    args = ap.parse_args()
    launches = []
    for item in filter(None, args.launch.split(",")):
        parts = item.split(":")
        if len(parts) == 2:
            parts.append("auto")
        if len(parts) == 3:
            parts.append("0")
        cap = parts[3] if len(parts) == 4 else ""
        if len(parts) != 4 or not parts[0].isdigit() or parts[1] not in ("auto", "persistent", "tiles") \
                or parts[2] not in ("auto", "buckets", "direct") \
                or not (cap.isdigit() or (cap.upper().endswith("XSM") and cap[:-3].isdigit())):
            ap.error(f"--launch: {item!r} is not TILE:GRID[:TABLE[:MAX_BLOCKS]] "
                     "(e.g. 8192:tiles, 4096:persistent:buckets or 4096:auto:auto:3xSM)")
        launches.append((int(parts[0]), parts[1], parts[2], cap))
    import torch

    import vramkit.quant as vq
    from vramkit.quant._arrays import check, library
    if not torch.cuda.is_available() or not vq.kernels_available():
        print("needs a CUDA GPU, PyTorch and vramkit built with its kernels (nvcc)", file=sys.stderr)
        return 2
    t0 = time.time()
    lib = library()
    sizes = [int(s) for s in args.sizes.split(",")]
    props = torch.cuda.get_device_properties(0)
    res = {"device": props.name, "torch": torch.__version__, "copy_gbps": {}, "rows": [], "notes": []}
    for s in sizes:
        res["copy_gbps"][s] = copy_bandwidth(torch, s * MiB, args.iters)
    kernel_rows(torch, lib, check, sizes, args.iters, res["rows"])
    try:
        for tile, grid, table, cap in launches:
            blocks = int(cap[:-3]) * props.multi_processor_count if cap.upper().endswith("XSM") else int(cap)
            vq.set_launch(tile, grid, table, blocks)
            kernel_rows(torch, lib, check, sizes, args.iters, res["rows"], tag=launch_tag(tile, grid, table, cap),
                        sweep=False)
    finally:
        vq.set_launch()
    res["ceilings_gbps"] = ceiling_rows(torch, lib, check, res["rows"], args.iters)
    api_rows(torch, args.iters, max(sizes), res["rows"])
    anchor_rows(torch, args.iters, max(sizes), res["rows"], res["notes"])
    res["errors"] = error_rows(torch)
    if not args.no_model:
        try:
            res["model"] = model_rows(torch, res["notes"])
        except ImportError as e:
            res["notes"].append(f"GPT-2 skipped: {e}")
    for r in res["rows"]:
        r["pct_copy"] = 100 * r["gbps"] / res["copy_gbps"].get(r["size_mib"], max(res["copy_gbps"].values()))
        if "ceiling_gbps" in r:
            r["ceiling_pct_copy"] = 100 * r["ceiling_gbps"] / res["copy_gbps"][r["size_mib"]]
    kern = [r for r in res["rows"] if r["kind"] == "kernel" and r["size_mib"] >= 256]
    res["min_pct_copy"] = min(r["pct_copy"] for r in kern)
    res["seconds"] = time.time() - t0
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1, default=str)

    print(f"\n{props.name}, torch {torch.__version__}; copy bandwidth (read + write): " +
          ", ".join(f"{s} MiB {g:.0f} GB/s" for s, g in res["copy_gbps"].items()))
    print("\n\"ceiling\": the same reads and writes with no arithmetic (vk_quant_probe_traffic), % of copy; it moves "
          "no absmax (1.4 % of the bytes for fp32 4-bit at block 64) and reads code words narrower than 16 bytes with "
          "plain loads")
    print(f"\n{'what':12s} {'op':32s} {'format':13s} {'dtype':9s} {'block':>5s} {'MiB':>5s} {'ms':>8s} {'GB/s':>7s} {'% copy':>7s} "
          f"{'ceiling':>8s}")
    for r in res["rows"]:
        ceil = f"{r['ceiling_pct_copy']:7.1f}%" if "ceiling_pct_copy" in r else f"{'-':>8s}"
        print(f"{r['kind']:12s} {r['op']:32s} {r['format']:13s} {r['dtype']:9s} {str(r['block'] or '-'):>5s} "
              f"{r['size_mib']:5d} {r['ms']:8.3f} {r['gbps']:7.0f} {r['pct_copy']:6.1f}% {ceil}")
    print(f"\nerrors on randn(1024, 1024), from the GPU ({'all equal' if all(e['equals_reference'] for e in res['errors']) else 'NOT all equal'} to the NumPy reference bit for bit):")
    print(f"{'format':13s} {'block':>5s} {'bits/value':>10s} {'mean abs':>9s} {'mean rel':>9s} {'max/absmax':>10s}")
    for e in res["errors"]:
        print(f"{e['format']:13s} {e['block']:5d} {e['bits_per_value']:10.3f} {e['mean_abs']:9.5f} {e['mean_rel']:9.4f} "
              f"{e['max_over_absmax']:10.5f}")
    if "model" in res:
        m = res["model"]
        print(f"\nGPT-2 124M bf16 ({m['source']}), {m['tokens']} tokens: loss {m['loss_bf16']:.4f}")
        for fmt in ("int8", "nf4"):
            r = m[fmt]
            print(f"  {fmt:5s} block {r['block']:4d}: {r['layers']} linear layers, weights {r['weight_bytes_before'] / MiB:.1f} -> "
                  f"{r['weight_bytes_after'] / MiB:.1f} MiB ({r['weight_ratio']:.3f}x of bf16), device memory "
                  f"{r['device_bytes_before'] / MiB:.0f} -> {r['device_bytes_after'] / MiB:.0f} MiB; loss {r['loss']:.4f} "
                  f"({r['loss_change']:+.4f}), KL {r['kl']:.2e}, top-1 agreement {100 * r['top1_agreement']:.2f}%")
    for note in res["notes"]:
        print("note:", note)
    if launches:
        shapes = ["kernel"] + ["kernel" + launch_tag(*launch) for launch in launches]
        by = {(r["kind"], r["op"], r["format"], r["dtype"], r["size_mib"]): r["pct_copy"] for r in res["rows"]}
        print("\n% of copy bandwidth by launch shape (\"kernel\" is the default: 4096/auto/auto):")
        ceil = {(r["op"], r["format"], r["dtype"], r["size_mib"]): r.get("ceiling_pct_copy", float("nan"))
                for r in res["rows"] if r["kind"] == "kernel"}
        print(f"{'op':7s} {'format':13s} {'dtype':9s} {'MiB':>5s} {'ceiling':>8s} " + " ".join(f"{s:>30s}" for s in shapes))
        keys = sorted({k[1:] for k in by if k[0] == "kernel"}, key=lambda k: (k[3], k[2], k[1], k[0]))
        for k in keys:
            print(f"{k[0]:7s} {k[1]:13s} {k[2]:9s} {k[3]:5d} {ceil.get(k, float('nan')):7.1f}% " +
                  " ".join(f"{by.get((s,) + k, float('nan')):29.1f}%" for s in shapes))
        res["min_pct_copy_by_launch"] = {s: min(v for kk, v in by.items() if kk[0] == s and kk[4] >= 256) for s in shapes}
        print("slowest kernel by launch shape: " + ", ".join(f"{s} {v:.1f}%" for s, v in res["min_pct_copy_by_launch"].items()))
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1, default=str)
    worst = min(kern, key=lambda r: r["pct_copy"])
    print(f"\nslowest kernel on >= 256 MiB: {worst['op']} {worst['format']} {worst['dtype']} {worst['size_mib']} MiB at "
          f"{worst['pct_copy']:.1f}% of copy bandwidth (goal 90%): {'met' if worst['pct_copy'] >= 90 else 'NOT met'}; "
          f"{res['seconds']:.0f} s; JSON in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
