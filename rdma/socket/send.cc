// The send path: PeerGroup::write posts a header and its payload on the peer's connection,
// waiting (bounded) while the socket buffer is full and failing once the peer is known dead.
#include "core.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>

namespace fusedcomm::rdma::socket_backend {

void GroupState::send_message(Conn& c, const wire::WireHeader& h, const char* payload) {
  iovec iov[2];
  iov[0].iov_base = const_cast<wire::WireHeader*>(&h);
  iov[0].iov_len = sizeof h;
  iov[1].iov_base = const_cast<char*>(payload);
  iov[1].iov_len = h.bytes;
  int iovcnt = h.bytes ? 2 : 1;
  int first = 0;
  auto last_progress = Clock::now();
  auto fail = [&](const std::string& msg) {
    std::string text;
    {
      std::lock_guard<std::mutex> l(mu);
      fail_locked(c, msg);
      text = c.error.empty() ? msg : c.error;
    }
    ::shutdown(c.fd, SHUT_RDWR);  // the stream may be cut mid-message: nothing more is valid
    throw TransportError(c.peer, text);
  };
  while (first < iovcnt) {
    msghdr m{};
    m.msg_iov = iov + first;
    m.msg_iovlen = static_cast<size_t>(iovcnt - first);
    ssize_t r = ::sendmsg(c.fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r > 0) {
      last_progress = Clock::now();
      size_t left = static_cast<size_t>(r);
      while (first < iovcnt && left >= iov[first].iov_len) {
        left -= iov[first].iov_len;
        ++first;
      }
      if (first < iovcnt) {
        iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
        iov[first].iov_len -= left;
      }
      continue;
    }
    int e = r < 0 ? errno : EPIPE;
    if (e == EINTR) continue;
    if (e != EAGAIN && e != EWOULDBLOCK) {
      if (aborted) throw TransportError(-1, self() + ": the group was aborted");
      fail(who(c.peer) +
           (e == EPIPE || e == ECONNRESET ? " closed the connection" : ": send failed: " + errno_text(e)));
    }
    pollfd p{c.fd, POLLOUT, 0};
    ::poll(&p, 1, kPollSliceMs);
    if (aborted) throw TransportError(-1, self() + ": the group was aborted");
    PeerState st = c.state.load();
    if (st != PeerState::kConnected) {
      std::string text;
      {
        std::lock_guard<std::mutex> l(mu);
        text = c.error.empty() ? who(c.peer) + " has closed the group" : c.error;
      }
      ::shutdown(c.fd, SHUT_RDWR);
      throw TransportError(c.peer, text);
    }
    if (Clock::now() - last_progress > kSendStallTimeout) {
      fail("sending to " + who(c.peer) + " made no progress for " +
           std::to_string(kSendStallTimeout.count()) + " ms");
    }
  }
}

void GroupState::write(const WriteOp& op) {
  if (aborted) throw TransportError(-1, self() + ": the group was aborted");
  if (op.peer < 0 || op.peer >= world) {
    throw std::invalid_argument("write: peer " + std::to_string(op.peer) + " is not in [0, " +
                                std::to_string(world) + ")");
  }
  if (op.signal_key && op.signal_offset % 8) {
    throw std::invalid_argument("write: signal_offset must be 8-byte aligned");
  }
  if (op.peer == rank) {
    core->local_write(op);
    return;
  }
  std::shared_ptr<Conn> c;
  {
    std::lock_guard<std::mutex> l(mu);
    if (phase != Phase::kLive) throw TransportError(-1, self() + ": the group is closed");
    c = peers[op.peer];
    if (!c) throw TransportError(op.peer, who(op.peer) + " is not connected");
    if (c->state.load() != PeerState::kConnected) {
      throw TransportError(op.peer, c->error.empty() ? who(op.peer) + " has closed the group" : c->error);
    }
  }
  const char* src = op.bytes ? core->source(op.src_key, op.src_offset, op.bytes) : nullptr;
  wire::WireHeader h{};
  h.magic = wire::kDataMagic;
  h.kind = wire::kData;
  h.dst_key = op.dst_key;
  h.dst_offset = op.dst_offset;
  h.bytes = op.bytes;
  h.signal_key = op.signal_key;
  h.signal_offset = op.signal_offset;
  h.signal_value = op.signal_value;
  std::lock_guard<std::mutex> sl(c->send_mu);
  send_message(*c, h, src);
  core->bytes_sent.fetch_add(op.bytes, std::memory_order_relaxed);
}

}  // namespace fusedcomm::rdma::socket_backend
