// Choosing a libfabric provider and reading what it can do: the hints this backend asks with,
// the providers behind each LibfabricProvider, the capabilities that decide how signals travel
// and how GPU memory would be registered, and the per-provider probe.
#pragma once

#include <rdma/fabric.h>

#include <memory>
#include <string>
#include <vector>

#include "api.h"
#include "fusedcomm/rdma/transport.h"
#include "wire.h"

namespace fusedcomm::rdma::libfabric {

// fi_info lists freed with the library's fi_freeinfo.
struct InfoDeleter {
  const FabricApi* api = nullptr;
  void operator()(fi_info* i) const {
    if (i) api->freeinfo(i);
  }
};
using InfoPtr = std::unique_ptr<fi_info, InfoDeleter>;

// What a provider's fi_info says about the features this backend uses.
struct Caps {
  std::string provider;      // fabric_attr->prov_name, e.g. "tcp;ofi_rxm"
  std::string domain;        // domain_attr->name (the NIC, or "shm")
  size_t cq_data_bytes = 0;  // remote CQ data size; >= 4: signals ride on the CQ data
  bool virt_addr = false;    // FI_MR_VIRT_ADDR: remote addresses are virtual, not offsets
  bool prov_key = false;     // FI_MR_PROV_KEY: the provider picks remote keys
  bool mr_local = false;     // FI_MR_LOCAL: local buffers need a registration's descriptor
  bool mr_endpoint = false;  // FI_MR_ENDPOINT: registrations are bound to the endpoint
  bool rx_cq_data = false;   // FI_RX_CQ_DATA: remote CQ data consumes a posted receive
  size_t key_bytes = 8;      // mr_key_size
  uint64_t max_write = 0;    // the largest single write (ep_attr->max_msg_size, capped)
  bool hmem = false;         // FI_HMEM: the provider registers GPU memory
  // The provider places an RMA write's remote iovs in order and a pair's writes in order (tcp,
  // with two or more iovs and FI_ORDER_WAW): a signal word may ride as a write's last iov.
  bool ordered_iovs = false;
  bool signal_cq_data() const { return cq_data_bytes >= 4; }
};

Caps caps_of(const fi_info& info);

// Why this backend cannot run on what `info` describes, or empty if it can: it needs reliable
// datagram endpoints, messages both ways, RMA writes both ways, and only the operation modes
// (FI_CONTEXT, FI_CONTEXT2, FI_RX_CQ_DATA) and registration modes (FI_MR_LOCAL, _VIRT_ADDR,
// _ALLOCATED, _PROV_KEY, _ENDPOINT, _HMEM) it honours. fi_getinfo filters by the hints, but a
// provider may answer with more than was asked: each answer is checked again here.
std::string unusable(const fi_info& info);

// What the transport does with a usable provider.
struct Plan {
  bool cq_data = false;  // signals ride on remote CQ data (wire.h), else messages after writes
  // Whether the provider could register GPU memory (asked with FI_HMEM, it answers with
  // FI_HMEM). The runtime stages GPU data through pinned host memory either way: registering
  // GPU memory with the NIC is not built yet, and describe() says so.
  bool hmem = false;
  wire::CqDataLayout layout;
};
// The plan for `caps` (hmem: whether the FI_HMEM query answered with FI_HMEM in its caps) and
// the signal choice; throws TransportError(-1, "... unavailable: ...") for kCqData without
// remote CQ data.
Plan plan_for(const Caps& caps, LibfabricSignal signal);

// The libfabric provider names behind one choice, in order of preference:
// efa -> "efa"; verbs -> "verbs;ofi_rxm"; tcp -> "tcp;ofi_rxm", "tcp"; shm -> "shm".
// kAuto is not a provider: see pick_provider().
std::vector<std::string> provider_names(LibfabricProvider p);

// fi_getinfo for one provider name with this backend's hints (reliable datagrams, messages and
// RMA writes, the registration modes it handles; `hmem` adds FI_HMEM). `node`: the address to
// bind (tcp), or empty. Null with *why on failure.
InfoPtr query(const FabricApi& api, const std::string& prov_name, const std::string& node, bool hmem,
              std::string* why);

// Whether `prov_name` registers GPU memory here: asked with FI_HMEM (and FI_MR_HMEM), it
// answers, usable, with FI_HMEM in its capabilities.
bool hmem_offered(const FabricApi& api, const std::string& prov_name, const std::string& node);

// The first provider name of `p` that answers, with its info list; null with *why (every name
// tried and what it said) if none does.
InfoPtr find_provider(const FabricApi& api, LibfabricProvider p, const std::string& node, std::string* why);

// kAuto: efa where present, else verbs, else tcp (shm only by name: it reaches one host).
// Returns the provider chosen, or kAuto with *why when none answers.
LibfabricProvider pick_provider(const FabricApi& api, const std::string& node, std::string* why);

// How the transport would move signals and GPU memory with this provider, for describe() and
// the probe: "signals on remote CQ data (8 bytes); GPU memory: FI_HMEM" or "... host staging".
std::string describe_caps(const Caps& caps, LibfabricSignal signal);
std::string describe_plan(const Caps& caps, const Plan& plan);

// Whether provider `p` can run this backend here, and what it would use. The library is
// `library` (LibfabricOptions::library).
Availability probe_provider(LibfabricProvider p, const std::string& library);

}  // namespace fusedcomm::rdma::libfabric
