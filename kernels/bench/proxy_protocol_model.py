#!/usr/bin/env python3
"""A model of the proxy collectives' chunk protocol (kernels/proxy.h, launch_proxy_collective),
checked under random scheduling. Usage: proxy_protocol_model.py [--quick] [--no-chunk0-credit] [--depth D]

What is modelled: H ranks (one per host) run the same random sequence of ops back to back, with
no host synchronisation between them: allReduce and allGather stage one outbox slot that goes to
every peer, reduceScatter and allToAll one slot per peer; some blocks are empty in some chunks
(no payload, the signal still goes). Op k's chunk c is the link's chunk g = base_k + c, base_k
the chunks of the ops before it, and uses signal value g + 1 and slot g % D of each box (D, the
depth: slots per host in the outbox and in the inbox). A rank's kernel is a software pipeline
that sends chunk i and then receives chunk i - (D - 1), for i = 0 .. chunks + D - 2:
  send i (i < chunks; g = base + i):
  1. waits until every peer's credit word >= g + 1 - D (the peer consumed this rank's chunk
     g - D, of this op or of an op before: slot g % D is free in both boxes),
  2. stages its chunk(s) in outbox slot g % D,
  3. posts one write per peer (that outbox slot -> the peer's inbox slot (g % D, this rank),
     then the peer's receive word for this rank := g + 1) into its ring;
  receive j = i - (D - 1) (0 <= j < chunks; g = base + j):
  4. waits until every peer's receive word >= g + 1,
  5. reads every non-empty inbox slot (g % D, peer),
  6. posts a signal-only write per peer (the peer's credit word for this rank := g + 1).
With D = 1 this is the unpipelined protocol (send c, then receive c).
Each rank's proxy takes its ring's commands in order and reads the write's source (the outbox
slot) when it takes the command, as the socket transport does; each (source, destination) pair
is one ordered connection that lands the payload before the signal word.
Checked: (a) when a proxy reads an outbox slot it holds the chunk the command was posted for
(the kernel did not restage it too early); (b) when a kernel reads an inbox slot it holds the
chunk it waits for (no later chunk overwrote it, no stale one is read); (c) every rank finishes
(no deadlock). --no-chunk0-credit models the bug fixed on 2026-11-24 (the first chunk of an op did not
wait for the credits of the previous op's chunks): the model must then find a violation.
Not modelled: timeouts and abort, ring capacity (the kernel waits for a free slot; the proxy
always drains), data values (a slot's content is the (op, chunk, source, destination) it carries).
"""
import argparse
import random
import sys

AR, AG, RS, A2A = "allReduce", "allGather", "reduceScatter", "allToAll"


def make_ops(rng, hosts, n_ops):
    """The op sequence every rank runs: (mode, chunks, empty), empty[(src, dst, c)] = no payload."""
    ops = []
    for _ in range(n_ops):
        mode = rng.choice([AR, AG, RS, A2A])
        chunks = rng.randint(1, 4)
        empty = set()
        for c in range(chunks):
            for s in range(hosts):
                for d in range(hosts):
                    # allReduce's blocks all have the op's count: only the last chunk may be short,
                    # never empty. The others' blocks differ by host.
                    if mode != AR and s != d and rng.random() < 0.2:
                        empty.add((s, d, c))
        ops.append((mode, chunks, empty))
    return ops


class Rank:
    def __init__(self, me, hosts, ops, depth):
        self.me, self.hosts, self.ops, self.depth = me, hosts, ops, depth
        self.op = 0          # current op
        self.i = 0           # current pipeline iteration of the op
        self.step = 1        # next step (1..6) of the iteration
        self.base = 0        # value base of the current op
        self.outbox = {}     # (slot, peer or 0) -> content
        self.inbox = {}      # (slot, source) -> content
        self.recv = [0] * hosts    # receive words, by source
        self.credit = [0] * hosts  # credit words, by source
        self.ring = []       # posted commands, in order
        self.done = False

    def peers(self):
        return [p for p in range(self.hosts) if p != self.me]


