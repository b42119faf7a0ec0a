// The receiver threads: each waits on its epoll set, runs the commands other threads queue
// (attach, detach, rescan, stop) and hands readable sockets to the handshake or data path.
#include "core.h"

#include <sched.h>
#include <sys/epoll.h>

#include <algorithm>

namespace fusedcomm::rdma::socket_backend {

void Core::post(int receiver, Command c) {
  Receiver& r = *receivers_[receiver];
  {
    std::lock_guard<std::mutex> l(r.cmd_mu);
    r.commands.push_back(std::move(c));
  }
  wake(r);
}

void Core::wake(Receiver& r) {
  uint64_t one = 1;
  ssize_t w = ::write(r.event_fd, &one, sizeof one);
  (void)w;
}

void Core::expect_traffic() noexcept {
  if (!busy_poll_.enabled() || !running_) return;
  busy_poll_.open();
  // The window is opened before `sleeping` is read, and a receiver publishes `sleeping` before
  // its last look at the window (both seq_cst): a receiver that goes to sleep anyway is seen
  // here and woken.
  for (auto& r : receivers_) {
    if (r->sleeping.load(std::memory_order_seq_cst)) wake(*r);
  }
}

void Core::attach(const std::shared_ptr<Conn>& c, uint32_t lane) {
  if (!running_) return;
  c->with_receiver = true;
  c->reader = reader_for(lane, c->peer);
  post(c->reader, {Command::kAttach, c});
}

void Core::detach(const std::vector<std::shared_ptr<Conn>>& conns, bool wait) {
  if (!running_) return;
  for (auto& c : conns) {
    if (c) post(c->reader, {Command::kDetach, nullptr, c->id});
  }
  if (!wait) return;
  std::unique_lock<std::mutex> l(detach_mu_);
  detach_cv_.wait_until(l, Clock::now() + kDetachWait, [&] {
    if (!running_) return true;
    for (auto& c : conns) {
      if (c && c->with_receiver) return false;
    }
    return true;
  });
}

void Core::forget_group(const GroupState* g) {
  std::lock_guard<std::mutex> l(groups_mu_);
  auto it = groups_.find(g->comm_id);
  if (it == groups_.end()) return;
  auto cur = it->second.lock();
  if (!cur || cur.get() == g) groups_.erase(it);
}

void Core::drop(Conn* c) {
  Receiver& r = *receivers_[c->reader];
  epoll_ctl(r.epoll_fd, EPOLL_CTL_DEL, c->fd, nullptr);
  auto node = r.conns.extract(c->id);
  {
    // Waiters test with_receiver under detach_mu_, so they see it false only once our
    // reference is gone too (releasing it closes pending sockets).
    std::lock_guard<std::mutex> l(detach_mu_);
    c->with_receiver = false;
    node = {};
  }
  detach_cv_.notify_all();
}

void Core::run(Receiver& r) {
  epoll_event events[64];
  auto last_sweep = Clock::now();
  bool stop = false;
  while (!stop) {
    // Inside the busy-poll window the receiver polls (epoll_wait with no timeout) instead of
    // sleeping: a message then lands within a syscall's time instead of a wake-up's.
    int timeout_ms = 200;
    if (r.index == 0) {
      // Handshakes expire and a paused listener comes back on time, without a busy loop.
      if (handshakes.load(std::memory_order_relaxed) > 0) {
        timeout_ms = static_cast<int>(kHandshakeSweep.count());
      }
      if (accepts_paused_) {
        const auto left = std::chrono::duration_cast<milliseconds>(accept_resume_ - Clock::now()).count();
        timeout_ms = static_cast<int>(std::clamp<int64_t>(left + 1, 0, timeout_ms));
      }
    }
    if (busy_poll_.is_open()) {
      timeout_ms = 0;
    } else if (busy_poll_.enabled()) {
      r.sleeping.store(true, std::memory_order_seq_cst);
      if (busy_poll_.is_open()) timeout_ms = 0;
    }
    int n = epoll_wait(r.epoll_fd, events, 64, timeout_ms);
    r.sleeping.store(false, std::memory_order_relaxed);
    if (n > 0) {
      busy_poll_.open();  // the rest of this op's traffic is likely close behind
    } else if (timeout_ms == 0) {
      sched_yield();  // polling must not hold a core that a thread with work is waiting for
    }
    for (int i = 0; i < n && !stop; ++i) {
      uint64_t id = events[i].data.u64;
      if (id == 0) {
        accept_all();
      } else if (id == 1) {
        process_commands(r, &stop);
      } else {
        auto it = r.conns.find(id);
        if (it == r.conns.end()) continue;
        on_readable(it->second.get());
      }
    }
    if (r.index == 0) {
      const auto now = Clock::now();
      if (now - last_sweep >= kHandshakeSweep) {
        expire_handshakes();
        last_sweep = now;
      }
      if (accepts_paused_ && now >= accept_resume_ && !stop) resume_accepts();
    }
  }
}

void Core::process_commands(Receiver& r, bool* stop) {
  uint64_t v;
  while (::read(r.event_fd, &v, sizeof v) > 0) {}
  std::deque<Command> batch;
  {
    std::lock_guard<std::mutex> l(r.cmd_mu);
    batch.swap(r.commands);
  }
  for (auto& cmd : batch) {
    switch (cmd.kind) {
      case Command::kAttach: {
        std::shared_ptr<Conn> c = std::move(cmd.conn);
        c->since = Clock::now();
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLRDHUP;
        ev.data.u64 = c->id;
        if (epoll_ctl(r.epoll_fd, EPOLL_CTL_ADD, c->fd, &ev) == 0) {
          r.conns.emplace(c->id, std::move(c));
        } else {
          {
            std::lock_guard<std::mutex> l(detach_mu_);
            c->with_receiver = false;
            c.reset();
          }
          detach_cv_.notify_all();
        }
        break;
      }
      case Command::kDetach: {
        auto it = r.conns.find(cmd.conn_id);
        if (it != r.conns.end()) drop(it->second.get());
        break;
      }
      case Command::kRescan: {
        std::vector<Conn*> parked;
        for (auto& [id, c] : r.conns) {
          if (!c->is_data && c->stage == Conn::Stage::kParked) parked.push_back(c.get());
        }
        for (auto& c : parked) try_match(c);
        break;
      }
      case Command::kStop: *stop = true; break;
    }
  }
}

void Core::on_readable(Conn* c) {
  if (c->is_data) {
    read_data(c);
  } else {
    read_handshake(c);
  }
}

}  // namespace fusedcomm::rdma::socket_backend
