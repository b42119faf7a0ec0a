// Wire format of the libfabric backend (private to rdma/libfabric/): the control messages that
// travel as libfabric messages (fi_send) on a reliable-datagram endpoint, and the remote CQ data
// that a payload write carries.
//
// Peers and their first messages
//   A transport has one endpoint per rail; its address() names them. A group only ever sends to
//   the addresses of GroupSpec::addresses (inserted into the rail's address vector at connect)
//   and authenticates each pair with the socket backend's handshake messages
//   (../socket/handshake.h, wire::WireHandshake: hello, challenge, proof, accept or reject; the
//   proofs are auth.h's), each carried in a kHandshake message. The higher rank dials. An
//   endpoint accepts messages from anyone, so a handshake message also names the exchange it
//   belongs to (the dialer's nonce Nd, and the acceptor's Na once sent): a reply is matched to
//   its dial by them, and a reply to anything else is dropped. Replies go to the claimed rank's
//   published address, never to the sender of a message.
//   Once the proofs check, both sides derive the pair's session tag
//     session = HMAC-SHA-256(K, "fusedcomm libfabric session v1" || Nd || Na)[0, 8)
//   which every later message of the pair carries; a message without the right tag is dropped.
//   So a stranger that knows an endpoint's address but not the key can neither join a group nor
//   speak for a rank (as with the socket backend, someone who reads the network can; see
//   docs/deploying.md#security).
//
// Data (after the handshake)
//   Payloads are RMA writes into the peer's registered region. A writer learns where a region
//   lives (address, remote key, bytes) from the peer itself: kQuery, answered by kRegion (the
//   peer checks the first write against its registry, as the socket backend's receiver checks
//   every header). Region keys and remote keys therefore reach authenticated peers only.
//   Signals are kSignal messages applied by the receiver (max(old, value), release). Two ways
//   to order a signal after its payload and after every earlier write of the pair, chosen per
//   transport (describe() says which):
//   - remote CQ data (providers with FI_REMOTE_CQ_DATA): every op of a pair (a payload write, a
//     signal, or both) has a sequence number. A payload write is fi_writedata with
//     encode_cq_data(stream, has_signal, seq); its completion at the receiver says the bytes are
//     placed. The receiver applies the signal of op s once op s and every op before it have
//     arrived (payload and message), so delivery may be unordered (EFA) and signals still
//     follow their data. kAck returns how far ops have arrived; a writer keeps at most
//     kSeqWindow ops beyond it, so a sequence number truncated to the CQ data's bits is never
//     ambiguous. A write whose signal word has one writer that only raises it
//     (WriteOp::signal_sole_writer) carries the word instead, as its last piece's second iov,
//     where the provider places an op's bytes and a pair's ops in order (tcp; Caps::ordered_iovs)
//     and the write is one part: the word lands after the payload (a reader may see its low
//     bytes change first, never a value above the new one), and no kSignal follows (its CQ
//     data says none).
//   - messages: the write is posted with FI_DELIVERY_COMPLETE and the signal message is sent
//     only after the write completed (the bytes are placed); signals are max, so messages may
//     arrive in any order.
//   kBye ends a pair politely and says how much was sent (ops, signal messages, bytes), so that
//   the receiver's close waits until everything sent before it has arrived. kAbort says the
//   sender aborted the group (the receiver marks it failed, as an EOF without kBye on a
//   socket). kHeartbeat keeps a pair alive: a peer silent for LibfabricOptions::peer_timeout is
//   failed (a killed process sends nothing more, and a datagram endpoint has no connection to
//   break).
//
// Integers are in host byte order: all ranks of a job run on one architecture.
#pragma once

#include <cstdint>

#include "../socket/wire.h"

