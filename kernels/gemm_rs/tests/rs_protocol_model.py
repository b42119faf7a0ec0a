#!/usr/bin/env python3
"""A model of the fused gemmReduceScatter's push protocol (detail/gemm_rs_kernel.cuh), searched
for deadlocks under random scheduling. Usage: rs_protocol_model.py [--quick] [--late-flags]

What is modelled, per rank: the tile sweep of RsSchedule::coord (other ranks' M-blocks first,
starting after the own ones, then the own blocks, each part in the grouped raster), CTAs whose
producer claims up to `lookahead` tiles ahead of its consumers, and two warpgroups per CTA (one
64-row half each) that may drift apart by up to `lead` tiles. A warpgroup's half-tile:
- rows of another owner: pushed. The kernel's pusher warps (RsEpilogue::aux_warp) raise its flag
  themselves, waiting for nothing but their own stores, so the model raises it at the push.
  --late-flags: the warpgroup raises it at its next flush instead, early in its next tile's main
  loop (reachable once the other warpgroup has finished this tile's main loop: the next tile's
  first stages reuse stages that both must have released), or at its end, a later flag that
  the sweep order must tolerate too;
- rows of its own rank: (--late-flags: first every pending push of the warpgroup is flagged,)
  then it waits until every other rank's push of that half-tile is flagged.
A configuration passes when every rank finishes; it deadlocks when no claim, step or flush can
happen. What is not modelled: the start and end barriers (always satisfiable: a rank raises
its start flag at launch, and the end barrier follows the last wait), timeouts, data.
"""
import argparse
import random
import sys


def split_count(n, w, r):
    return n // w + (1 if r < n % w else 0)


def split_offset(n, w, r):
    return r * (n // w) + min(r, n % w)


def split_owner(n, w, i):
    q, rem = n // w, n % w
    return i // (q + 1) if i < rem * (q + 1) else rem + (i - rem * (q + 1)) // q


def grouped_raster(t, rows, group, n_blocks):
    g = t // (group * n_blocks)
    first = g * group
    height = min(rows - first, group)
    r = t - g * group * n_blocks
    return first + r % height, r // height


def sweep(M, W, rank, n_blocks, group):
    """RsSchedule::coord for every sweep position of `rank`: (M-block, tile column)."""
    mb = (M + 127) // 128
    off, cnt = split_offset(M, W, rank), split_count(M, W, rank)
    b0, own = (off // 128, (off + cnt - 1) // 128 - off // 128 + 1) if cnt else (0, 0)
    n_rest = (mb - own) * n_blocks
    out = []
    for t in range(mb * n_blocks):
        if t < n_rest:
            m, n = grouped_raster(t, mb - own, group, n_blocks)
            out.append(((b0 + own + m) % mb, n))
        else:
            m, n = grouped_raster(t - n_rest, own, group, n_blocks)
            out.append((b0 + m, n))
    return out


def run(M, W, ctas, n_blocks, group, lookahead, lead, seed, pusher=True):
    rng = random.Random(seed)
    seqs = [sweep(M, W, r, n_blocks, group) for r in range(W)]
    for s in seqs:
        assert len(set(s)) == len(s) == ((M + 127) // 128) * n_blocks, "sweep is not a permutation"
    flags = set()  # (owner, source, half, column): raised
    claimed = [0] * W
    state = [[{"tiles": [], "pos": [0, 0], "pend": [None, None]} for _ in range(ctas)] for _ in range(W)]

    def claim(r, c):
        st = state[r][c]
        if claimed[r] >= len(seqs[r]) or len(st["tiles"]) - min(st["pos"]) >= lookahead:
            return False
        st["tiles"].append(seqs[r][claimed[r]])
        claimed[r] += 1
        return True

    def start(r, c, w):
        # The next tile is claimed and its first stages are loaded: they reuse stages of earlier
        # tiles, free once the other warpgroup finished the main loop of this warpgroup's last
        # tile (it is in that tile's epilogue or later). Then the main loop flushes.
        st = state[r][c]
        p = st["pos"][w]
        if st["pend"][w] and p < len(st["tiles"]) and st["pos"][1 - w] >= p - 1:
            flags.add(st["pend"][w])
            st["pend"][w] = None
            return True
        return False

    def step(r, c, w):  # True: progress; False: nothing to do or blocked
        st = state[r][c]
        p = st["pos"][w]
        if p >= len(st["tiles"]) or (p - st["pos"][1 - w] >= lead and st["pos"][1 - w] < len(st["tiles"])):
            return False
        m, n = st["tiles"][p]
        h0 = m * 128 + w * 64
        if h0 >= M:
            st["pos"][w] += 1
            return True
        h1 = min(h0 + 64, M)
        lo, hi = split_owner(M, W, h0), split_owner(M, W, h1 - 1)
        half = h0 // 64
        for o in range(lo, hi + 1):  # pushes: each completes the older pending one
            if o != r:
                if pusher:
                    flags.add((o, r, half, n))
                    continue
                if st["pend"][w]:
                    flags.add(st["pend"][w])
                st["pend"][w] = (o, r, half, n)
        if lo <= r <= hi:
            if st["pend"][w] and not pusher:  # push before wait
                flags.add(st["pend"][w])
                st["pend"][w] = None
            if not all((r, s, half, n) in flags for s in range(W) if s != r):
                return False
        st["pos"][w] += 1
        return True

    while True:
        actions = [(r, c, w, a) for r in range(W) for c in range(ctas) for w in (0, 1)
                   for a in ("claim", "start", "step")]
        rng.shuffle(actions)
        progress = False
        for r, c, w, a in actions:
            before = len(flags)
            did = claim(r, c) if a == "claim" else start(r, c, w) if a == "start" else step(r, c, w)
            if did or len(flags) != before:
                progress = True
                break
        if progress:
            continue
        for r in range(W):  # a warpgroup with no tile left flushes its pending push
            for c in range(ctas):
                for w in (0, 1):
                    st = state[r][c]
                    done = claimed[r] == len(seqs[r]) and st["pos"][w] == len(st["tiles"])
                    if done and st["pend"][w]:
                        flags.add(state[r][c]["pend"][w])
                        state[r][c]["pend"][w] = None
                        progress = True
        if progress:
            continue
        return all(claimed[r] == len(seqs[r]) and all(min(st["pos"]) == len(st["tiles"]) for st in state[r])
                   for r in range(W))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--late-flags", action="store_true",
                    help="flags raised by the warpgroup at its next flush, not by the pusher")
    args = ap.parse_args()
    worlds = [2, 3, 4] if args.quick else [2, 3, 4, 5, 6, 8]
    step_m = 37 if args.quick else 7
    cases, bad = 0, []
    for W in worlds:
        for M in list(range(W, 900, step_m)) + [128 * W, 128 * W + 64]:
            for n_blocks in (1, 3):
                for ctas in (1, 2, 3):
                    for group in (1, 8):
                        for lookahead, lead in ((2, 1), (3, 2), (6, 6)):
                            cases += 1
                            if not run(M, W, ctas, n_blocks, group, lookahead, lead, cases,
                                       not args.late_flags):
                                bad.append((M, W, ctas, n_blocks, group, lookahead, lead))
    print(f"{cases} configurations, {len(bad)} deadlocks", bad[:10])
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
