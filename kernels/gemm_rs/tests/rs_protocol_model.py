#!/usr/bin/env python3
"""A model of the fused gemmReduceScatter's push protocol (detail/fused_gemm.cuh), searched for
deadlocks under random scheduling. Usage: rs_protocol_model.py [--quick] [--pusher] [--interleave LEAD...] [--spread LEAD...]

What is modelled, per rank: the tile sweep of RsSchedule::coord (other ranks' M-blocks first,
starting after the own ones, then the own blocks, each part in the grouped raster), CTAs whose
producer claims up to `lookahead` tiles ahead of its consumers, and two warpgroups per CTA (one
64-row half each) that may drift apart by up to `lead` tiles. A warpgroup's half-tile:
- rows of another owner: pushed; its flag is raised at the warpgroup's next flush: early in
  its next tile's main loop (reachable once the other warpgroup has finished this tile's main
  loop: the next tile's first stages reuse stages that both must have released), or at its end;
- rows of its own rank: first every pending push of the warpgroup is flagged, then it waits
  until every other rank's push of that half-tile is flagged.
A configuration passes when every rank finishes; it deadlocks when no claim, step or flush can
happen. --pusher models the pusher warps (RsEpilogue::kWarpPush): a pushed half-tile's flag is
raised by a helper warp that waits for nothing but its own stores, so it is raised at the push
itself, and a warpgroup flushes nothing before its waits. What is not modelled: the start and end barriers (always satisfiable: a rank raises
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


def interleave_part(t, n_rest, n_own, lead):
    """The interleaved sweep (fused_gemm.cuh's rs_interleaved until run 13, which measured it
    slower and removed it; it stands at 75be861): sweep position t -> (own part?, index)."""
    head = min(lead, n_rest)
    if t < head:
        return False, t
    u = t - head
    pairs = min(n_own, n_rest - head)
    if u < 2 * pairs:
        return (True, u // 2) if u % 2 == 0 else (False, head + u // 2)
    v = u - 2 * pairs
    return (True, pairs + v) if n_own > pairs else (False, head + pairs + v)


def spread_sweep(M, W, rank, n_blocks, group, lead):
    """The spread sweep for W >= 2 (the kernel's bench switch FUSEDCOMM_RS_SPREAD,
    fused_gemm.cuh rs_spread_coord; fused/NOTES.md "Run 18", item 7): the own tiles spread
    through the sweep, so that the pushes are too. Only where every rank's rows
    are whole M-blocks (M a multiple of 128 W). The other ranks' blocks in turn, block j of
    owner r + 1, r + 2, ..., r + W - 1, then block j + 1 (a grouped raster over that order);
    the first `lead` positions push, then each own tile (the own part's grouped raster) is
    followed by W - 1 pushes while both last, then the rest. Returns (M-block, column) per
    position, or None where it does not apply."""
    if M % (128 * W):
        return None
    if lead < 0:  # the lead the model finds enough: a raster group of every other rank's blocks
        lead = (W - 1) * group * n_blocks
    per = M // (128 * W)  # blocks per rank
    rest_blocks = [((rank + 1 + i) % W) * per + j for j in range(per) for i in range(W - 1)]
    rest = []
    for t in range(len(rest_blocks) * n_blocks):
        v, n = grouped_raster(t, len(rest_blocks), group, n_blocks)
        rest.append((rest_blocks[v], n))
    own = []
    for t in range(per * n_blocks):
        m, n = grouped_raster(t, per, group, n_blocks)
        own.append((rank * per + m, n))
    head = min(lead, len(rest))
    out, ri = rest[:head], head
    for tile in own:
        out.append(tile)
        out += rest[ri:ri + W - 1]
        ri += W - 1
    return out + rest[ri:]


def sweep(M, W, rank, n_blocks, group, interleave=None, spread=None):
    """RsSchedule::coord for every sweep position of `rank`: (M-block, tile column).
    interleave: the lead (in tiles) of the interleaved order, or None for the two parts; as
    rs_geometry, only at W = 2 with M a multiple of 256 (elsewhere it deadlocks)."""
    if spread is not None:
        out = spread_sweep(M, W, rank, n_blocks, group, spread)
        if out is not None:
            return out
    if W != 2 or M % 256:
        interleave = None
    mb = (M + 127) // 128
    off, cnt = split_offset(M, W, rank), split_count(M, W, rank)
    b0, own = (off // 128, (off + cnt - 1) // 128 - off // 128 + 1) if cnt else (0, 0)
    n_rest, n_own = (mb - own) * n_blocks, own * n_blocks
    out = []
    for t in range(mb * n_blocks):
        if interleave is None:
            is_own, i = (t >= n_rest, t - n_rest if t >= n_rest else t)
        else:
            is_own, i = interleave_part(t, n_rest, n_own, interleave)
        if not is_own:
            m, n = grouped_raster(i, mb - own, group, n_blocks)
            out.append(((b0 + own + m) % mb, n))
        else:
            m, n = grouped_raster(i, own, group, n_blocks)
            out.append((b0 + m, n))
    return out


def run(M, W, ctas, n_blocks, group, lookahead, lead, seed, pusher=False, interleave=None,
        spread=None):
    rng = random.Random(seed)
    seqs = [sweep(M, W, r, n_blocks, group, interleave, spread) for r in range(W)]
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
    ap.add_argument("--pusher", action="store_true")
    ap.add_argument("--interleave", type=int, nargs="*", default=None,
                    help="leads (tiles) of the interleaved sweep (RsSchedule, W = 2) to try")
    ap.add_argument("--spread", type=int, nargs="*", default=None,
                    help="leads (tiles) of the spread sweep (spread_sweep, any W) to try; -1: "
                         "(W - 1) x group x columns")
    args = ap.parse_args()
    # One loop over the leads of the sweep asked for (spread before interleave), or the default.
    spreading = args.spread is not None
    leads = args.spread if spreading else args.interleave if args.interleave is not None else [None]
    worlds = [2, 3, 4] if args.quick else [2, 3, 4, 5, 6, 8]
    step_m = 37 if args.quick else 7
    cases, bad = 0, []
    for W in worlds:
        aligned = ([128 * W * i for i in range(1, 9)] if spreading
                   else [256 * i for i in range(1, 13)] if W == 2 and args.interleave else [])
        for M in list(range(W, 900, step_m)) + [128 * W, 128 * W + 64] + aligned:
            for n_blocks in (1, 3):
                for ctas in (1, 2, 3):
                    for group in (1, 8):
                        for lookahead, lead in ((2, 1), (3, 2), (6, 6)):
                            for il in leads:
                                cases += 1
                                if not run(M, W, ctas, n_blocks, group, lookahead, lead, cases,
                                           args.pusher, None if spreading else il,
                                           il if spreading else None):
                                    bad.append((M, W, ctas, n_blocks, group, lookahead, lead, il))
    print(f"{cases} configurations, {len(bad)} deadlocks", bad[:10])
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
