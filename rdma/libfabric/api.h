// libfabric opened at run time: the few entry points the library exports, resolved with dlsym
// into one table (as src/probe.cc does for libibverbs). Everything else (fi_domain, fi_endpoint,
// fi_cq_read, fi_writedata, ...) is an inline wrapper of <rdma/fi_*.h> that calls through the ops
// tables inside the objects these entry points return, so it needs no symbol of its own and this
// backend links nothing: the plugin loads on hosts without libfabric and says why the backend is
// unavailable.
//
// Struct layouts: libfabric only appends fields to its structs (new fields come with a new ABI
// version), and the newest symbol dlsym returns fills a superset of what these headers know, so
// reading the fields this build knows is sound with a newer library.
#pragma once

#include <rdma/fabric.h>

#include <cstdint>
#include <string>

namespace fusedcomm::rdma::libfabric {

// The oldest libfabric this backend asks for (FI_HMEM, FI_MR_* modes and remote CQ data are
// all older); a newer library is asked for the version of the headers this build used, or its
// own if that is older.
inline constexpr uint32_t kMinVersion = FI_VERSION(1, 10);

// Keeps the process's signal handlers across a call into libfabric. Loading libfabric loads
// its providers' libraries, and some of them (libinfinipath, under the psm provider) install
// handlers for SIGSEGV, SIGBUS, SIGILL, SIGINT, SIGTERM and SIGABRT when loaded or initialised:
// in a JVM, whose own SIGSEGV handler is part of normal execution, that crashes the process.
// Every handler that changed during the guard's life is put back when it ends.
class SignalGuard {
 public:
  SignalGuard();
  ~SignalGuard();
  SignalGuard(const SignalGuard&) = delete;
  SignalGuard& operator=(const SignalGuard&) = delete;

 private:
  struct Saved;
  Saved* saved_;
};

struct FabricApi {
  void* handle = nullptr;
  int (*getinfo)(uint32_t version, const char* node, const char* service, uint64_t flags,
                 const fi_info* hints, fi_info** info) = nullptr;
  void (*freeinfo)(fi_info* info) = nullptr;
  fi_info* (*dupinfo)(const fi_info* info) = nullptr;
  int (*fabric)(fi_fabric_attr* attr, fid_fabric** fabric, void* context) = nullptr;
  const char* (*strerror)(int errnum) = nullptr;
  uint32_t (*version)() = nullptr;
  std::string library;  // the name dlopen was given
  std::string error;    // empty once open() succeeded, else why the backend cannot run

  // The table for `library` ("libfabric.so.1" in production; tests name a missing one to see the
  // refusal). Opened once per name and never closed: providers keep state that does not survive
  // dlclose, and the transport needs the library for the process's lifetime anyway.
  static const FabricApi& get(const std::string& library);

  bool ok() const { return error.empty(); }
  // The version to ask fi_getinfo for: min(headers, library).
  uint32_t api_version() const;
  // "1.17" for a FI_VERSION value.
  static std::string version_text(uint32_t v);
  // fi_strerror of a negative or positive libfabric return code, with the code.
  std::string error_text(int rc) const;
};

}  // namespace fusedcomm::rdma::libfabric
