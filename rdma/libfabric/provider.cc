// Provider choice, capabilities and the per-provider probe (provider.h).
#include "provider.h"

#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <cstring>

#include "fusedcomm/rdma/errors.h"

namespace fusedcomm::rdma::libfabric {

Caps caps_of(const fi_info& info) {
  Caps c;
  c.provider = info.fabric_attr && info.fabric_attr->prov_name ? info.fabric_attr->prov_name : "?";
  c.domain = info.domain_attr && info.domain_attr->name ? info.domain_attr->name : "?";
  const uint64_t mr = info.domain_attr ? static_cast<uint64_t>(info.domain_attr->mr_mode) : 0;
  c.cq_data_bytes = info.domain_attr ? info.domain_attr->cq_data_size : 0;
  c.virt_addr = mr & FI_MR_VIRT_ADDR;
  c.prov_key = mr & FI_MR_PROV_KEY;
  c.mr_local = mr & FI_MR_LOCAL;
  c.mr_endpoint = mr & FI_MR_ENDPOINT;
  c.rx_cq_data = info.mode & FI_RX_CQ_DATA;
  c.key_bytes = info.domain_attr && info.domain_attr->mr_key_size ? info.domain_attr->mr_key_size : 8;
  constexpr uint64_t kWriteCap = uint64_t{1} << 30;  // larger writes go in pieces
  const uint64_t max_msg = info.ep_attr ? info.ep_attr->max_msg_size : 0;
  c.max_write = max_msg == 0 || max_msg > kWriteCap ? kWriteCap : max_msg;
  c.hmem = (info.caps & FI_HMEM) != 0;
  // tcp receives an operation's bytes from one stream, front to back; other providers promise
  // no order inside an operation.
  c.ordered_iovs = c.provider.rfind("tcp", 0) == 0 && info.tx_attr && info.tx_attr->iov_limit >= 2 &&
                   info.tx_attr->rma_iov_limit >= 2 && (info.tx_attr->msg_order & FI_ORDER_WAW);
  return c;
}

std::string unusable(const fi_info& info) {
  const std::string name =
      info.fabric_attr && info.fabric_attr->prov_name ? info.fabric_attr->prov_name : "?";
  if (!info.ep_attr || info.ep_attr->type != FI_EP_RDM)
    return name + ": not reliable-datagram endpoints (FI_EP_RDM)";
  if (!info.domain_attr) return name + ": no domain attributes";
  constexpr uint64_t kNeeded = FI_MSG | FI_RMA;
  if ((info.caps & kNeeded) != kNeeded) {
    return name + ": no " + (info.caps & FI_RMA ? "messages (FI_MSG)" : "RMA (FI_RMA)");
  }
  // Primary capabilities without direction bits mean both directions (fi_getinfo(3)).
  const uint64_t rma_dirs = info.caps & (FI_WRITE | FI_REMOTE_WRITE | FI_READ | FI_REMOTE_READ);
  if (rma_dirs != 0 && (rma_dirs & (FI_WRITE | FI_REMOTE_WRITE)) != (FI_WRITE | FI_REMOTE_WRITE)) {
    return name + ": RMA writes are not offered both ways (FI_WRITE and FI_REMOTE_WRITE)";
  }
  const uint64_t msg_dirs = info.caps & (FI_SEND | FI_RECV);
  if (msg_dirs != 0 && msg_dirs != (FI_SEND | FI_RECV)) return name + ": messages are not offered both ways";
  constexpr uint64_t kModes = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;
  if (info.mode & ~kModes)
    return name + ": asks for operation modes this backend does not honour (FI_MSG_PREFIX?)";
  constexpr uint64_t kMrModes =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT | FI_MR_HMEM;
  const uint64_t mr = static_cast<uint64_t>(info.domain_attr->mr_mode);
  if (mr & ~kMrModes)
    return name + ": asks for registration modes this backend does not honour (FI_MR_RMA_EVENT, FI_MR_RAW?)";
  return {};
}

Plan plan_for(const Caps& caps, LibfabricSignal signal) {
  Plan p;
  switch (signal) {
    case LibfabricSignal::kAuto: p.cq_data = caps.signal_cq_data(); break;
    case LibfabricSignal::kCqData:
      if (!caps.signal_cq_data()) {
        throw TransportError(-1, "libfabric transport is unavailable: " + caps.provider + " has " +
                                     std::to_string(caps.cq_data_bytes) +
                                     " bytes of remote CQ data, too few for the signals (4 or more)");
      }
      p.cq_data = true;
      break;
    case LibfabricSignal::kMessage: p.cq_data = false; break;
  }
  p.hmem = caps.hmem;
  p.layout = wire::CqDataLayout::for_bytes(caps.cq_data_bytes);
  return p;
}

std::string describe_plan(const Caps& caps, const Plan& plan) {
  std::string s = plan.cq_data
                      ? "signals on remote CQ data (" + std::to_string(caps.cq_data_bytes) + " bytes)"
                      : "signals as messages after delivery-complete writes";
  s += plan.hmem ? "; GPU memory: host staging (FI_HMEM offered, not used yet)"
                 : "; GPU memory: host staging (no FI_HMEM)";
  return s;
}

std::vector<std::string> provider_names(LibfabricProvider p) {
  switch (p) {
    case LibfabricProvider::kEfa: return {"efa"};
    case LibfabricProvider::kVerbs: return {"verbs;ofi_rxm"};
    case LibfabricProvider::kTcp: return {"tcp;ofi_rxm", "tcp"};
    case LibfabricProvider::kShm: return {"shm"};
    case LibfabricProvider::kAuto: break;
  }
  return {};
}

InfoPtr query(const FabricApi& api, const std::string& prov_name, const std::string& node, bool hmem,
              std::string* why) {
  InfoPtr hints(api.dupinfo(nullptr), InfoDeleter{&api});
  if (!hints) {
    *why = "fi_allocinfo failed";
    return InfoPtr(nullptr, InfoDeleter{&api});
  }
  hints->caps = FI_MSG | FI_RMA | FI_WRITE | FI_REMOTE_WRITE | FI_SEND | FI_RECV | (hmem ? FI_HMEM : 0);
  // Every op's context starts with an fi_context2, and a posted receive is ready for remote CQ
  // data: the modes a provider may ask for that this backend honours.
  hints->mode = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY |
                                FI_MR_ENDPOINT | (hmem ? FI_MR_HMEM : 0);
  // Every call on a rail's objects holds the rail's mutex (core.h).
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->domain_attr->av_type = FI_AV_TABLE;
  hints->fabric_attr->prov_name = strdup(prov_name.c_str());  // freed by fi_freeinfo
  fi_info* out = nullptr;
  const SignalGuard keep;  // the first fi_getinfo loads and initialises every provider
  const int rc = api.getinfo(api.api_version(), node.empty() ? nullptr : node.c_str(), nullptr,
                             node.empty() ? 0 : FI_SOURCE, hints.get(), &out);
  if (rc != 0 || out == nullptr) {
    *why = prov_name + (node.empty() ? "" : " at " + node) + ": " +
           (rc == -FI_ENODATA || out == nullptr ? std::string("no such provider or device here")
                                                : api.error_text(rc));
    if (out) api.freeinfo(out);
    return InfoPtr(nullptr, InfoDeleter{&api});
  }
  return InfoPtr(out, InfoDeleter{&api});
}

bool hmem_offered(const FabricApi& api, const std::string& prov_name, const std::string& node) {
  std::string ignored;
  InfoPtr info = query(api, prov_name, node, true, &ignored);
  for (const fi_info* i = info.get(); i; i = i->next) {
    if (unusable(*i).empty() && (i->caps & FI_HMEM)) return true;
  }
  return false;
}

InfoPtr find_provider(const FabricApi& api, LibfabricProvider p, const std::string& node, std::string* why) {
  std::string tried;
  // Only tcp binds to an IP address; the RDMA providers name their devices themselves.
  const std::string bind = p == LibfabricProvider::kTcp ? node : std::string();
  for (const std::string& name : provider_names(p)) {
    std::string one;
    InfoPtr info = query(api, name, bind, false, &one);
    if (info) {
      // Keep the usable answers, in the provider's order.
      fi_info* usable_head = nullptr;
      std::string refused;
      for (fi_info* i = info.get(); i; i = i->next) {
        const std::string why_not = unusable(*i);
        if (why_not.empty()) {
          usable_head = i;
          break;
        }
        refused = why_not;
      }
      if (usable_head == info.get()) return info;
      if (usable_head != nullptr) {
        fi_info* copy = api.dupinfo(usable_head);  // one entry; the transport asks for one rail
        if (copy) return InfoPtr(copy, InfoDeleter{&api});
      }
      one = refused.empty() ? name + ": no usable answer" : refused;
    }
    tried += (tried.empty() ? "" : "; ") + one;
  }
  *why = tried.empty() ? "no provider named" : tried;
  return InfoPtr(nullptr, InfoDeleter{&api});
}

LibfabricProvider pick_provider(const FabricApi& api, const std::string& node, std::string* why) {
  std::string tried;
  for (LibfabricProvider p : {LibfabricProvider::kEfa, LibfabricProvider::kVerbs, LibfabricProvider::kTcp}) {
    std::string one;
    if (find_provider(api, p, node, &one)) return p;
    tried += (tried.empty() ? "" : "; ") + one;
  }
  *why = tried;
  return LibfabricProvider::kAuto;
}

std::string describe_caps(const Caps& caps, LibfabricSignal signal) {
  Plan p;
  p.cq_data =
      signal == LibfabricSignal::kCqData || (signal == LibfabricSignal::kAuto && caps.signal_cq_data());
  p.hmem = caps.hmem;
  return describe_plan(caps, p);
}

Availability probe_provider(LibfabricProvider p, const std::string& library) {
  Availability a;
  const FabricApi& api = FabricApi::get(library);
  if (!api.ok()) {
    a.reason = api.error;
    return a;
  }
  std::string why;
  if (p == LibfabricProvider::kAuto) {
    p = pick_provider(api, "", &why);
    if (p == LibfabricProvider::kAuto) {
      a.reason = "no provider answers: " + why;
      return a;
    }
  }
  InfoPtr info = find_provider(api, p, "", &why);
  if (!info) {
    a.reason = why;
    return a;
  }
  Caps caps = caps_of(*info);
  caps.hmem = hmem_offered(api, caps.provider, "");
  a.available = true;
  a.reason = caps.provider + " on " + caps.domain + ": " + describe_caps(caps, LibfabricSignal::kAuto);
  return a;
}

}  // namespace fusedcomm::rdma::libfabric
