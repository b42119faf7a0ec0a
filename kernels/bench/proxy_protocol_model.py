#!/usr/bin/env python3
"""A model of the proxy collectives' chunk protocol (kernels/proxy.h, launch_proxy_collective),
checked under random scheduling. Usage: proxy_protocol_model.py [--quick] [--no-chunk0-credit]

What is modelled: H ranks (one per host) run the same random sequence of ops back to back, with
no host synchronisation between them: allReduce and allGather stage one outbox slot that goes to
every peer, reduceScatter and allToAll one slot per peer; some blocks are empty in some chunks
(no payload, the signal still goes). Op k's chunk c uses signal value base_k + c + 1, base_k the
chunks of the ops before it. Per chunk a rank's kernel
  1. waits until every peer's credit word >= base + c (the peer consumed this rank's previous
     chunk, of this op or of the op before),
  2. stages its chunk(s) in the outbox,
  3. posts one write per peer (outbox slot -> the peer's inbox slot for this rank, then the
     peer's receive word for this rank := base + c + 1) into its ring,
  4. waits until every peer's receive word >= base + c + 1,
  5. reads every non-empty inbox slot,
  6. posts a signal-only write per peer (the peer's credit word for this rank := base + c + 1).
Each rank's proxy takes its ring's commands in order and reads the write's source (the outbox
slot) when it takes the command, as the socket transport does; each (source, destination) pair
is one ordered connection that lands the payload before the signal word.
Checked: (a) when a proxy reads an outbox slot it holds the chunk the command was posted for
(the kernel did not restage it too early); (b) when a kernel reads an inbox slot it holds the
chunk it waits for (no later chunk overwrote it, no stale one is read); (c) every rank finishes
(no deadlock). --no-chunk0-credit models the bug fixed on 2026-11-24 (chunk 0 of an op did not
wait for the credits of the previous op's last chunk): the model must then find a violation.
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
    def __init__(self, me, hosts, ops):
        self.me, self.hosts, self.ops = me, hosts, ops
        self.op = 0          # current op
        self.c = 0           # current chunk
        self.step = 1        # next step (1..6) of the chunk
        self.base = 0        # value base of the current op
        self.outbox = {}     # slot -> content
        self.inbox = {}      # source -> content
        self.recv = [0] * hosts    # receive words, by source
        self.credit = [0] * hosts  # credit words, by source
        self.ring = []       # posted commands, in order
        self.done = False

    def peers(self):
        return [p for p in range(self.hosts) if p != self.me]


def run(hosts, ops, rng, chunk0_credit):
    ranks = [Rank(r, hosts, ops) for r in range(hosts)]
    channels = {(s, d): [] for s in range(hosts) for d in range(hosts) if s != d}

    def kernel_step(rk):
        """Advances rank rk's kernel by one step if it can; returns (moved, violation)."""
        mode, chunks, empty = ops[rk.op]
        c, base, scatter = rk.c, rk.base, mode in (RS, A2A)
        if rk.step == 1:
            if (c > 0 or chunk0_credit) and any(rk.credit[p] < base + c for p in rk.peers()):
                return False, None
        elif rk.step == 2:
            for p in rk.peers():
                rk.outbox[p if scatter else 0] = (rk.op, c, rk.me, p if scatter else None)
        elif rk.step == 3:
            for p in rk.peers():
                rk.ring.append(("write", p, p if scatter else 0, (rk.op, c, rk.me, p if scatter else None),
                                (rk.me, p, c) in empty, base + c + 1))
        elif rk.step == 4:
            if any(rk.recv[p] < base + c + 1 for p in rk.peers()):
                return False, None
        elif rk.step == 5:
            for s in rk.peers():
                if (s, rk.me, c) in empty:
                    continue
                want = (rk.op, c, s, rk.me if scatter else None)
                if rk.inbox.get(s) != want:
                    return True, "rank %d read inbox slot %d as %s, expected %s" % (rk.me, s, rk.inbox.get(s), want)
        elif rk.step == 6:
            for p in rk.peers():
                rk.ring.append(("credit", p, None, None, True, base + c + 1))
        rk.step += 1
        if rk.step == 7:
            rk.step, rk.c = 1, rk.c + 1
            if rk.c == chunks:
                rk.c, rk.base, rk.op = 0, rk.base + chunks, rk.op + 1
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
                what, dst, slot, expect, no_payload, value = who.ring.pop(0)
                payload = None
                if what == "write" and not no_payload:
                    payload = who.outbox.get(slot)
                    if payload != expect:
                        return "rank %d's proxy sent outbox slot %d holding %s for %s" % (who.me, slot, payload, expect)
                channels[(who.me, dst)].append((what, payload, value))
            else:
                s, d = who
                what, payload, value = channels[who].pop(0)
                if what == "write":
                    if payload is not None:
                        ranks[d].inbox[s] = payload
                    ranks[d].recv[s] = max(ranks[d].recv[s], value)
                else:
                    ranks[d].credit[s] = max(ranks[d].credit[s], value)
            moved = True
            break
        if not moved:
            if all(rk.done for rk in ranks):
                return None  # nothing left to deliver either: a delivery would have moved
            return "deadlock: " + ", ".join("rank %d op %d chunk %d step %d" % (rk.me, rk.op, rk.c, rk.step)
                                            for rk in ranks if not rk.done)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-chunk0-credit", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    configs = 300 if args.quick else 5000
    for i in range(configs):
        hosts = rng.randint(2, 4)
        ops = make_ops(rng, hosts, rng.randint(1, 6))
        for _ in range(3):  # schedules per configuration
            err = run(hosts, ops, rng, not args.no_chunk0_credit)
            if err:
                desc = " ".join("%s x%d" % (m, n) for m, n, _ in ops)
                print("configuration %d (%d hosts: %s): %s" % (i, hosts, desc, err))
                return 1
    print("%d configurations x 3 schedules: no violation, no deadlock" % configs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
