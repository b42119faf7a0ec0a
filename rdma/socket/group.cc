// Ending a group: close() (kBye both ways, bounded), abort() (cut now) and release() (hand the
// connections back to their receivers and drop them).
#include "core.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>

namespace fusedcomm::rdma::socket_backend {

void GroupState::close(milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<std::shared_ptr<Conn>> conns;
  {
    std::lock_guard<std::mutex> l(mu);
    if (phase == Phase::kDone) return;
    if (aborted) {
      // abort() already cut the sockets; just release them.
    } else {
      phase = Phase::kClosing;
      conns = peers;
    }
  }
  for (auto& c : conns) {
    // A peer that already said kBye (kClosed) still waits for ours; only a broken one is skipped.
    if (!c || c->state.load() == PeerState::kFailed) continue;
    std::unique_lock<std::mutex> sl(c->send_mu, std::try_to_lock);
    while (!sl.owns_lock() && Clock::now() < deadline) {  // a writer on another thread: bounded
      std::this_thread::sleep_for(milliseconds(1));
      sl.try_lock();
    }
    if (!sl.owns_lock()) continue;
    wire::WireHeader bye{};
    bye.magic = wire::kDataMagic;
    bye.kind = wire::kBye;
    const char* p = reinterpret_cast<const char*>(&bye);
    size_t left = sizeof bye;
    while (left > 0 && Clock::now() < deadline && !aborted) {
      ssize_t r = ::send(c->fd, p, left, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (r > 0) {
        p += r;
        left -= static_cast<size_t>(r);
      } else if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
        pollfd pf{c->fd, POLLOUT, 0};
        ::poll(&pf, 1, kPollSliceMs);
      } else {
        break;
      }
    }
    ::shutdown(c->fd, SHUT_WR);
  }
  {
    // Every peer's kBye (or EOF) tells us that nothing more will arrive from it.
    std::unique_lock<std::mutex> l(mu);
    cv.wait_until(l, deadline, [&] {
      if (aborted) return true;
      for (auto& c : conns) {
        if (c && c->state.load() == PeerState::kConnected && c->with_receiver) return false;
      }
      return true;
    });
  }
  release(true);
}

void GroupState::abort() {
  aborted = true;
  std::vector<std::shared_ptr<Conn>> conns;
  {
    std::lock_guard<std::mutex> l(mu);
    conns = peers;
    for (auto& c : conns) {
      if (c && c->state.load() == PeerState::kConnected) c->state = PeerState::kClosed;
    }
    cv.notify_all();
  }
  for (auto& c : conns) {
    if (c) ::shutdown(c->fd, SHUT_RDWR);
  }
  core->detach(conns, false);
}

// Detaches every connection from the receiver and drops the group's references, which closes
// the sockets (a writer still inside write() holds its own reference until it returns).
void GroupState::release(bool wait_for_receiver) {
  std::vector<std::shared_ptr<Conn>> conns;
  {
    std::lock_guard<std::mutex> l(mu);
    if (phase == Phase::kDone) return;
    conns = peers;
  }
  core->detach(conns, wait_for_receiver);
  {
    std::lock_guard<std::mutex> l(mu);
    phase = Phase::kDone;
    for (auto& c : peers) {
      if (c && c->state.load() == PeerState::kConnected) c->state = PeerState::kClosed;
    }
    peers.assign(peers.size(), nullptr);
    connected = 0;
    cv.notify_all();
  }
  core->forget_group(this);
}

}  // namespace fusedcomm::rdma::socket_backend
