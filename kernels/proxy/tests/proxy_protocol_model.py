#!/usr/bin/env python3
"""A model of the proxy collectives' chunk protocol (kernels/proxy/proxy.h, launch_proxy_collective),
checked under random scheduling.
Usage: proxy_protocol_model.py [--quick] [--depth D] [--lanes L] [--no-chunk0-credit] [--regions-per-chunk]

What is modelled: H ranks (one per host) run the same random sequence of ops back to back, with
no host synchronisation between them: allReduce and allGather stage one outbox slot that goes to
every peer, reduceScatter and allToAll one slot per peer. A slot holds K units (bytes, coarsely);
a block of T units spans ceil(T / K) chunks, chunk c holding min(K, T - c K) units (possibly
none: blocks differ by host, the op's chunk count is set by its largest block).
Lanes: each rank runs L lanes (CTAs), lane l an independent copy of the protocol below over its
units of every slot, with its own ring, connection per (source, destination), receive and
credit words and value base. Lane l owns units [l R, (l + 1) R) of every slot, R = ceil(K / L),
whatever the chunk's size (the kernel's proxy_lane_region). An op whose every block fits R units
runs on lane 0 alone; the other lanes skip it (their value bases do not move).
Op k's chunk c on a lane is that lane's chunk g = base + c, with signal value g + 1 and slot
g % D of each box (D, the depth). A lane is a software pipeline that sends chunk i and then
receives chunk i - (D - 1), for i = 0 .. chunks + D - 2:
  send i (i < chunks; g = base + i):
  1. waits until every peer's credit word (of this lane) >= g + 1 - D (the peer's lane consumed
     this rank's chunk g - D, of this op or of an op before: its units of slot g % D are free),
  2. stages its units of the chunk(s) in outbox slot g % D,
  3. posts one write per peer (its units of that outbox slot -> the same units of the peer's
     inbox slot (g % D, this rank), then the lane's receive word for this rank := g + 1), even
     with no units (the signal alone);
  receive j = i - (D - 1) (0 <= j < chunks; g = base + j):
  4. waits until every peer's receive word (of this lane) >= g + 1,
  5. reads its units of every inbox slot (g % D, peer),
  6. posts a signal-only write per peer (the peer's credit word of this lane := g + 1).
With L = 1 and D = 1 this is the first, unpipelined protocol.
Each lane's proxy takes its ring's commands in order and reads the write's source units when it
takes the command, as the socket transport does; each (lane, source, destination) is one ordered
connection that lands the payload before the signal word.
Checked: (a) when a proxy reads an outbox unit it holds the chunk the command was posted for;
(b) when a lane reads an inbox unit it holds the chunk it waits for; (c) every rank finishes (no
deadlock). Two broken variants must be found: --no-chunk0-credit (an op's first chunks skip the
credit wait: a bug the kernel once had) and --regions-per-chunk (a lane's units cut from each
chunk's own size, ceil(n / L) units per lane, instead of fixed regions: a short chunk's lane 1
then writes units that a peer's lane 0 may still read).
Not modelled: timeouts and abort, ring capacity (the kernel waits for a free slot; the proxy
always drains), data values (a unit's content is the (op, chunk, source, destination) it carries).
"""
import argparse
import random
import sys

AR, AG, RS, A2A = "allReduce", "allGather", "reduceScatter", "allToAll"


def make_ops(rng, hosts, n_ops, k):
    """The op sequence every rank runs: (mode, totals), totals[(s, d)] = units that s sends d."""
    ops = []
    for _ in range(n_ops):
        mode = rng.choice([AR, AG, RS, A2A])
        big = rng.random() < 0.7
        size = lambda: rng.randint(0, 4 * k) if big else rng.randint(0, k)  # noqa: E731
        if mode == AR:
            t = max(1, size())
            totals = {(s, d): t for s in range(hosts) for d in range(hosts)}
        elif mode == AG:  # block s goes to everyone
            block = [size() for _ in range(hosts)]
            totals = {(s, d): block[s] for s in range(hosts) for d in range(hosts)}
        elif mode == RS:  # every source sends host d its contribution to block d
            block = [size() for _ in range(hosts)]
            totals = {(s, d): block[d] for s in range(hosts) for d in range(hosts)}
        else:
            totals = {(s, d): size() for s in range(hosts) for d in range(hosts)}
        ops.append((mode, totals))
    return ops


class Lane:
    def __init__(self, hosts, index):
        self.index = index   # which lane: its region of every slot
        self.op = 0          # current op
        self.i = 0           # current pipeline iteration of the op
        self.step = 1        # next step (1..6) of the iteration
        self.base = 0        # value base of the current op
        self.recv = [0] * hosts    # receive words, by source
        self.credit = [0] * hosts  # credit words, by source
        self.ring = []       # posted commands, in order
        self.done = False


class Rank:
    def __init__(self, me, hosts, lanes):
        self.me, self.hosts = me, hosts
        self.outbox = {}     # (slot, peer or 0, unit) -> content
        self.inbox = {}      # (slot, source, unit) -> content
        self.lanes = [Lane(hosts, index) for index in range(lanes)]

    def peers(self):
        return [p for p in range(self.hosts) if p != self.me]


