"""A synthetic mixture-of-experts training trace for the pool's host model.

A Mixtral-like model (4 layers, 8 experts, 8,192 tokens, hidden 1,024, expert width 3,584,
vocabulary 32,000) trained with Adam: each layer's attention activations have fixed sizes, and
each expert's blocks follow the tokens routed to it (a Dirichlet draw per layer and step, so
their sizes change from step to step while the order of requests stays the same). Written as
the operation lines `quick_replay` reads ("0 ID SIZE STREAM" allocates, "1 ID 0 STREAM" frees);
the first step's operation index and the step's length go to stderr, for `VKSTEP=FIRST,PERIOD`.

    python3 benchmarks/moe_trace.py --steps 30 --alpha 10 --seed 1 > moe.ops 2> moe.marks
    VKSTEP=114,1490 VKPASSES=1 VKLAG=300 build/default/cpp/bench/quick_replay "" < moe.ops

docs/BENCHMARKS.md section 5 ("Partial plans") has what it gave: the default pool settles on it
(3 pages mapped from the fourth step on, 1.003 of the live peak, with the GPU 0-1,000 operations
behind).
"""
import argparse
import sys

import numpy as np

MiB = 1 << 20
T, H, I, E, V, L = 8192, 1024, 3584, 8, 32000, 4


def trace(steps, alpha, seed):
    rng = np.random.default_rng(seed)
    out, sizes, marks = [], {}, []
    next_id = [0]

    def A(size):
        i = next_id[0]
        next_id[0] += 1
        out.append(f"0 {i} {int(size)} 0")
        sizes[i] = int(size)
        return i

    def F(i):
        out.append(f"1 {i} 0 0")

    params = [V * H * 4, V * H * 4]
    for _ in range(L):
        params += [H * H * 4, H * 512 * 4, H * 512 * 4, H * H * 4] + [I * H * 4] * (3 * E)
    for s in params:
        A(s)
    grads = adam = None
    for _ in range(steps):
        marks.append(len(out))
        saved = [A(T * H * 4)]
        for _ in range(L):
            saved += [A(32 * MiB), A(16 * MiB), A(2 * MiB), A(1 * MiB), A(1 * MiB), A(2 * MiB),
                      A(16 * MiB), A(8 * MiB), A(8 * MiB)]
            scores, probs32 = A(256 * MiB), A(512 * MiB)
            F(scores)
            saved.append(A(256 * MiB))
            F(probs32)
            saved.append(A(16 * MiB))
            o = A(16 * MiB)
            saved.append(A(32 * MiB))
            F(o)
            saved += [A(32 * MiB), A(16 * MiB), A(256 * 1024)]
            fin = A(16 * MiB)
            routed = rng.multinomial(2 * T, rng.dirichlet([alpha] * E))
            for e in range(E):
                ne = int(routed[e])
                saved += [A(ne * 2 * H), A(I * H * 2), A(I * H * 2), A(I * H * 2),
                          A(ne * 2 * I), A(ne * 2 * I), A(ne * 2 * I), A(ne * 2 * I)]
                y = A(ne * 2 * H)
                saved.append(A(ne * 2 * H))
                F(y)
            saved.append(fin)
            saved.append(A(32 * MiB))
        saved += [A(32 * MiB), A(16 * MiB), A(V * H * 2)]
        saved.append(A(T * V * 2))  # logits
        l32, lsm = A(T * V * 4), A(T * V * 4)
        F(l32)
        saved.append(lsm)
        if grads is not None:  # zero_grad(set_to_none): the last step's gradients go
            for g in grads:
                F(g)
            for _ in range(len(params) // 2):  # as many requests as the first step's Adam state
                F(A(512))
        # backward: saved tensors freed in reverse, parameters' gradients made along the way
        d = A(T * V * 4)
        F(d)
        new = [None] * len(params)
        for k, s in enumerate(reversed(saved)):
            if k % 7 == 0:  # a temporary of the activation's size
                F(A(sizes.get(s, MiB)))
            F(s)
            if k % 23 == 0 and k // 23 < len(params):
                j = len(params) - 1 - k // 23
                new[j] = A(params[j])
        for j in range(len(params)):
            if new[j] is None:
                new[j] = A(params[j])
        grads = new
        if adam is None:  # Adam's two moments, made at the first optimizer step
            adam = [A(s) for s in params] + [A(s) for s in params]
        for s in params:  # a temporary per parameter
            F(A(s))
    return out, marks


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=14, help="training steps (default 14)")
    ap.add_argument("--alpha", type=float, default=10.0,
                    help="Dirichlet concentration of the routing: lower is more uneven (default 10)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the routing (default 0)")
    a = ap.parse_args(argv)
    if a.steps < 1:
        ap.error("--steps must be at least 1")
    if not a.alpha > 0:
        ap.error("--alpha must be positive")
    out, marks = trace(a.steps, a.alpha, a.seed)
    sys.stdout.write("\n".join(out) + "\n")
    period = marks[1] - marks[0] if len(marks) > 1 else 0
    print(f"VKSTEP={marks[0]},{period}", file=sys.stderr)


if __name__ == "__main__":
    main()
