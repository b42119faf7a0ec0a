// The socket handshake's messages (wire.h) as pure functions: what each side sends and the
// checks of what it receives. No sockets and no state beyond the arguments: the listener (the
// acceptor's half) and connect.cc (the dialer's half) call them, and the fuzzer
// (rdma/tests/handshake_fuzz_test) feeds them arbitrary bytes. The proofs are auth.h's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fusedcomm/rdma/auth.h"
#include "wire.h"

namespace fusedcomm::rdma::socket_backend::handshake {

// What one side knows of its group, fixed once connect() started. The pointers outlive it.
struct Side {
  const auth::Key* key = nullptr;
  uint64_t comm_id = 0;
  int rank = 0;
  int world = 1;
  const std::vector<std::string>* addresses = nullptr;  // by rank, as published in the bootstrap
};

// What the receiving side does with a message.
//   kOk      go on
//   kDrop    not a fusedcomm handshake (or not for us): close without a reply
//   kReject  close after a kReject carrying `reason`
//   kRetry   (dialer) close and dial again later; `why` says what happened
//   kFail    (dialer) give up on the group: throw `why`, naming the peer
enum class Verdict { kOk, kDrop, kReject, kRetry, kFail };
struct Check {
  Verdict verdict = Verdict::kOk;
  uint32_t reason = wire::kNoReason;
  std::string why;
};

// Copies exactly sizeof(WireHandshake) bytes into *m; false for any other length.
bool parse(const void* bytes, size_t n, wire::WireHandshake* m);

// ---- acceptor --------------------------------------------------------------------------------
// A first message, before its group is known: kOk, kDrop (wrong magic or kind), or kReject
// (kBadVersion; kBadRank when the ranks or world cannot be a group's).
Check check_hello(const wire::WireHandshake& m);
// A hello that check_hello passed, against the acceptor's group: world, target rank, and a
// dialer rank above the acceptor's. kOk or kReject.
Check check_hello_for(const wire::WireHandshake& hello, const Side& acceptor);
// The challenge answering `hello` (which check_hello_for passed), with the acceptor's nonce.
wire::WireHandshake challenge(const wire::WireHandshake& hello, const Side& acceptor, const auth::Nonce& na);
// The dialer's third message: kOk only for a kProof whose proof verifies against the
// transcript of `hello` and `sent` (our challenge); a kReject from the dialer, or anything else,
// is kDrop; a wrong proof is kReject(kBadAuth).
Check check_proof(const wire::WireHandshake& proof, const wire::WireHandshake& hello,
                  const wire::WireHandshake& sent, const Side& acceptor);
wire::WireHandshake accept(const wire::WireHandshake& hello, const Side& acceptor);
// A kReject answering `to` (a received message, possibly unchecked), from `rank` (-1: unknown).
wire::WireHandshake reject(const wire::WireHandshake& to, int rank, uint32_t reason);

// ---- dialer ----------------------------------------------------------------------------------
wire::WireHandshake hello(const Side& dialer, int target, const auth::Nonce& nd);
// The acceptor's answer to `sent` (our hello): kOk for a challenge of our group whose proof
// verifies; kRetry for kReject(kNotReady) or an answer that is not for this group; kFail for
// any other kReject, and for a wrong proof (reason kBadAuth: tell the acceptor before closing).
Check check_challenge(const wire::WireHandshake& reply, const wire::WireHandshake& sent, int target,
                      const Side& dialer);
// Our proof for the transcript of `sent` (our hello) and `challenge`.
wire::WireHandshake proof(const wire::WireHandshake& sent, const wire::WireHandshake& challenge,
                          const Side& dialer);
// The acceptor's last message: kOk for its kAccept, kRetry for kReject(kNotReady) or an answer
// that is not for this group, kFail for any other kReject.
Check check_accept(const wire::WireHandshake& reply, int target, const Side& dialer);

// The transcript both proofs cover (auth.h), from a hello and its challenge. The ranks must be
// in [0, world) of `addresses` (check_hello_for, check_challenge ensure it).
auth::Transcript transcript(const wire::WireHandshake& hello, const wire::WireHandshake& challenge,
                            const std::vector<std::string>& addresses);

}  // namespace fusedcomm::rdma::socket_backend::handshake
