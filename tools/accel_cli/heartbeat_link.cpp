// The launchers' connections and their handshake; heartbeat_link.hpp says what each part is for.
#include "heartbeat_link.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <stdexcept>

#include "heartbeat.hpp"
#include "job_secret.hpp"

namespace accel::cli {
namespace {

using steady_clock = std::chrono::steady_clock;
using system_clock = std::chrono::system_clock;

// A longer line is not the keep-alive's: the connection is dropped.
constexpr std::size_t longest_keepalive_line = 4096;
constexpr std::size_t seal_length = 64;  // a keyed hash in hexadecimal

std::string clock_time(system_clock::time_point time) {
  const std::time_t seconds = system_clock::to_time_t(time);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%H:%M:%S UTC", &utc);
  return text;
}

std::string silence_text(steady_clock::duration duration) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", std::chrono::duration<double>(duration).count());
  return text;
}

// Each hash says what it is for, so that no value of one can stand for another.
std::string keyed(std::string_view secret, std::string_view purpose, std::string_view challenge, std::string_view nonce,
                  std::string_view words = {}) {
  std::string message = "accel launch ";
  message.append(purpose).append("\n").append(challenge).append("\n").append(nonce).append("\n").append(words);
  return hex(hmac_sha256(secret, message));
}

// The seal of line number `number` going from node 0 (`from_main_node`) or to it, under the connection's key.
std::string seal(const std::string& key, bool from_main_node, std::uint64_t number, std::string_view text) {
  std::string message = from_main_node ? "from node 0 " : "to node 0 ";
  message.append(std::to_string(number)).append("\n").append(text);
  return hex(hmac_sha256(key, message));
}

bool is_numeric_address(const std::string& host) {
  unsigned char address[sizeof(in6_addr)];
  return inet_pton(AF_INET, host.c_str(), address) == 1 || inet_pton(AF_INET6, host.c_str(), address) == 1;
}

bool is_loopback(const sockaddr* address) {
  if (address->sa_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(address)->sin_addr.s_addr) >> 24) == 127;
  return address->sa_family == AF_INET6 &&
         IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr);
}

// A listening socket on `port` of every interface, for IPv6 and IPv4 where the host has IPv6, else IPv4 alone.
int listen_on(int port) {
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_storage address{};
  socklen_t length = 0;
  if (fd >= 0) {
    const int no = 0;
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &no, sizeof no);
    auto& ipv6 = reinterpret_cast<sockaddr_in6&>(address);
    ipv6.sin6_family = AF_INET6;
    ipv6.sin6_addr = in6addr_any;
    ipv6.sin6_port = htons(static_cast<std::uint16_t>(port));
    length = sizeof ipv6;
  } else {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    auto& ipv4 = reinterpret_cast<sockaddr_in&>(address);
    ipv4.sin_family = AF_INET;
    ipv4.sin_addr.s_addr = htonl(INADDR_ANY);
    ipv4.sin_port = htons(static_cast<std::uint16_t>(port));
    length = sizeof ipv4;
  }
  const int yes = 1;  // a job started again at once finds the port of the last one still in TIME_WAIT
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  if (fd < 0 || bind(fd, reinterpret_cast<const sockaddr*>(&address), length) != 0 || listen(fd, 64) != 0) {
    const int error = errno;
    if (fd >= 0) close(fd);
    throw std::runtime_error("cannot listen for the other nodes' heartbeats on port " + std::to_string(port) + ": " +
                             std::strerror(error) +
                             "; give a free port with --heartbeat_port (the same on every node), or turn the "
                             "heartbeat off with --heartbeat_timeout 0");
  }
  return fd;
}

// A listening socket bound to `address`, or -1 (errno says why).
int listen_bound(const addrinfo& address) {
  const int fd = socket(address.ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  const int yes = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  if (address.ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &yes, sizeof yes);
  if (bind(fd, address.ai_addr, address.ai_addrlen) == 0 && listen(fd, 64) == 0) return fd;
  const int error = errno;
  close(fd);
  errno = error;
  return -1;
}

}  // namespace

std::string printable(std::string_view text) {
  std::string shown;
  shown.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    const bool c1 = byte == 0xc2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(text[i + 1]) <= 0x9f;  // U+0080 to U+009F in UTF-8
    if ((byte < 0x20 && byte != '\t') || byte == 0x7f || c1) {
      char escaped[5];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", c1 ? static_cast<unsigned char>(text[++i]) : byte);
      shown += escaped;
    } else {
      shown += static_cast<char>(byte);
    }
  }
  return shown;
}

std::string node_proof(std::string_view secret, std::string_view challenge, std::string_view nonce,
                       std::string_view words) {
  return keyed(secret, "node", challenge, nonce, words);
}

std::string main_node_proof(std::string_view secret, std::string_view challenge, std::string_view nonce) {
  return keyed(secret, "node 0", challenge, nonce);
}