namespace fusedcomm::rdma::libfabric::wire {

inline constexpr uint64_t kMsgMagic = 0x31494f464d434346ull;  // "FCCMFOI1"

enum MsgKind : uint32_t {
  kHandshake = 1,  // hs: a socket handshake message; stream: the sender's stream id for the peer
  kSignal = 2,     // w: seq (0 in message mode), key, offset, value, bytes sent through this op
  kQuery = 3,      // w: request id, dst key, dst offset, bytes, signal key, signal offset
  kRegion = 4,     // w: request id, key, remote address, remote key, region bytes; flags: found
  kViolation = 5,  // w as kQuery: a write the writer refused by the region's bounds
  kRefused = 6,    // flags: RefusedWhat; the receiver refused a write or signal of ours
  kAck = 7,        // w[0]: every op up to this sequence number has arrived
  kHeartbeat = 8,  // w[0]: as kAck
  kBye = 9,        // w: ops sent (last seq), signal messages sent, bytes sent
  kAbort = 10,     // the sender aborted the group
};

// kSignal flags
inline constexpr uint32_t kHasPayload = 1;  // remote CQ data mode: the op also has a payload write

// kRefused flags: what was refused (the writer's error message says it).
enum RefusedWhat : uint32_t { kRefusedWrite = 1, kRefusedSignal = 2 };

struct alignas(8) Msg {
  uint64_t magic;    // kMsgMagic
  uint32_t kind;     // MsgKind
  uint32_t flags;    // kind-specific
  uint64_t comm_id;  // GroupSpec::comm_id
  int32_t rank;      // sender's rank in the group
  int32_t target;    // receiver's rank
  uint64_t session;  // after the handshake: the pair's session tag; 0 in kHandshake
  uint32_t stream;   // kHandshake: the sender's stream id for the receiver's payload writes
  uint32_t pad;      // 0
  uint64_t w[6];     // kind-specific words (MsgKind)
  uint8_t dialer_nonce[auth::kNonceBytes];    // kHandshake: Nd of the exchange
  uint8_t acceptor_nonce[auth::kNonceBytes];  // kHandshake: Na, once the acceptor sent it
  rdma::wire::WireHandshake hs;               // kHandshake: the handshake message
};
static_assert(sizeof(Msg) == 264);

// Remote CQ data of a payload write: the receiver's stream id for the pair, whether a kSignal
// of the same op follows, and the op's sequence number truncated to the rest of the bits.
struct CqDataLayout {
  int stream_bits = 16;
  int seq_bits = 47;  // total = stream_bits + 1 + seq_bits = the provider's cq_data_size * 8

  static CqDataLayout for_bytes(size_t cq_data_bytes) {
    if (cq_data_bytes >= 8) return {16, 47};
    return {12, 19};  // 4 bytes (EFA, verbs): 4095 streams
  }
  uint32_t max_stream() const { return (1u << stream_bits) - 1; }
  uint64_t seq_mask() const { return (uint64_t{1} << seq_bits) - 1; }
  uint64_t encode(uint32_t stream, bool has_signal, uint64_t seq) const {
    return (uint64_t{stream} << (seq_bits + 1)) | (uint64_t{has_signal} << seq_bits) | (seq & seq_mask());
  }
  uint32_t stream_of(uint64_t data) const {
    return static_cast<uint32_t>((data >> (seq_bits + 1)) & max_stream());
  }
  bool has_signal(uint64_t data) const { return (data >> seq_bits) & 1; }
  // The full sequence number of a truncated one, given the next op the receiver expects:
  // the first value >= `next` with those low bits (ops arrive at most a window ahead).
  uint64_t seq_of(uint64_t data, uint64_t next) const {
    return next + (((data & seq_mask()) - next) & seq_mask());
  }
  // How many ops a writer may have beyond the receiver's last kAck.
  uint64_t window() const {
    const uint64_t quarter = uint64_t{1} << (seq_bits - 2);
    return quarter < 65536 ? quarter : 65536;
  }
};

}  // namespace fusedcomm::rdma::libfabric::wire
