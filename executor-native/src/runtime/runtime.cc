#include "fusedcomm/runtime/runtime.h"

#include "fusedcomm/runtime/errors.h"
#include "fusedcomm/runtime/symmetric_memory.h"
#include "kernels/proxy/proxy.h"

namespace fusedcomm {

Runtime::Runtime(const RuntimeConfig& config) : config_(config), backend_(Backend::kHost) {
  FC_REQUIRE(config.timeout_ms > 0, "timeout must be positive");
  FC_REQUIRE(config.connect_timeout_ms > 0, "connect timeout must be positive");
  FC_REQUIRE(config.chunk_bytes >= 4096, "chunk bytes must be at least 4096");
  FC_REQUIRE(
      config.transport_streams >= 1 && config.transport_streams <= static_cast<int>(kernels::kProxyMaxLanes),
      "transport streams must be 1.." + std::to_string(kernels::kProxyMaxLanes) + ", not " +
          std::to_string(config.transport_streams));
  FC_REQUIRE(config.busy_poll_us >= 0 && config.busy_poll_us <= 1000000,
             "transport busy-poll window must be 0..1000000 us, not " + std::to_string(config.busy_poll_us));
  FC_REQUIRE(config.symmetric_bytes >= 4096 && config.symmetric_bytes % 4096 == 0,
             "symmetric bytes must be a positive multiple of 4096");
  switch (config.backend) {
    case Backend::kHost: break;
    case Backend::kCuda:
      if (config.gpu_ordinal < 0) {
        fail(ErrorKind::kUnavailable,
             "spark.fusedcomm.backend=cuda but this executor has no GPU assigned; set "
             "spark.executor.resource.gpu.amount=1 with a discovery script (conf/gpu-discovery.sh)");
      }
      gpu_ = open_gpu(config.gpu_ordinal);
      backend_ = Backend::kCuda;
      break;
    case Backend::kAuto:
      if (config.gpu_ordinal >= 0 && probe_cuda().available) {
        gpu_ = open_gpu(config.gpu_ordinal);
        backend_ = Backend::kCuda;
      }
      break;
  }
  FC_REQUIRE(config.libfabric_rails >= 1 && config.libfabric_rails <= 8,
             "libfabric rails must be 1..8, not " + std::to_string(config.libfabric_rails));
  FC_REQUIRE(config.libfabric_peer_timeout_ms >= 100 && config.libfabric_peer_timeout_ms <= 600000,
             "libfabric peer timeout must be 100..600000 ms, not " +
                 std::to_string(config.libfabric_peer_timeout_ms));
  rdma::TransportOptions options;
  options.socket.bind_host = config.bind_host;
  options.socket.receive_threads = config.transport_streams;
  options.socket.busy_poll = std::chrono::microseconds(config.busy_poll_us);
  options.libfabric.provider = config.libfabric_provider;
  options.libfabric.rails = config.libfabric_rails;
  options.libfabric.bind_host = config.bind_host;
  options.libfabric.busy_poll = std::chrono::microseconds(config.busy_poll_us);
  options.libfabric.peer_timeout = std::chrono::milliseconds(config.libfabric_peer_timeout_ms);
  // The cuda backend's link between hosts connects its lanes as one-way pairs (inter_host.h).
  options.libfabric.one_way_lanes = backend_ == Backend::kCuda ? config.transport_streams : 0;
  std::string why;
  const rdma::TransportKind kind = resolve_transport(config.transport, config.libfabric_provider, &why);
  transport_choice_ = std::string(transport_choice_name(config.transport)) + ": " + why;
  try {
    transport_ = rdma::make_transport(kind, options);
  } catch (const rdma::TransportError& e) {
    fail(ErrorKind::kUnavailable, std::string("spark.fusedcomm.transport=") +
                                      transport_choice_name(config.transport) + ": " + e.what());
  }
}

const char* transport_choice_name(TransportChoice t) {
  switch (t) {
    case TransportChoice::kAuto: return "auto";
    case TransportChoice::kSocket: return "socket";
    case TransportChoice::kLibfabric: return "libfabric";
  }
  return "unknown";
}

rdma::TransportKind resolve_transport(TransportChoice choice, rdma::LibfabricProvider provider,
                                      std::string* why) {
  switch (choice) {
    case TransportChoice::kSocket: *why = "as configured"; return rdma::TransportKind::kSocket;
    case TransportChoice::kLibfabric: *why = "as configured"; return rdma::TransportKind::kLibfabric;
    case TransportChoice::kAuto: break;
  }
  // auto: an RDMA NIC through libfabric, where one answers; TCP through libfabric is no better
  // than the socket backend, so tcp and shm are used only when asked for.
  std::string tried;
  const bool any = provider == rdma::LibfabricProvider::kAuto;
  for (rdma::LibfabricProvider p : {rdma::LibfabricProvider::kEfa, rdma::LibfabricProvider::kVerbs}) {
    if (!any && provider != p) continue;
    const rdma::Availability a = rdma::probe_libfabric(p);
    if (a.available) {
      *why = "libfabric " + std::string(rdma::libfabric_provider_name(p)) + " found (" + a.reason + ")";
      return rdma::TransportKind::kLibfabric;
    }
    tried += std::string(tried.empty() ? "" : "; ") + a.reason;
  }
  *why = "no RDMA provider through libfabric (" +
         (tried.empty() ? std::string("spark.fusedcomm.libfabric.provider=") +
                              rdma::libfabric_provider_name(provider) + " is not an RDMA provider"
                        : tried) +
         ")";
  return rdma::TransportKind::kSocket;
}

Runtime::~Runtime() {
  std::lock_guard<std::mutex> lock(pool_mutex_);
  pool_.clear();
}

namespace {
SymmetricConfig symmetric_config(const RuntimeConfig& c) {
  SymmetricConfig s;
  s.data_bytes = static_cast<uint64_t>(c.symmetric_bytes);
  s.timeout_ns = static_cast<uint64_t>(c.timeout_ms) * 1000000ull;
  s.max_world = kernels::kCommMaxRanks;
  s.allow_shared_gpu = c.allow_shared_gpu;
  return s;
}
}  // namespace

std::unique_ptr<SymmetricRegion> Runtime::acquire_region(int world) {
  if (backend_ != Backend::kCuda) fail(ErrorKind::kState, "symmetric memory needs the cuda backend");
  const SymmetricConfig wanted = symmetric_config(config_);
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    for (auto it = pool_.begin(); it != pool_.end(); ++it) {
      if ((*it)->fits(world, wanted)) {
        std::unique_ptr<SymmetricRegion> r = std::move(*it);
        pool_.erase(it);
        return r;
      }
    }
  }
  pin_gpu(gpu_.ordinal);
  return std::make_unique<SymmetricRegion>(world, wanted);
}

