// The one data-movement primitive the host backend's ops are written against: every rank sends
// a block to every rank (itself included) and receives one from each, sizes agreed pairwise.
// The runtime implements it over the transport + proxy (transport_exchanger.h); tests
// implement it in-process with threads (tests/support/thread_exchanger.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fusedcomm {

struct SendBlock {
  const void* data = nullptr;
  uint64_t bytes = 0;
};
struct RecvBlock {
  void* data = nullptr;
  uint64_t bytes = 0;
};

class Exchanger {
 public:
  virtual ~Exchanger() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // send.size() == recv.size() == world(). send[p] goes to rank p; recv[p] comes from rank p.
  // Sizes must agree pairwise: send[p].bytes on rank r == recv[r].bytes on rank p; a mismatch
  // is detected and reported as a CommunicatorException on both sides. Blocks until every
  // block is delivered, bounded by the communicator's timeout; `step` names the phase
  // ("allReduce/reduce-scatter") in error messages. Buffers may be reused once it returns.
  virtual void exchange(const std::vector<SendBlock>& send, const std::vector<RecvBlock>& recv,
                        const char* step) = 0;
};

}  // namespace fusedcomm
