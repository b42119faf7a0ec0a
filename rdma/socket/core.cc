// Core: construction (the listener, the receiver threads and their epoll sets) and shutdown.
#include "core.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>

#include <algorithm>
#include <cerrno>
#include <random>

#include "../src/thread_name.h"

namespace fusedcomm::rdma::socket_backend {

Core::Core(const SocketOptions& o) : busy_poll_(o.busy_poll) {
  std::random_device rd;
  key_salt_ = (static_cast<uint64_t>(rd()) & 0xffffffull) << 40;

  open_listener(o);

  const int receivers = std::max(1, o.receive_threads);
  for (int i = 0; i < receivers; ++i) {
    receivers_.push_back(std::make_unique<Receiver>());
    Receiver& r = *receivers_.back();
    r.index = i;
    r.event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    r.epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (r.event_fd < 0 || r.epoll_fd < 0) {
      const int e = errno;
      close_fds();
      throw_sys("eventfd/epoll", e);
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    if (i == 0) {
      ev.data.u64 = 0;
      epoll_ctl(r.epoll_fd, EPOLL_CTL_ADD, listen_fd_, &ev);
    }
    ev.data.u64 = 1;
    epoll_ctl(r.epoll_fd, EPOLL_CTL_ADD, r.event_fd, &ev);
  }
  running_ = true;
  for (auto& r : receivers_) {
    Receiver* rp = r.get();
    r->thread = std::thread([this, rp] {
      name_this_thread("fc-sock-rx" + std::to_string(rp->index));
      run(*rp);
    });
  }
}

void Core::close_fds() {
  for (auto& r : receivers_) {
    for (int* fd : {&r->epoll_fd, &r->event_fd}) {
      if (*fd >= 0) ::close(*fd);
      *fd = -1;
    }
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

Core::~Core() { shutdown(); }

void Core::shutdown() {
  for (auto& r : receivers_) {
    if (r->thread.joinable()) {
      post(r->index, {Command::kStop, nullptr});
      r->thread.join();
    }
  }
  running_ = false;
  for (auto& r : receivers_) r->conns.clear();
  { std::lock_guard<std::mutex> l(detach_mu_); }
  detach_cv_.notify_all();
  std::vector<std::shared_ptr<GroupState>> live;
  {
    std::lock_guard<std::mutex> l(groups_mu_);
    for (auto& [id, w] : groups_) {
      if (auto g = w.lock()) live.push_back(g);
    }
  }
  for (auto& g : live) g->abort();
  close_fds();
}

}  // namespace fusedcomm::rdma::socket_backend