void Runtime::release_region(std::unique_ptr<SymmetricRegion> region) {
  if (region == nullptr) return;
  std::lock_guard<std::mutex> lock(pool_mutex_);
  pool_.push_back(std::move(region));
}

size_t Runtime::pooled_regions() const {
  std::lock_guard<std::mutex> lock(pool_mutex_);
  return pool_.size();
}

std::string Runtime::describe() const {
  std::string s = std::string("backend=") + (backend_ == Backend::kCuda ? "cuda" : "host") +
                  " transport=" + transport_->name() + " (" + transport_choice_ + "; " +
                  transport_->describe() + ") address=" + transport_->address() +
                  " streams=" + std::to_string(config_.transport_streams) +
                  " busyPoll=" + std::to_string(config_.busy_poll_us) + "us";
  if (gpu_.ordinal >= 0)
    s += " gpu=" + std::to_string(gpu_.ordinal) + " uuid=" + gpu_.uuid + " (" + gpu_.name + ")";
  return s;
}

std::string availability_report() {
  auto line = [](const char* name, bool ok, const std::string& why) {
    return std::string(name) + ": " + (ok ? "available" : "unavailable") + ": " + why + "\n";
  };
  CudaAvailability cuda = probe_cuda();
  std::string r = line("cuda", cuda.available, cuda.reason);
  r += line("host", true, "the C++ reference backend runs everywhere");
  auto sock = rdma::probe_socket();
  r += line("transport.socket", sock.available, sock.reason);
  auto ib = rdma::probe_ibverbs();
  r += line("transport.ibverbs", ib.available, ib.reason);
  auto efa = rdma::probe_efa();
  r += line("transport.efa", efa.available, efa.reason);
  auto fabric = rdma::probe_libfabric();
  r += line("transport.libfabric", fabric.available, fabric.reason);
  return r;
}

}  // namespace fusedcomm
