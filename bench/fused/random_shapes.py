#!/usr/bin/env python3
"""A seeded random shape set for the fused family (issue: "fast at every shape"), written as
bench/shapes/fused.txt's lines with the set named in a sixth column, for fused_bench and
torch_fused.py to read alike:

  random_shapes.py --count N [--seed S] [--worlds 2,3,4] [--out FILE]

Per op (allGatherGemm, gemmReduceScatter, gemmAllReduce) N shapes: M uniform in [1, 16384], N
and K uniform in [256, 16384]; the dimension the op splits over the ranks (allGatherGemm's N,
the others' K) rounded up to a multiple of 8 x every world size of --worlds at once (so that
each rank's share is a multiple of 8 at each of them), the other rounded up to a multiple of 8
(off it cuBLAS leaves its fast path, and the comparison would show its tails rather than ours).
Nothing else is aligned: M and the tiles' multiples are left to chance. The label is
r<M>x<N>x<K> (whole N and K); the set random-<seed>. The seed, chosen here unless given, is
printed first.
"""
import argparse
import math
import random
import sys

MIN_NK, MAX_DIM = 256, 16384
OPS = ("allGatherGemm", "gemmReduceScatter", "gemmAllReduce")


def round_up(x, a):
    """x up to a multiple of a, down where that passes MAX_DIM."""
    return min(-(-x // a) * a, MAX_DIM // a * a)


def random_shapes(count, seed, worlds):
    """[(op, label, M, N, K)], count per op, in op order."""
    rng = random.Random(seed)
    split_align = 8 * math.lcm(*worlds)
    out = []
    for op in OPS:
        for _ in range(count):
            m, n, k = rng.randint(1, MAX_DIM), rng.randint(MIN_NK, MAX_DIM), rng.randint(MIN_NK, MAX_DIM)
            if op == "allGatherGemm":
                n, k = round_up(n, split_align), round_up(k, 8)
            else:
                n, k = round_up(n, 8), round_up(k, split_align)
            out.append((op, f"r{m}x{n}x{k}", m, n, k))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, required=True, help="shapes per op")
    ap.add_argument("--seed", type=int, help="default: chosen and printed")
    ap.add_argument("--worlds", default="2,3,4", help="world sizes every split must suit (default 2,3,4)")
    ap.add_argument("--out", help="the shape file (default: stdout)")
    args = ap.parse_args(argv)
    worlds = [int(w) for w in args.worlds.split(",") if w]
    if args.count < 1 or not worlds or min(worlds) < 1:
        raise SystemExit("--count >= 1 and --worlds: positive world sizes")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    name = f"random-{seed}"
    print(f"fused random set: {args.count} shapes per op, seed {seed}", file=sys.stderr, flush=True)
    lines = [f"# {name}: random_shapes.py --count {args.count} --seed {seed} --worlds {args.worlds}"]
    lines += [f"{op} {label} {m} {n} {k} {name}" for op, label, m, n, k in random_shapes(args.count, seed, worlds)]
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return seed


if __name__ == "__main__":
    main()
