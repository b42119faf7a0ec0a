// The transport factory: maps a TransportKind to its backend, or says why there is none.
#include <string>

#include "fusedcomm/rdma/transport.h"

namespace fusedcomm::rdma {

const char* transport_kind_name(TransportKind kind) {
  switch (kind) {
    case TransportKind::kSocket: return "socket";
    case TransportKind::kIbverbs: return "ibverbs";
    case TransportKind::kEfa: return "efa";
    case TransportKind::kLibfabric: return "libfabric";
  }
  return "unknown";
}

std::unique_ptr<Transport> make_transport(TransportKind kind, const TransportOptions& options) {
  switch (kind) {
    case TransportKind::kSocket: return make_socket_transport(options.socket);
    case TransportKind::kIbverbs:
    case TransportKind::kEfa:
    case TransportKind::kLibfabric: break;  // no backend in this build: probe() says what the host has
  }
  throw TransportError(
      -1, std::string(transport_kind_name(kind)) + " transport is unavailable: " + probe(kind).reason);
}

}  // namespace fusedcomm::rdma
