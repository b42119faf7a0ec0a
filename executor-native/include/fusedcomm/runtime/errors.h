// The runtime's typed errors. The JNI boundary (src/jni/jni_boundary.h) maps each kind to one
// Java exception of io.fusedcomm.errors; native code never aborts the JVM.
#pragma once

#include <stdexcept>
#include <string>

namespace fusedcomm {

enum class ErrorKind {
  kInvalidArgument,  // -> IllegalArgumentException (caught before any data moves)
  kState,            // -> IllegalStateException (closed communicator, wrong backend)
  kCommunicator,     // -> CommunicatorException (mismatch across ranks, aborted, ...)
  kTimeout,          // -> CommTimeoutException
  kTransport,        // -> TransportException
  kFatalGpu,         // -> FatalGpuException (the executor's GPU context is unusable)
  kUnavailable,      // -> BackendUnavailableException
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

[[noreturn]] inline void fail(ErrorKind kind, const std::string& what) { throw Error(kind, what); }

#define FC_REQUIRE(cond, msg)                                                      \
  do {                                                                             \
    if (!(cond)) ::fusedcomm::fail(::fusedcomm::ErrorKind::kInvalidArgument, msg); \
  } while (0)

}  // namespace fusedcomm
