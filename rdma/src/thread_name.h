// Names the calling thread (pthread_setname_np; at most 15 characters are kept) so that an
// executor's native threads read as what they are in `top -H`, `ps -L`, perf and gdb:
// fc-sock-rx<N> (the socket transport's receivers), fc-ofi-ep<N> (the libfabric transport's
// progress thread of endpoint N), fc-proxy (a proxy draining a GPU's command ring).
#pragma once

#include <pthread.h>

#include <string>

namespace fusedcomm::rdma {

inline void name_this_thread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

}  // namespace fusedcomm::rdma
