// A rail's libfabric objects, control buffers and completions (rail.h).
#include "rail.h"

#include <poll.h>
#include <rdma/fi_errno.h>

#include <cstring>
#include <random>

#include "fusedcomm/rdma/errors.h"

namespace fusedcomm::rdma::libfabric {
namespace {

constexpr uint32_t kRecvBuffers = 256;                  // messages a rail can have arrived but unread
constexpr uint32_t kSendBuffers = 512;                  // messages in flight; more wait in the outbox
constexpr int kKeyAttempts = 16;                        // requested remote keys tried before giving up
constexpr std::chrono::milliseconds kQueuedMax{10000};  // a message the provider never takes

template <class Fid>
void close_fid(Fid*& f) {
  if (f) fi_close(&f->fid);
  f = nullptr;
}

}  // namespace

Rail::Rail(const FabricApi& api, const fi_info& info, int index)
    : api_(api), index_(index), caps_(caps_of(info)) {
  fi_info& in = const_cast<fi_info&>(info);  // libfabric's constructors take non-const pointers
  auto fail = [&](const char* what, int rc) {
    const std::string text = "libfabric " + caps_.provider + " on " + caps_.domain + ": " + what +
                             " failed: " + api_.error_text(rc);
    close();
    throw TransportError(-1, text);
  };
  const SignalGuard keep;  // opening a provider's objects may initialise its libraries
  int rc = api_.fabric(in.fabric_attr, &fabric_, nullptr);
  if (rc) fail("fi_fabric", rc);
  open_ = true;
  rc = fi_domain(fabric_, &in, &domain_, nullptr);
  if (rc) fail("fi_domain", rc);
  fi_av_attr av{};
  av.type = FI_AV_TABLE;
  av.count = 64;
  rc = fi_av_open(domain_, &av, &av_, nullptr);
  if (rc) fail("fi_av_open", rc);
  fi_cq_attr cq{};
  cq.format = FI_CQ_FORMAT_DATA;
  cq.wait_obj = FI_WAIT_FD;  // lets the progress thread sleep until traffic, where available
  if (fi_cq_open(domain_, &cq, &cq_, nullptr) != 0) {
    cq.wait_obj = FI_WAIT_NONE;
    rc = fi_cq_open(domain_, &cq, &cq_, nullptr);
    if (rc) fail("fi_cq_open", rc);
  } else if (fi_control(&cq_->fid, FI_GETWAIT, &wait_fd_) != 0) {
    wait_fd_ = -1;
  }
  rc = fi_endpoint(domain_, &in, &ep_, nullptr);
  if (rc) fail("fi_endpoint", rc);
  if ((rc = fi_ep_bind(ep_, &av_->fid, 0)) != 0) fail("binding the address vector", rc);
  if ((rc = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV)) != 0) fail("binding the completion queue", rc);
  if ((rc = fi_enable(ep_)) != 0) fail("fi_enable", rc);
  std::string name(256, '\0');
  size_t len = name.size();
  rc = fi_getname(&ep_->fid, name.data(), &len);
  if (rc == -FI_ETOOSMALL) {
    name.resize(len);
    rc = fi_getname(&ep_->fid, name.data(), &len);
  }
  if (rc) fail("fi_getname", rc);
  name.resize(len);
  name_ = name;

  slab_.assign(size_t{kRecvBuffers + kSendBuffers} * sizeof(wire::Msg), 0);
  if (caps_.mr_local) {
    try {
      slab_mr_ = register_memory(slab_.data(), slab_.size());
    } catch (const TransportError&) {
      close();
      throw;
    }
  }
  ops_.resize(kRecvBuffers + kSendBuffers);
  std::lock_guard<std::mutex> l(mu_);
  for (uint32_t i = 0; i < kRecvBuffers; ++i) {
    ops_[i].kind = Op::kRecv;
    ops_[i].buffer = i;
    post_recv(i);
  }
  for (uint32_t i = kRecvBuffers; i < kRecvBuffers + kSendBuffers; ++i) {
    ops_[i].kind = Op::kSend;
    ops_[i].buffer = i;
    free_send_.push_back(i);
  }
}

Rail::~Rail() { close(); }

