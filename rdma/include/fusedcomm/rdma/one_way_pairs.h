// A peer group in which every ordered pair of ranks (r, p) has a connection of its own for r's
// writes to p: two groups of the same members over one transport, `up` carrying the writes to
// higher ranks and `down` the writes to lower ones (each connection then carries data one way;
// the other way only its close handshake).
//
// Why: with the socket transport a group has one TCP connection per pair, and Linux copies a
// socket's sends and receives under the same lock, so traffic both ways on a pair shares one
// connection's copy rate: 2.8-3.0 GB/s each way on the H100 host's loopback, against 3.9-4.2
// with a connection per direction (the transport bench's loopback_duplex). The GPU proxy's
// collectives send both ways at once, so the cuda backend's link between hosts (inter_host.h)
// connects its counterparts this way.
//
// Ordering: every write from r to p travels on one connection, so writes between a pair land in
// the order r posted them, each payload before its signal, as with one group.
#pragma once

#include <memory>

#include "fusedcomm/rdma/transport.h"

namespace fusedcomm::rdma {

// Connects both groups (every member calls it with the same spec, its own rank); the second
// group's id is derived from spec.comm_id. Each connect is bounded by spec.connect_timeout;
// throws as Transport::connect does (after aborting the first group if the second fails).
// close() closes both (within its timeout in all), abort() aborts both; status(p) and a write's
// failure are those of the group that carries this rank's writes to p.
std::unique_ptr<PeerGroup> connect_one_way_pairs(Transport& transport, const GroupSpec& spec);

}  // namespace fusedcomm::rdma
