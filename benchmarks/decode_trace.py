"""A synthetic trace of a Llama-style generation loop, in the "op id size stream" lines that
`cpp/bench/quick_replay` reads (op 0 allocates, 1 frees; one stream).

    python3 benchmarks/decode_trace.py [--steps 12] [--seed 0] > decode.ops
    build/default/cpp/bench/quick_replay < decode.ops

Shaped like the end-to-end suite's `llama_gen` workload (docs/BENCHMARKS.md section 5): 8 layers,
hidden 1024, 16 key/value heads of 64, MLP 2816, vocabulary 32000, bf16 weights held throughout;
each step draws a batch of 8-64, a prompt of 64-1024 tokens and 16-32 new tokens, runs the prompt
through every layer, then decodes one token at a time, each layer's keys and values reallocated one
token longer and the old ones freed (as a cache grown by concatenation does): 2,000-4,000
allocations a step, against the real loop's 9,000 (rotary embeddings, masks and casts are left
out). It models the pool's host work on that pattern, not the real workload's every tensor.
"""
from __future__ import annotations

import argparse
import random
import sys

LAYERS, HIDDEN, KV_HEADS, HEAD_DIM, FFN, VOCAB, BF16 = 8, 1024, 16, 64, 2816, 32000, 2


def ops(steps: int = 12, seed: int = 0) -> list[tuple[int, int, int, int]]:
    """(op, id, size, stream) tuples; every allocation is freed by the end."""
    rng = random.Random(seed)
    out: list[tuple[int, int, int, int]] = []
    next_id = 0

    def alloc(size: int) -> int:
        nonlocal next_id
        out.append((0, next_id, size, 0))
        next_id += 1
        return next_id - 1

    def free(i: int) -> None:
        out.append((1, i, 0, 0))

    def layer(x: int, rows: int, kv: list[int] | None, kv_len: int) -> tuple[int, list[int]]:
        """One transformer layer over `rows` tokens; with `kv`, the cache grown to `kv_len`."""
        h = rows * HIDDEN * BF16
        n, q = alloc(h), alloc(h)
        k_new, v_new = alloc(rows * KV_HEADS * HEAD_DIM * BF16), alloc(rows * KV_HEADS * HEAD_DIM * BF16)
        if kv is not None:  # the cache one token longer: new tensors, the old and the token's freed
            cache = rows * kv_len * KV_HEADS * HEAD_DIM * BF16
            k = alloc(cache); free(kv[0]); free(k_new)
            v = alloc(cache); free(kv[1]); free(v_new)
            kv = [k, v]
        else:
            kv = [k_new, v_new]
        att = alloc(h); free(q)
        o = alloc(h); free(att); free(n)
        r = alloc(h); free(o); free(x)
        n = alloc(h)
        g, u, m = alloc(rows * FFN * BF16), alloc(rows * FFN * BF16), alloc(rows * FFN * BF16)
        free(g); free(u)
        y = alloc(h); free(m); free(n)
        x2 = alloc(h); free(y); free(r)
        return x2, kv

    weights = [alloc(HIDDEN * HIDDEN * BF16) for _ in range(4 * LAYERS)]
    weights += [alloc(HIDDEN * FFN * BF16) for _ in range(3 * LAYERS)] + [alloc(VOCAB * HIDDEN * BF16)]
    for _ in range(steps):
        batch, prompt, new = rng.randint(8, 64), rng.randint(64, 1024), rng.randint(16, 32)
        x = alloc(batch * prompt * HIDDEN * BF16)
        caches = []
        for _layer in range(LAYERS):
            x, kv = layer(x, batch * prompt, None, prompt)
            caches.append(kv)
        logits = alloc(batch * VOCAB * 4); free(x)
        token = alloc(batch * 8); free(logits)
        for t in range(1, new + 1):
            x = alloc(batch * HIDDEN * BF16)
            for i in range(LAYERS):
                x, caches[i] = layer(x, batch, caches[i], prompt + t)
            logits = alloc(batch * VOCAB * 4); free(x)
            nxt = alloc(batch * 8); free(logits); free(token)
            token = nxt
        free(token)
        for k, v in caches:
            free(k); free(v)
    for w in weights:
        free(w)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12, help="generation steps (default 12)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the batch, prompt and token draws (default 0)")
    a = ap.parse_args(argv)
    if a.steps < 1:
        ap.error("--steps must be at least 1")
    sys.stdout.write("".join(f"{o} {i} {s} {st}\n" for o, i, s, st in ops(a.steps, a.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
