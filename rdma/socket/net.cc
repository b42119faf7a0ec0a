// Plain socket helpers of the socket backend (net.h).
#include "net.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <algorithm>
#include <sstream>
#include <system_error>

#include "fusedcomm/rdma/errors.h"

namespace fusedcomm::rdma::socket_backend {
namespace {

bool is_loopback(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr) >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr);
  }
  return false;
}

}  // namespace

std::string errno_text(int e) { return std::error_code(e, std::generic_category()).message(); }

[[noreturn]] void throw_sys(const std::string& what, int e) {
  throw TransportError(-1, "socket transport: " + what + ": " + errno_text(e));
}

bool split_host_port(const std::string& a, std::string* host, std::string* port) {
  if (!a.empty() && a[0] == '[') {
    size_t close = a.find(']');
    if (close == std::string::npos || close + 1 >= a.size() || a[close + 1] != ':') return false;
    *host = a.substr(1, close - 1);
    *port = a.substr(close + 2);
  } else {
    size_t colon = a.rfind(':');
    if (colon == std::string::npos || colon == 0) return false;
    *host = a.substr(0, colon);
    *port = a.substr(colon + 1);
  }
  return !port->empty();
}

std::string join_host_port(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

std::string numeric_host(const sockaddr* sa, socklen_t len) {
  char buf[NI_MAXHOST];
  if (getnameinfo(sa, len, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) != 0) return "?";
  return buf;
}

std::vector<std::string> host_address_candidates() {
  std::vector<std::string> out;
  auto add = [&](const std::string& a) {
    if (!a.empty() && a != "?" && std::find(out.begin(), out.end(), a) == out.end()) out.push_back(a);
  };
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) == 0) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (getaddrinfo(name, nullptr, &hints, &res) == 0) {
      for (addrinfo* p = res; p; p = p->ai_next) {
        if (!is_loopback(p->ai_addr)) add(numeric_host(p->ai_addr, p->ai_addrlen));
      }
      freeaddrinfo(res);
    }
  }
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) == 0) {
    for (ifaddrs* p = ifs; p; p = p->ifa_next) {
      if (p->ifa_addr && p->ifa_addr->sa_family == AF_INET && (p->ifa_flags & IFF_UP) &&
          !(p->ifa_flags & IFF_LOOPBACK)) {
        add(numeric_host(p->ifa_addr, sizeof(sockaddr_in)));
      }
    }
    freeifaddrs(ifs);
  }
  add("127.0.0.1");
  return out;
}

std::string primary_host_address() { return host_address_candidates().front(); }

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

bool send_now(int fd, const void* p, size_t n) {
  ssize_t r = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
  return r == static_cast<ssize_t>(n);
}

}  // namespace fusedcomm::rdma::socket_backend
