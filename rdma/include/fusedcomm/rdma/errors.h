// Errors thrown by the transport layer. The runtime's JNI boundary maps them to
// io.fusedcomm.errors.TransportException (and CommTimeoutException for ConnectTimeout).
#pragma once

#include <stdexcept>
#include <string>

namespace fusedcomm::rdma {

// A peer connection failed, closed, or sent something that breaks the protocol.
// `peer` is the peer's rank in the group, or -1 when no single peer is at fault.
class TransportError : public std::runtime_error {
 public:
  TransportError(int peer, const std::string& what) : std::runtime_error(what), peer_(peer) {}
  int peer() const noexcept { return peer_; }

 private:
  int peer_;
};

// Building the connection mesh did not finish within the connect timeout.
class ConnectTimeout : public TransportError {
 public:
  using TransportError::TransportError;
};

}  // namespace fusedcomm::rdma
