// Backend availability probes. libibverbs, libefa and libfabric are opened with dlopen at run
// time and never linked, so the library loads on hosts without them and says why a backend is
// unavailable (libfabric's per-provider probe is the backend's own: libfabric/provider.cc).
#include <dlfcn.h>
#include <sys/socket.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <string>
#include <vector>

#include "fusedcomm/rdma/transport.h"

#if __has_include(<infiniband/verbs.h>)
// The real types when rdma-core's headers are installed (its enums trip a C++20 warning).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-enum-enum-conversion"
#include <infiniband/verbs.h>
#pragma GCC diagnostic pop
#else
struct ibv_device;  // opaque: we only pass pointers back to the library
#endif

namespace fusedcomm::rdma {
namespace {

// The few libibverbs entry points the probes need, resolved with dlsym. Opened once and never
// closed: provider libraries keep state that does not survive dlclose well, and the backends
// will need the library again anyway.
struct VerbsTable {
  void* handle = nullptr;
  ibv_device** (*get_device_list)(int* num_devices) = nullptr;
  void (*free_device_list)(ibv_device** list) = nullptr;
  const char* (*get_device_name)(ibv_device* device) = nullptr;
  std::string error;  // empty once open() succeeded

  static VerbsTable& get() {
    static VerbsTable table = [] {
      VerbsTable t;
      t.error = t.open();
      return t;
    }();
    return table;
  }

 private:
  // Empty on success, else why not.
  std::string open() {
    handle = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* e = dlerror();
      return std::string("libibverbs.so.1 not found (install rdma-core)") + (e ? ": " + std::string(e) : "");
    }
    get_device_list = reinterpret_cast<decltype(get_device_list)>(dlsym(handle, "ibv_get_device_list"));
    free_device_list = reinterpret_cast<decltype(free_device_list)>(dlsym(handle, "ibv_free_device_list"));
    get_device_name = reinterpret_cast<decltype(get_device_name)>(dlsym(handle, "ibv_get_device_name"));
    if (!get_device_list || !free_device_list || !get_device_name) {
      return "libibverbs.so.1 loaded but lacks ibv_get_device_list/ibv_get_device_name (too old?)";
    }
    return {};
  }

 public:
  std::vector<std::string> device_names() const {
    std::vector<std::string> names;
    int n = 0;
    ibv_device** list = get_device_list(&n);
    if (!list) return names;
    for (int i = 0; i < n; ++i) {
      const char* name = get_device_name(list[i]);
      names.emplace_back(name ? name : "?");
    }
    free_device_list(list);
    return names;
  }
};

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// The kernel driver behind an RDMA device, from sysfs ("mlx5_core", "efa", ...).
std::string driver_of(const std::string& device) {
  std::string link = "/sys/class/infiniband/" + device + "/device/driver";
  char buf[PATH_MAX];
  ssize_t n = readlink(link.c_str(), buf, sizeof buf - 1);
  if (n <= 0) return {};
  buf[n] = 0;
  std::string target(buf);
  size_t slash = target.rfind('/');
  return slash == std::string::npos ? target : target.substr(slash + 1);
}

}  // namespace

Availability probe_socket() {
  Availability a;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    a.reason = "cannot create a TCP socket";
    return a;
  }
  ::close(fd);
  a.available = true;
  a.reason = "TCP sockets";
  return a;
}

// The raw ibverbs and efa backends are not built (the libfabric backend drives those NICs): when
// the host has the hardware the probe says so, but reports the backend unavailable.
Availability probe_ibverbs() {
  Availability a;
  const VerbsTable& verbs = VerbsTable::get();
  if (!verbs.error.empty()) {
    a.reason = verbs.error;
    return a;
  }
  std::vector<std::string> devices;
  for (const auto& d : verbs.device_names()) {
    if (driver_of(d) != "efa") devices.push_back(d);
  }
  if (devices.empty()) {
    a.reason = "libibverbs loaded but no RDMA device is present";
    return a;
  }
  a.reason = "RDMA device(s) " + join(devices) +
             " present, but this build has no ibverbs backend yet (socket backend only)";
  return a;
}

Availability probe_efa() {
  Availability a;
  static void* const efa = dlopen("libefa.so.1", RTLD_NOW | RTLD_LOCAL);  // kept, like libibverbs
  if (!efa) {
    a.reason = "libefa.so.1 not found (install rdma-core with the EFA provider)";
    return a;
  }
  const VerbsTable& verbs = VerbsTable::get();
  if (!verbs.error.empty()) {
    a.reason = "libefa.so.1 loaded, but " + verbs.error;
    return a;
  }
  std::vector<std::string> devices;
  for (const auto& d : verbs.device_names()) {
    if (driver_of(d) == "efa") devices.push_back(d);
  }
  if (devices.empty()) {
    a.reason = "libefa loaded but no EFA device is present";
    return a;
  }
  a.reason = "EFA device(s) " + join(devices) +
             " present, but this build has no efa backend yet (socket backend only)";
  return a;
}

Availability probe(TransportKind kind) {
  switch (kind) {
    case TransportKind::kSocket: return probe_socket();
    case TransportKind::kIbverbs: return probe_ibverbs();
    case TransportKind::kEfa: return probe_efa();
    case TransportKind::kLibfabric: return probe_libfabric();
  }
  Availability a;
  a.reason = "unknown transport kind " + std::to_string(static_cast<uint32_t>(kind));
  return a;
}

}  // namespace fusedcomm::rdma
