// The proxy ring's memory layout (proxy.h has the protocol): plain structs without pointers,
// shared by the host side (proxy.h) and the GPU producers (kernels/proxy/), which map the
// same host memory into the device's address space.
#pragma once

#include <cstdint>

namespace fusedcomm::rdma {

enum class ProxyOp : uint32_t {
  kWrite = 1,  // WriteOp fields
};

struct alignas(64) RingHeader {
  uint64_t reserved;   // producers' next slot (atomic fetch-add)
  uint64_t pad0[7];    // the producers' word alone on its cache line
  uint64_t consumed;   // consumer: slots below this are free again
  uint64_t completed;  // consumer: commands below this were handed to the transport
  uint64_t abort;      // nonzero: producers and consumer stop (set by the host on abort)
  uint64_t pad1[5];    // to 128 bytes
};
static_assert(sizeof(RingHeader) == 128);

struct alignas(128) ProxyCommand {
  uint64_t seq;            // slot + 1 once the command is complete (release-published last)
  uint32_t op;             // ProxyOp
  int32_t peer;            // destination rank
  uint64_t src_key;        // local region of the payload
  uint64_t src_offset;     // byte offset in it
  uint64_t dst_key;        // peer region receiving the payload
  uint64_t dst_offset;     // byte offset in it
  uint64_t bytes;          // payload bytes; 0: a signal alone
  uint64_t signal_key;     // peer region of the signal word; 0: no signal
  uint64_t signal_offset;  // 8-byte aligned offset of the signal word in signal_key's region
  uint64_t signal_value;   // the receiver stores max(old, value) after the payload
  uint64_t reserved[6];    // unused, to 128 bytes (one command per slot)
};
static_assert(sizeof(ProxyCommand) == 128);

}  // namespace fusedcomm::rdma