def run(hosts, ops, rng, chunk0_credit, depth):
    ranks = [Rank(r, hosts, ops, depth) for r in range(hosts)]
    channels = {(s, d): [] for s in range(hosts) for d in range(hosts) if s != d}

    def kernel_step(rk):
        """Advances rank rk's kernel by one step if it can; returns (moved, violation)."""
        mode, chunks, empty = ops[rk.op]
        i, base, scatter, D = rk.i, rk.base, mode in (RS, A2A), rk.depth
        sending, j = i < chunks, i - (D - 1)
        receiving = 0 <= j < chunks
        if rk.step <= 3 and sending:
            c, g = i, base + i
            if rk.step == 1:
                if (c >= D or chunk0_credit) and any(rk.credit[p] < g + 1 - D for p in rk.peers()):
                    return False, None
            elif rk.step == 2:
                for p in rk.peers():
                    rk.outbox[(g % D, p if scatter else 0)] = (rk.op, c, rk.me, p if scatter else None)
            else:
                for p in rk.peers():
                    rk.ring.append(("write", p, (g % D, p if scatter else 0), (g % D, rk.me),
                                    (rk.op, c, rk.me, p if scatter else None), (rk.me, p, c) in empty, g + 1))
        elif rk.step >= 4 and receiving:
            c, g = j, base + j
            if rk.step == 4:
                if any(rk.recv[p] < g + 1 for p in rk.peers()):
                    return False, None
            elif rk.step == 5:
                for s in rk.peers():
                    if (s, rk.me, c) in empty:
                        continue
                    want = (rk.op, c, s, rk.me if scatter else None)
                    if rk.inbox.get((g % D, s)) != want:
                        return True, "rank %d read inbox slot %s as %s, expected %s" % (
                            rk.me, (g % D, s), rk.inbox.get((g % D, s)), want)
            else:
                for p in rk.peers():
                    rk.ring.append(("credit", p, None, None, None, True, g + 1))
        rk.step += 1
        if rk.step == 7:
            rk.step, rk.i = 1, rk.i + 1
            if rk.i == chunks + D - 1:
                rk.i, rk.base, rk.op = 0, rk.base + chunks, rk.op + 1
                rk.done = rk.op == len(ops)
        return True, None

    while True:
        actions = []
        for rk in ranks:
            if not rk.done:
                actions.append(("kernel", rk))
            if rk.ring:
                actions.append(("proxy", rk))
        for key, q in channels.items():
            if q:
                actions.append(("deliver", key))
        rng.shuffle(actions)
        moved = False
        for kind, who in actions:
            if kind == "kernel":
                ok, violation = kernel_step(who)
                if violation:
                    return violation
                if not ok:
                    continue
            elif kind == "proxy":
                what, dst, slot, dst_slot, expect, no_payload, value = who.ring.pop(0)
                payload = None
                if what == "write" and not no_payload:
                    payload = who.outbox.get(slot)
                    if payload != expect:
                        return "rank %d's proxy sent outbox slot %s holding %s for %s" % (who.me, slot, payload, expect)
                channels[(who.me, dst)].append((what, dst_slot, payload, value))
            else:
                s, d = who
                what, dst_slot, payload, value = channels[who].pop(0)
                if what == "write":
                    if payload is not None:
                        ranks[d].inbox[dst_slot] = payload
                    ranks[d].recv[s] = max(ranks[d].recv[s], value)
                else:
                    ranks[d].credit[s] = max(ranks[d].credit[s], value)
            moved = True
            break
        if not moved:
            if all(rk.done for rk in ranks):
                return None  # nothing left to deliver either: a delivery would have moved
            return "deadlock: " + ", ".join("rank %d op %d iteration %d step %d" % (rk.me, rk.op, rk.i, rk.step)
                                            for rk in ranks if not rk.done)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-chunk0-credit", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--depth", type=int, default=0, help="slots per host in each box (0: random 1..3)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    configs = 300 if args.quick else 5000
    for i in range(configs):
        hosts = rng.randint(2, 4)
        depth = args.depth or rng.randint(1, 3)
        ops = make_ops(rng, hosts, rng.randint(1, 6))
        for _ in range(3):  # schedules per configuration
            err = run(hosts, ops, rng, not args.no_chunk0_credit, depth)
            if err:
                desc = " ".join("%s x%d" % (m, n) for m, n, _ in ops)
                print("configuration %d (%d hosts, depth %d: %s): %s" % (i, hosts, depth, desc, err))
                return 1
    print("%d configurations x 3 schedules: no violation, no deadlock" % configs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