std::string connection_key(std::string_view secret, std::string_view challenge, std::string_view nonce) {
  return keyed(secret, "connection", challenge, nonce);
}

void peer_link::heard() {
  last_heard = steady_clock::now();
  last_heard_clock = system_clock::now();
}

void peer_link::send_line(const std::string& line) const {
  std::string data = line;
  if (proved()) data.append(" ").append(seal(key, from_main_node, sent++, line));
  data += "\n";
  [[maybe_unused]] const ssize_t written = send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

std::vector<std::string> peer_link::read_lines(bool& ended) {
  char buffer[4096];
  for (;;) {
    const ssize_t n = recv(fd, buffer, sizeof buffer, MSG_DONTWAIT);
    if (n > 0) {
      pending.append(buffer, static_cast<std::size_t>(n));
      if (pending.size() > 64 * longest_keepalive_line) break;  // judged below, read no further
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      ended = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
      break;
    }
  }
  std::vector<std::string> lines;
  std::size_t start = 0;
  for (std::size_t end; (end = pending.find('\n', start)) != std::string::npos; start = end + 1) {
    if (end - start > longest_keepalive_line + seal_length + 1) ended = true;
    lines.push_back(pending.substr(start, end - start));
  }
  pending.erase(0, start);
  if (pending.size() > longest_keepalive_line + seal_length + 1) ended = true;
  return lines;
}

std::optional<std::string> peer_link::open(const std::string& line) {
  const std::size_t space = line.rfind(' ');
  if (space == std::string::npos || line.size() - space - 1 != seal_length) return std::nullopt;
  const std::string text = line.substr(0, space);
  if (!same_secret_text(line.substr(space + 1), seal(key, !from_main_node, received, text))) return std::nullopt;
  ++received;
  heard();
  return printable(text);
}

std::optional<std::string> peer_link::why_lost(bool ended, std::chrono::milliseconds timeout) const {
  if (!left.empty()) return left;
  if (said_bye) return std::nullopt;
  if (ended) {
    return "its launcher's connection ended at " + clock_time(system_clock::now()) +
           " without a goodbye (the launcher was killed)";
  }
  if (!heartbeat_stale(last_heard, steady_clock::now(), timeout)) return std::nullopt;
  return "its launcher has not been heard for " + silence_text(steady_clock::now() - last_heard) + ", since " +
         clock_time(last_heard_clock) + " (its machine is down, its network link is cut, or its launcher is stopped)";
}

void peer_link::close_link() {
  if (fd >= 0) close(fd);
  fd = -1;
}

std::string address_of(const sockaddr_storage& address) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (address.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(address).sin_addr, text, sizeof text);
  } else if (address.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(address).sin6_addr, text, sizeof text);
  }
  std::string_view shown = text;
  if (shown.starts_with("::ffff:")) shown.remove_prefix(7);  // an IPv4 peer of a dual-stack socket
  return std::string(shown);
}

int listen_at(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return -1;
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  const bool listening = fd >= 0 && bind(fd, found->ai_addr, found->ai_addrlen) == 0 && listen(fd, 64) == 0;
  freeaddrinfo(found);
  if (listening) return fd;
  if (fd >= 0) close(fd);
  return -1;
}

std::vector<int> listen_for_nodes(const std::string& host, int port, bool all_interfaces) {
  if (all_interfaces) return {listen_on(port)};
  const std::string where =
      "cannot listen for the other nodes' heartbeats at " + host + " port " + std::to_string(port) + ": ";
  const std::string fix =
      "; node 0 listens on the address the other nodes connect to (--master_addr), which must be one of this "
      "machine's, on a free port (--heartbeat_port, the same on every node); --heartbeat_all_interfaces listens on "
      "every interface instead";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int error = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); error != 0)
    throw std::runtime_error(where + "cannot resolve " + host + " (" + gai_strerror(error) + ")" + fix);
  std::vector<int> listeners;
  int error = 0;
  bool loopback = false;
  for (const addrinfo* address = found; address != nullptr; address = address->ai_next) {
    const int fd = listen_bound(*address);
    if (fd >= 0) listeners.push_back(fd);
    if (fd < 0) error = errno;
    loopback = loopback || (fd >= 0 && is_loopback(address->ai_addr));
  }
  freeaddrinfo(found);
  if (listeners.empty()) throw std::runtime_error(where + std::strerror(error) + fix);
  if (loopback && !is_numeric_address(host)) {
    std::fprintf(stderr,
                 "accel launch: warning: --master_addr %s is a loopback address on this machine: node 0's heartbeat "
                 "port listens there, where other machines cannot reach it; give node 0's network address, or "
                 "--heartbeat_all_interfaces\n",
                 host.c_str());
  }
  return listeners;
}

}  // namespace accel::cli