def run(hosts, ops, rng, depth, lanes, k, chunk0_credit=True, regions_per_chunk=False):
    ranks = [Rank(r, hosts, lanes) for r in range(hosts)]
    channels = {(l, s, d): [] for l in range(lanes) for s in range(hosts) for d in range(hosts) if s != d}
    region = -(-k // lanes)

    def chunks_of(op):
        return max(1, max(-(-t // k) for t in ops[op][1].values()))

    def active(op):
        return 1 if max(ops[op][1].values()) <= region else lanes

    def units(lane, n):
        """Lane `lane`'s units of a chunk holding n units."""
        if regions_per_chunk:
            piece = -(-n // lanes) if n else 0
            return range(min(lane * piece, n), min((lane + 1) * piece, n))
        return range(min(lane * region, n), min((lane + 1) * region, n))

    def n_units(op, s, d, c):
        return max(0, min(k, ops[op][1][(s, d)] - c * k))

    def skip_idle(ln):
        while ln.op < len(ops) and ln.index >= active(ln.op):
            ln.op += 1
        ln.done = ln.op == len(ops)

    for rk in ranks:
        for ln in rk.lanes:
            skip_idle(ln)

    def lane_step(rk, ln):
        """Advances lane ln of rank rk by one step if it can; returns (moved, violation)."""
        mode = ops[ln.op][0]
        chunks = chunks_of(ln.op)
        i, base, scatter, D, lane = ln.i, ln.base, mode in (RS, A2A), depth, ln.index
        sending, j = i < chunks, i - (D - 1)
        receiving = 0 <= j < chunks
        if ln.step <= 3 and sending:
            c, g = i, base + i
            if ln.step == 1:
                if (c >= D or chunk0_credit) and any(ln.credit[p] < g + 1 - D for p in rk.peers()):
                    return False, None
            elif ln.step == 2:
                for p in rk.peers():
                    tag = (ln.op, c, rk.me, p if scatter else None)
                    for u in units(lane, n_units(ln.op, rk.me, p, c)):
                        rk.outbox[(g % D, p if scatter else 0, u)] = tag
            else:
                for p in rk.peers():
                    us = list(units(lane, n_units(ln.op, rk.me, p, c)))
                    ln.ring.append(("write", p, (g % D, p if scatter else 0), (g % D, rk.me), us,
                                    (ln.op, c, rk.me, p if scatter else None), g + 1))
        elif ln.step >= 4 and receiving:
            c, g = j, base + j
            if ln.step == 4:
                if any(ln.recv[p] < g + 1 for p in rk.peers()):
                    return False, None
            elif ln.step == 5:
                for s in rk.peers():
                    want = (ln.op, c, s, rk.me if scatter else None)
                    for u in units(lane, n_units(ln.op, s, rk.me, c)):
                        got = rk.inbox.get((g % D, s, u))
                        if got != want:
                            return True, "rank %d lane %d read inbox unit %s as %s, expected %s" % (
                                rk.me, lane, (g % D, s, u), got, want)
            else:
                for p in rk.peers():
                    ln.ring.append(("credit", p, None, None, [], None, g + 1))
        ln.step += 1
        if ln.step == 7:
            ln.step, ln.i = 1, ln.i + 1
            if ln.i == chunks + D - 1:
                ln.i, ln.base, ln.op = 0, ln.base + chunks, ln.op + 1
                skip_idle(ln)
        return True, None

    while True:
        actions = []
        for rk in ranks:
            for ln in rk.lanes:
                if not ln.done:
                    actions.append(("lane", (rk, ln)))
                if ln.ring:
                    actions.append(("proxy", (rk, ln)))
        for key, q in channels.items():
            if q:
                actions.append(("deliver", key))
        rng.shuffle(actions)
        moved = False
        for kind, who in actions:
            if kind == "lane":
                ok, violation = lane_step(*who)
                if violation:
                    return violation
                if not ok:
                    continue
            elif kind == "proxy":
                rk, ln = who
                what, dst, slot, dst_slot, us, expect, value = ln.ring.pop(0)
                payload = {}
                for u in us:
                    payload[u] = rk.outbox.get(slot + (u,))
                    if payload[u] != expect:
                        return "rank %d lane %d's proxy sent outbox unit %s holding %s for %s" % (
                            rk.me, ln.index, slot + (u,), payload[u], expect)
                channels[(ln.index, rk.me, dst)].append((what, dst_slot, payload, value))
            else:
                lane, s, d = who
                what, dst_slot, payload, value = channels[who].pop(0)
                ln = ranks[d].lanes[lane]
                if what == "write":
                    for u, content in payload.items():
                        ranks[d].inbox[dst_slot + (u,)] = content
                    ln.recv[s] = max(ln.recv[s], value)
                else:
                    ln.credit[s] = max(ln.credit[s], value)
            moved = True
            break
        if not moved:
            if all(ln.done for rk in ranks for ln in rk.lanes):
                return None  # nothing left to deliver either: a delivery would have moved
            return "deadlock: " + ", ".join(
                "rank %d lane %d op %d iteration %d step %d" % (rk.me, ln.index, ln.op, ln.i, ln.step)
                for rk in ranks for ln in rk.lanes if not ln.done)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-chunk0-credit", action="store_true")
    ap.add_argument("--regions-per-chunk", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--depth", type=int, default=0, help="slots per host in each box (0: random 1..3)")
    ap.add_argument("--lanes", type=int, default=0, help="lanes per rank (0: random 1..3)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    configs = 300 if args.quick else 5000
    for i in range(configs):
        hosts = rng.randint(2, 4)
        depth = args.depth or rng.randint(1, 3)
        lanes = args.lanes or rng.randint(1, 3)
        k = rng.randint(lanes, 4)  # units per slot
        ops = make_ops(rng, hosts, rng.randint(1, 6), k)
        for _ in range(3):  # schedules per configuration
            err = run(hosts, ops, rng, depth, lanes, k, not args.no_chunk0_credit, args.regions_per_chunk)
            if err:
                desc = " ".join(m for m, _ in ops)
                print("configuration %d (%d hosts, depth %d, %d lanes, %d units per slot: %s): %s" % (
                    i, hosts, depth, lanes, k, desc, err))
                return 1
    print("%d configurations x 3 schedules: no violation, no deadlock" % configs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
