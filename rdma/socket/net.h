// Plain socket helpers of the socket backend: error text, address parsing and formatting, the
// host's primary address, socket options. No backend state.
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fusedcomm::rdma::socket_backend {

// strerror for `e`, thread-safe.
std::string errno_text(int e);
// Throws TransportError(-1, "socket transport: <what>: <errno text>").
[[noreturn]] void throw_sys(const std::string& what, int e);

// "host:port" or "[v6 host]:port"; false if `a` is not of that shape.
bool split_host_port(const std::string& a, std::string* host, std::string* port);
std::string join_host_port(const std::string& host, int port);
// The numeric host of a socket address, "?" if it has none.
std::string numeric_host(const sockaddr* sa, socklen_t len);
// The host's own addresses, best first: the host name's non-loopback addresses, then the up,
// non-loopback IPv4 interfaces; 127.0.0.1 last (a host without a network). The listener binds
// the first that it can when the options name no bind host.
std::vector<std::string> host_address_candidates();
// The address peers should use when the options name none: the first candidate above.
std::string primary_host_address();

void set_nodelay(int fd);
// Sends all of [p, p+n) on a non-blocking socket without waiting; false if it would block or
// fails. Only used for handshake messages (48 bytes on an idle socket).
bool send_now(int fd, const void* p, size_t n);

}  // namespace fusedcomm::rdma::socket_backend
