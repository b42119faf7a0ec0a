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

const char* libfabric_provider_name(LibfabricProvider p) {
  switch (p) {
    case LibfabricProvider::kAuto: return "auto";
    case LibfabricProvider::kEfa: return "efa";
    case LibfabricProvider::kVerbs: return "verbs";
    case LibfabricProvider::kTcp: return "tcp";
    case LibfabricProvider::kShm: return "shm";
  }
  return "unknown";
}

std::unique_ptr<Transport> make_transport(TransportKind kind, const TransportOptions& options) {
  switch (kind) {
    case TransportKind::kSocket: return make_socket_transport(options.socket);
    case TransportKind::kLibfabric: return make_libfabric_transport(options.libfabric);
    case TransportKind::kIbverbs:
    case TransportKind::kEfa: break;  // no backend in this build: probe() says what the host has
  }
  throw TransportError(
      -1, std::string(transport_kind_name(kind)) + " transport is unavailable: " + probe(kind).reason);
}

#if !FUSEDCOMM_HAVE_LIBFABRIC
// Built without libfabric's headers: the backend is compiled out and says so.
namespace {
const char kNoLibfabric[] =
    "this build has no libfabric backend (built without libfabric's headers: install libfabric-dev, or"
    " the distribution's libfabric development package, and rebuild)";
}  // namespace

std::unique_ptr<Transport> make_libfabric_transport(const LibfabricOptions&) {
  throw TransportError(-1, std::string("libfabric transport is unavailable: ") + kNoLibfabric);
}

Availability probe_libfabric(LibfabricProvider, const std::string&) { return {false, kNoLibfabric}; }
Availability probe_libfabric() { return {false, kNoLibfabric}; }
#endif

}  // namespace fusedcomm::rdma
