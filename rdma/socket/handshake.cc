// The socket handshake's messages and checks (handshake.h), without sockets.
#include "handshake.h"

#include <cstring>

#include "fusedcomm/rdma/transport.h"

namespace fusedcomm::rdma::socket_backend::handshake {
namespace {

wire::WireHandshake message(uint32_t kind, uint64_t comm_id, int rank, int world, int target) {
  wire::WireHandshake m{};
  m.magic = wire::kHelloMagic;
  m.version = kTransportApiVersion;
  m.kind = kind;
  m.comm_id = comm_id;
  m.rank = rank;
  m.world = world;
  m.target_rank = target;
  return m;
}

Check ok() { return {}; }
Check drop() { return {Verdict::kDrop, wire::kNoReason, {}}; }
Check reject_with(uint32_t reason) { return {Verdict::kReject, reason, wire::reject_text(reason)}; }
Check retry(std::string why) { return {Verdict::kRetry, wire::kNoReason, std::move(why)}; }
Check fail(uint32_t reason, std::string why) { return {Verdict::kFail, reason, std::move(why)}; }

// Whether `m` names the group of `side` as seen from a peer of rank `from` addressing us.
bool for_group(const wire::WireHandshake& m, int from, const Side& side) {
  return m.version == kTransportApiVersion && m.comm_id == side.comm_id && m.rank == from &&
         m.world == side.world && m.target_rank == side.rank;
}

// An acceptor's answer to the dialer: kOk when it is a `kind` message of the dialer's group from
// `target`; a kReject is kRetry (kNotReady) or kFail; anything else kRetry.
Check check_answer(const wire::WireHandshake& reply, uint32_t kind, int target, const Side& dialer) {
  if (reply.magic != wire::kHelloMagic)
    return retry("answered with something that is not a fusedcomm handshake");
  if (reply.kind == wire::kReject) {
    if (reply.reason == wire::kNotReady) return retry(wire::reject_text(wire::kNotReady));
    return fail(reply.reason, std::string("rejected the handshake: ") + wire::reject_text(reply.reason));
  }
  if (reply.kind != kind || !for_group(reply, target, dialer)) {
    return retry("answered the handshake for a different group");
  }
  return ok();
}

}  // namespace

bool parse(const void* bytes, size_t n, wire::WireHandshake* m) {
  if (n != sizeof(wire::WireHandshake)) return false;
  std::memcpy(m, bytes, n);
  return true;
}

auth::Transcript transcript(const wire::WireHandshake& hello, const wire::WireHandshake& challenge,
                            const std::vector<std::string>& addresses) {
  auth::Transcript t;
  t.version = kTransportApiVersion;
  t.group_id = hello.comm_id;
  t.world = hello.world;
  t.dialer = hello.rank;
  t.acceptor = hello.target_rank;
  t.dialer_address = addresses.at(static_cast<size_t>(hello.rank));
  t.acceptor_address = addresses.at(static_cast<size_t>(hello.target_rank));
  std::memcpy(t.dialer_nonce.data(), hello.nonce, sizeof hello.nonce);
  std::memcpy(t.acceptor_nonce.data(), challenge.nonce, sizeof challenge.nonce);
  return t;
}

// ---- acceptor --------------------------------------------------------------------------------

Check check_hello(const wire::WireHandshake& m) {
  if (m.magic != wire::kHelloMagic || m.kind != wire::kHello) return drop();
  if (m.version != kTransportApiVersion) return reject_with(wire::kBadVersion);
  if (m.world < 2 || m.target_rank < 0 || m.rank <= m.target_rank || m.rank >= m.world) {
    return reject_with(wire::kBadRank);
  }
  return ok();
}

Check check_hello_for(const wire::WireHandshake& hello, const Side& acceptor) {
  if (hello.world != acceptor.world) return reject_with(wire::kBadWorld);
  if (hello.target_rank != acceptor.rank || hello.rank <= acceptor.rank || hello.rank >= acceptor.world) {
    return reject_with(wire::kBadRank);
  }
  return ok();
}

wire::WireHandshake challenge(const wire::WireHandshake& hello, const Side& acceptor, const auth::Nonce& na) {
  wire::WireHandshake m =
      message(wire::kChallenge, acceptor.comm_id, acceptor.rank, acceptor.world, hello.rank);
  std::memcpy(m.nonce, na.data(), na.size());
  const auth::Digest mac =
      auth::proof(*acceptor.key, auth::Role::kAcceptor, transcript(hello, m, *acceptor.addresses));
  std::memcpy(m.mac, mac.data(), mac.size());
  return m;
}

Check check_proof(const wire::WireHandshake& proof, const wire::WireHandshake& hello,
                  const wire::WireHandshake& sent, const Side& acceptor) {
  if (proof.magic != wire::kHelloMagic || proof.kind != wire::kProof) return drop();
  if (!for_group(proof, hello.rank, acceptor) ||
      !auth::check_proof(*acceptor.key, auth::Role::kDialer, transcript(hello, sent, *acceptor.addresses),
                         proof.mac)) {
    return reject_with(wire::kBadAuth);
  }
  return ok();
}

wire::WireHandshake accept(const wire::WireHandshake& hello, const Side& acceptor) {
  return message(wire::kAccept, acceptor.comm_id, acceptor.rank, acceptor.world, hello.rank);
}

wire::WireHandshake reject(const wire::WireHandshake& to, int rank, uint32_t reason) {
  wire::WireHandshake m = message(wire::kReject, to.comm_id, rank, to.world, to.rank);
  m.reason = reason;
  return m;
}

// ---- dialer ----------------------------------------------------------------------------------

wire::WireHandshake hello(const Side& dialer, int target, const auth::Nonce& nd) {
  wire::WireHandshake m = message(wire::kHello, dialer.comm_id, dialer.rank, dialer.world, target);
  std::memcpy(m.nonce, nd.data(), nd.size());
  return m;
}

Check check_challenge(const wire::WireHandshake& reply, const wire::WireHandshake& sent, int target,
                      const Side& dialer) {
  const Check answer = check_answer(reply, wire::kChallenge, target, dialer);
  if (answer.verdict != Verdict::kOk) return answer;
  if (!auth::check_proof(*dialer.key, auth::Role::kAcceptor, transcript(sent, reply, *dialer.addresses),
                         reply.mac)) {
    return fail(wire::kBadAuth, std::string("failed the handshake: ") + wire::reject_text(wire::kBadAuth));
  }
  return ok();
}

wire::WireHandshake proof(const wire::WireHandshake& sent, const wire::WireHandshake& challenge,
                          const Side& dialer) {
  wire::WireHandshake m = message(wire::kProof, dialer.comm_id, dialer.rank, dialer.world, sent.target_rank);
  const auth::Digest mac =
      auth::proof(*dialer.key, auth::Role::kDialer, transcript(sent, challenge, *dialer.addresses));
  std::memcpy(m.mac, mac.data(), mac.size());
  return m;
}

Check check_accept(const wire::WireHandshake& reply, int target, const Side& dialer) {
  return check_answer(reply, wire::kAccept, target, dialer);
}

}  // namespace fusedcomm::rdma::socket_backend::handshake
