// Reading a data connection on its receiver: headers are checked against the registry,
// payloads land straight in registered memory, then the signal; EOF, resets and protocol
// violations end the connection and mark the peer.
#include "core.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

namespace fusedcomm::rdma::socket_backend {

bool Core::validate(const wire::WireHeader& h, std::string* why) const {
  std::shared_lock<std::shared_mutex> l(reg_mu_);
  return check_header(h, regions_, why);
}

bool check_header(const wire::WireHeader& h, const std::unordered_map<uint64_t, Region>& regions,
                  std::string* why) {
  return check_write(regions, h.dst_key, h.dst_offset, h.bytes, h.signal_key, h.signal_offset, why);
}

void Core::apply_signal(const wire::WireHeader& h) {
  if (!h.signal_key) return;
  std::shared_lock<std::shared_mutex> l(reg_mu_);
  auto it = regions_.find(h.signal_key);
  if (it == regions_.end()) return;  // deregistered meanwhile: nobody is waiting on it
  store_max_release(static_cast<char*>(it->second.base) + h.signal_offset, h.signal_value);
}

void Core::end_data_conn(Conn* c, const std::string& msg, bool protocol_error) {
  auto g = c->group.lock();
  if (!g) {
    if (protocol_error) ::shutdown(c->fd, SHUT_RDWR);
    drop(c);
    return;
  }
  // drop() runs under the group's lock: a connect() that finds the slot freed below (and
  // so does not wait for this connection) must also find its socket closed and uncounted.
  std::lock_guard<std::mutex> l(g->mu);
  if (g->phase == Phase::kConnecting) {
    // Not part of a live group yet: free the slot so that the rank may dial again.
    if (g->peers[c->peer].get() == c) {
      g->peers[c->peer].reset();
      g->connected--;
      g->lost[c->peer] = true;
    }
    c->state = PeerState::kClosed;
  } else if (g->aborted || g->phase == Phase::kDone || c->bye_seen) {
    if (c->state == PeerState::kConnected) c->state = PeerState::kClosed;
  } else {
    g->fail_locked(*c, msg);
  }
  if (protocol_error) ::shutdown(c->fd, SHUT_RDWR);  // after the failure is recorded: writers report it
  drop(c);
  g->cv.notify_all();
}

void Core::read_data(Conn* c) {
  auto who = [&] {
    auto g = c->group.lock();
    return g ? g->who(c->peer) : "peer rank " + std::to_string(c->peer) + " at " + c->peer_addr;
  };
  uint64_t budget = kRecvBudget;
  while (budget > 0) {
    ssize_t r;
    if (!c->in_payload) {
      r = ::recv(c->fd, reinterpret_cast<char*>(&c->hdr) + c->hdr_got, sizeof(wire::WireHeader) - c->hdr_got,
                 MSG_DONTWAIT);
    } else {
      std::shared_lock<std::shared_mutex> l(reg_mu_);
      auto it = regions_.find(c->hdr.dst_key);
      if (it == regions_.end()) {
        l.unlock();
        end_data_conn(
            c,
            who() + " wrote to region " + hex(c->hdr.dst_key) + ", which was deregistered during the write",
            true);
        return;
      }
      char* dst = static_cast<char*>(it->second.base) + c->hdr.dst_offset + c->payload_got;
      size_t want = static_cast<size_t>(std::min<uint64_t>(c->hdr.bytes - c->payload_got, kRecvChunk));
      r = ::recv(c->fd, dst, want, MSG_DONTWAIT);
    }
    if (r < 0) {
      int e = errno;
      if (e == EAGAIN || e == EWOULDBLOCK || e == EINTR) return;
      if (e == ECONNRESET) {
        end_data_conn(c, who() + " reset the connection", false);
      } else {
        end_data_conn(c, who() + ": receive failed: " + errno_text(e), false);
      }
      return;
    }
    if (r == 0) {
      if (c->in_payload || c->hdr_got) {
        end_data_conn(c, who() + " closed the connection in the middle of a message", false);
      } else {
        end_data_conn(c, who() + " closed the connection", false);
      }
      return;
    }
    budget -= std::min<uint64_t>(budget, static_cast<uint64_t>(r));
    if (c->in_payload) {
      c->payload_got += static_cast<uint64_t>(r);
      bytes_received.fetch_add(static_cast<uint64_t>(r), std::memory_order_relaxed);
      if (c->payload_got == c->hdr.bytes) {
        c->in_payload = false;
        apply_signal(c->hdr);
      }
      continue;
    }
    c->hdr_got += static_cast<size_t>(r);
    if (c->hdr_got < sizeof(wire::WireHeader)) continue;
    c->hdr_got = 0;
    const wire::WireHeader& h = c->hdr;
    if (h.magic != wire::kDataMagic || (h.kind != wire::kData && h.kind != wire::kBye)) {
      end_data_conn(c, who() + " broke the protocol (bad message header)", true);
      return;
    }
    if (c->bye_seen) {
      end_data_conn(c, who() + " sent data after closing the group", true);
      return;
    }
    if (h.kind == wire::kBye) {
      c->bye_seen = true;
      if (auto g = c->group.lock()) {
        std::lock_guard<std::mutex> l(g->mu);
        if (c->state == PeerState::kConnected) c->state = PeerState::kClosed;
        g->cv.notify_all();
      }
      continue;
    }
    std::string why;
    if (!validate(h, &why)) {
      end_data_conn(c, who() + " " + why, true);
      return;
    }
    if (h.bytes == 0) {
      apply_signal(h);
    } else {
      c->in_payload = true;
      c->payload_got = 0;
    }
  }
}

}  // namespace fusedcomm::rdma::socket_backend