void Rail::close() {
  std::lock_guard<std::mutex> l(mu_);
  if (!open_ && !fabric_) return;
  open_ = false;
  close_fid(ep_);
  close_fid(cq_);
  close_fid(av_);
  if (slab_mr_.mr) fi_close(&slab_mr_.mr->fid);
  slab_mr_ = {};
  close_fid(domain_);
  close_fid(fabric_);
  wait_fd_ = -1;
  for (Op* op : writes_) delete op;  // cancelled with the endpoint: no completion comes back
  writes_.clear();
  outbox_.clear();
}

void Rail::post_recv(uint32_t i) {
  const ssize_t rc = fi_recv(ep_, buffer(i), sizeof(wire::Msg), slab_mr_.desc, FI_ADDR_UNSPEC, &ops_[i]);
  if (rc != 0) unposted_.push_back(i);  // the next poll tries again
}

fi_addr_t Rail::insert(const std::string& raw_name) {
  std::lock_guard<std::mutex> l(mu_);
  if (!open_) throw TransportError(-1, "libfabric transport is shut down");
  auto it = av_index_.find(raw_name);
  if (it != av_index_.end()) return it->second;
  fi_addr_t addr = FI_ADDR_NOTAVAIL;
  const int n = fi_av_insert(av_, raw_name.data(), 1, &addr, 0, nullptr);
  if (n != 1 || addr == FI_ADDR_NOTAVAIL) {
    throw TransportError(-1, "libfabric " + caps_.provider +
                                 ": cannot insert a peer's address into the address"
                                 " vector: " +
                                 (n < 0 ? api_.error_text(n) : std::string("rejected")));
  }
  av_index_.emplace(raw_name, addr);
  return addr;
}

bool Rail::send(fi_addr_t dest, const wire::Msg& m, std::weak_ptr<GroupState> group, int peer, bool counted) {
  std::lock_guard<std::mutex> l(mu_);
  if (!open_) return false;
  outbox_.push_back({dest, m, std::move(group), peer, counted, std::chrono::steady_clock::now()});
  std::vector<Event> failed;
  flush_locked(&failed);
  for (auto& e : failed) failed_.push_back(std::move(e));
  return true;
}

bool Rail::has_backlog() {
  std::lock_guard<std::mutex> l(mu_);
  return !outbox_.empty();
}

void Rail::flush_locked(std::vector<Event>* failed) {
  // One pass over what waits: a message the provider cannot take now (-FI_EAGAIN: its queue is
  // full, or the peer's connection is still being made) keeps its place and the others go
  // ahead, so that one unreachable peer does not hold up the rest. Messages need no order
  // among themselves (wire.h). One that waited kQueuedMax is given up as failed.
  const auto now = std::chrono::steady_clock::now();
  for (size_t left = outbox_.size(); open_ && left > 0 && !free_send_.empty(); --left) {
    Queued q = std::move(outbox_.front());
    outbox_.pop_front();
    const uint32_t i = free_send_.back();
    std::memcpy(buffer(i), &q.msg, sizeof q.msg);
    Op& op = ops_[i];
    op.group = q.group;
    op.peer = q.peer;
    op.counted = q.counted;
    ssize_t rc = fi_send(ep_, buffer(i), sizeof q.msg, slab_mr_.desc, q.dest, &op);
    if (rc == -FI_EAGAIN && now - q.queued < kQueuedMax) {
      op.group.reset();
      outbox_.push_back(std::move(q));
      continue;
    }
    if (rc == 0) {
      free_send_.pop_back();
      continue;
    }
    op.group.reset();
    Event e;
    e.kind = Event::kSendDone;
    e.group = q.group;
    e.peer = q.peer;
    e.counted = q.counted;
    e.error = static_cast<int>(rc);
    e.error_text = rc == -FI_EAGAIN
                       ? "the provider refused it for " + std::to_string(kQueuedMax.count()) + " ms"
                       : api_.error_text(static_cast<int>(rc));
    failed->push_back(std::move(e));
  }
}

