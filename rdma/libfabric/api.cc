// The dlopen'ed entry points of libfabric (api.h).
#include "api.h"

#include <dlfcn.h>
#include <signal.h>

#include <cstring>

#include <map>
#include <memory>
#include <mutex>

namespace fusedcomm::rdma::libfabric {

struct SignalGuard::Saved {
  struct sigaction actions[NSIG];
  bool have[NSIG];
};

SignalGuard::SignalGuard() : saved_(new Saved) {
  for (int s = 1; s < NSIG; ++s) {
    saved_->have[s] = s != SIGKILL && s != SIGSTOP && sigaction(s, nullptr, &saved_->actions[s]) == 0;
  }
}

SignalGuard::~SignalGuard() {
  for (int s = 1; s < NSIG; ++s) {
    if (!saved_->have[s]) continue;
    struct sigaction now {};
    if (sigaction(s, nullptr, &now) != 0) continue;
    const bool same = now.sa_flags == saved_->actions[s].sa_flags &&
                      ((now.sa_flags & SA_SIGINFO) ? now.sa_sigaction == saved_->actions[s].sa_sigaction
                                                   : now.sa_handler == saved_->actions[s].sa_handler);
    if (!same) sigaction(s, &saved_->actions[s], nullptr);
  }
  delete saved_;
}

namespace {

template <class Fn>
bool resolve(void* handle, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(handle, name));
  return *out != nullptr;
}

std::unique_ptr<FabricApi> open_library(const std::string& library) {
  auto api = std::make_unique<FabricApi>();
  api->library = library;
  {
    const SignalGuard keep;
    api->handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  if (!api->handle) {
    const char* e = dlerror();
    api->error = library + " not found (install libfabric 1.17 or newer, e.g. the libfabric1 package)" +
                 (e ? ": " + std::string(e) : "");
    return api;
  }
  const bool all = resolve(api->handle, "fi_getinfo", &api->getinfo) &&
                   resolve(api->handle, "fi_freeinfo", &api->freeinfo) &&
                   resolve(api->handle, "fi_dupinfo", &api->dupinfo) &&
                   resolve(api->handle, "fi_fabric", &api->fabric) &&
                   resolve(api->handle, "fi_strerror", &api->strerror) &&
                   resolve(api->handle, "fi_version", &api->version);
  if (!all) {
    api->error = library + " loaded but lacks fi_getinfo/fi_fabric/fi_version (not libfabric?)";
    return api;
  }
  const uint32_t v = api->version();
  if (v < kMinVersion) {
    api->error = library + " is libfabric " + FabricApi::version_text(v) + "; this backend needs " +
                 FabricApi::version_text(kMinVersion) + " or newer";
  }
  return api;
}

}  // namespace

const FabricApi& FabricApi::get(const std::string& library) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<FabricApi>> opened;
  std::lock_guard<std::mutex> l(mu);
  auto& slot = opened[library];
  if (!slot) slot = open_library(library);
  return *slot;
}

uint32_t FabricApi::api_version() const {
  const uint32_t headers = FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION);
  const uint32_t lib = version ? version() : headers;
  return lib < headers ? lib : headers;
}

std::string FabricApi::version_text(uint32_t v) {
  return std::to_string(FI_MAJOR(v)) + "." + std::to_string(FI_MINOR(v));
}

std::string FabricApi::error_text(int rc) const {
  const int e = rc < 0 ? -rc : rc;
  const char* s = strerror ? strerror(e) : nullptr;
  return std::string(s ? s : "unknown error") + " (" + std::to_string(-e) + ")";
}

}  // namespace fusedcomm::rdma::libfabric