int Rail::post_write(Op* op, const void* src, size_t bytes, void* desc, fi_addr_t dest, uint64_t remote_addr,
                     uint64_t remote_key, bool cq_data, uint64_t data) {
  std::lock_guard<std::mutex> l(mu_);
  if (!open_) return -FI_ESHUTDOWN;
  ssize_t rc;
  if (cq_data) {
    rc = fi_writedata(ep_, src, bytes, desc, data, dest, remote_addr, remote_key, op);
  } else {
    iovec iov{const_cast<void*>(src), bytes};
    fi_rma_iov rma{remote_addr, bytes, remote_key};
    fi_msg_rma msg{};
    msg.msg_iov = &iov;
    msg.desc = &desc;
    msg.iov_count = 1;
    msg.addr = dest;
    msg.rma_iov = &rma;
    msg.rma_iov_count = 1;
    msg.context = op;
    // Completes once the bytes are placed at the target: the signal message may follow.
    rc = fi_writemsg(ep_, &msg, FI_DELIVERY_COMPLETE | FI_COMPLETION);
  }
  if (rc == 0) writes_.insert(op);
  return static_cast<int>(rc);
}

int Rail::post_write_with_signal(Op* op, const void* src, size_t bytes, void* desc, fi_addr_t dest,
                                 uint64_t remote_addr, uint64_t remote_key, uint64_t signal_addr,
                                 uint64_t signal_key, uint64_t data) {
  std::lock_guard<std::mutex> l(mu_);
  if (!open_) return -FI_ESHUTDOWN;
  iovec iov[2] = {{const_cast<void*>(src), bytes}, {&op->signal_value, sizeof op->signal_value}};
  void* descs[2] = {desc, nullptr};  // Caps::ordered_iovs providers need no local descriptor
  fi_rma_iov rma[2] = {{remote_addr, bytes, remote_key}, {signal_addr, sizeof op->signal_value, signal_key}};
  fi_msg_rma msg{};
  msg.msg_iov = iov;
  msg.desc = descs;
  msg.iov_count = 2;
  msg.addr = dest;
  msg.rma_iov = rma;
  msg.rma_iov_count = 2;
  msg.context = op;
  msg.data = data;
  const ssize_t rc = fi_writemsg(ep_, &msg, FI_REMOTE_CQ_DATA | FI_COMPLETION);
  if (rc == 0) writes_.insert(op);
  return static_cast<int>(rc);
}

int Rail::poll(std::vector<Event>* events, int max) {
  fi_cq_data_entry entries[32];
  std::lock_guard<std::mutex> l(mu_);
  if (!open_) return 0;
  for (auto& e : failed_) events->push_back(std::move(e));
  failed_.clear();
  std::vector<uint32_t> retry;
  retry.swap(unposted_);
  for (uint32_t i : retry) post_recv(i);
  int total = 0;
  while (total < max) {
    const ssize_t n = fi_cq_read(cq_, entries, std::min<int>(32, max - total));
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(cq_, &err, 0) != 1) break;
      ++total;
      Op* op = ours(err.op_context);
      if (op == nullptr) continue;
      char text[256] = {0};
      const char* why = fi_cq_strerror(cq_, err.prov_errno, err.err_data, text, sizeof text);
      Event e;
      e.error = err.err ? -err.err : -FI_EOTHER;
      e.error_text = api_.error_text(e.error) + (why && *why ? std::string(": ") + why : std::string());
      if (op->kind == Op::kRecv) {
        post_recv(op->buffer);  // a message that did not fit (a stranger's): dropped
        continue;
      }
      if (op->kind == Op::kSend) {
        e.kind = Event::kSendDone;
        e.group = op->group;
        e.peer = op->peer;
        e.counted = op->counted;
        op->group.reset();
        free_send_.push_back(op->buffer);
      } else {
        e.kind = Event::kWriteDone;
        e.op = op;
        writes_.erase(op);
      }
      events->push_back(std::move(e));
      continue;
    }
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i) {
      const fi_cq_data_entry& c = entries[i];
      const bool payload = (c.flags & FI_REMOTE_CQ_DATA) && !(c.flags & FI_MSG);
      // A remote write's completion has a context only where it consumed a posted receive
      // (FI_RX_CQ_DATA); elsewhere the field is not ours to read.
      Op* op = payload && !caps_.rx_cq_data ? nullptr : ours(c.op_context);
      if (payload) {
        Event e;
        e.kind = Event::kPayload;
        e.data = c.data;
        events->push_back(std::move(e));
        if (op && op->kind == Op::kRecv) post_recv(op->buffer);
        continue;
      }
      if (op == nullptr) continue;
      Event e;
      switch (op->kind) {
        case Op::kRecv:
          e.kind = Event::kMessage;
          e.msg_bytes = std::min(c.len, sizeof e.msg);
          std::memcpy(&e.msg, buffer(op->buffer), e.msg_bytes);
          post_recv(op->buffer);
          break;
        case Op::kSend:
          e.kind = Event::kSendDone;
          e.group = op->group;
          e.peer = op->peer;
          e.counted = op->counted;
          op->group.reset();
          free_send_.push_back(op->buffer);
          break;
        case Op::kWrite:
          e.kind = Event::kWriteDone;
          e.op = op;
          writes_.erase(op);
          break;
      }
      events->push_back(std::move(e));
    }
    total += static_cast<int>(n);
  }
  std::vector<Event> failed;
  flush_locked(&failed);
  for (auto& e : failed) events->push_back(std::move(e));
  return total;
}

Op* Rail::ours(void* context) {
  Op* op = static_cast<Op*>(context);
  if (op >= ops_.data() && op < ops_.data() + ops_.size()) return op;
  return writes_.count(op) ? op : nullptr;
}

void Rail::wait(int wake_fd, std::chrono::nanoseconds timeout) {
  pollfd fds[2];
  nfds_t n = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!open_) return;
    if (wait_fd_ >= 0) {
      fid* f = &cq_->fid;
      if (fi_trywait(fabric_, &f, 1) != 0) return;  // something is pending: poll again now
      fds[n++] = {wait_fd_, POLLIN, 0};
    }
  }
  if (wake_fd >= 0) fds[n++] = {wake_fd, POLLIN, 0};
  const auto s = std::chrono::duration_cast<std::chrono::seconds>(timeout);
  timespec ts{static_cast<time_t>(s.count()), static_cast<long>((timeout - s).count())};
  ::ppoll(fds, n, &ts, nullptr);
}

uint64_t Rail::fresh_key() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  const uint64_t mask = caps_.key_bytes >= 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * caps_.key_bytes)) - 1;
  uint64_t k = 0;
  while (k == 0) k = rng() & mask;
  return k;
}

RailMr Rail::register_memory(void* base, uint64_t bytes, uint64_t key) {
  RailMr out;
  if (bytes == 0) return out;  // nothing to write into
  std::lock_guard<std::mutex> l(mu_);
  if (!open_) throw TransportError(-1, "libfabric transport is shut down");
  int rc = 0;
  for (int attempt = 0; attempt < (key ? 1 : kKeyAttempts); ++attempt) {
    // Requested keys are random, so that a stranger cannot guess one; the provider's own keys
    // (FI_MR_PROV_KEY) are what they are.
    const uint64_t requested = caps_.prov_key ? 0 : key ? key : fresh_key();
    rc = fi_mr_reg(domain_, base, bytes, FI_SEND | FI_RECV | FI_WRITE | FI_REMOTE_WRITE, 0, requested, 0,
                   &out.mr, nullptr);
    if (rc != -FI_ENOKEY) break;
  }
  if (rc == -FI_ENOKEY && key) throw KeyTaken();
  if (rc) {
    throw TransportError(-1, "libfabric " + caps_.provider + ": registering " + std::to_string(bytes) +
                                 " bytes failed: " + api_.error_text(rc) +
                                 " (is the locked-memory limit, ulimit -l, high enough?)");
  }
  if (caps_.mr_endpoint) {
    rc = fi_mr_bind(out.mr, &ep_->fid, 0);
    if (rc == 0) rc = fi_mr_enable(out.mr);
    if (rc) {
      fi_close(&out.mr->fid);
      throw TransportError(-1, "libfabric " + caps_.provider +
                                   ": binding a registration to the endpoint"
                                   " failed: " +
                                   api_.error_text(rc));
    }
  }
  out.key = fi_mr_key(out.mr);
  out.desc = fi_mr_desc(out.mr);
  return out;
}

void Rail::deregister(const RailMr& mr) {
  if (!mr.mr) return;
  std::lock_guard<std::mutex> l(mu_);
  if (open_) fi_close(&mr.mr->fid);
}

}  // namespace fusedcomm::rdma::libfabric
