// The keep-alive between the launchers of a job of several nodes.
//
// Design. Node 0's launcher listens on --heartbeat_port (default: --master_port + 1); every other node's launcher
// connects to it (again every 0.2 s until it answers) and says "hello NODE NPROC", answered by "welcome". Both ends
// then send "beat" every --heartbeat_interval seconds, and each takes the other for lost when it has heard nothing from
// it for --heartbeat_timeout seconds (its machine or its link is down: no connection is closed), or when the
// connection ends without "bye" (its launcher was killed). A star, not a mesh: node 0 watches every node, every
// node watches node 0, and node 0 tells the others which node it lost ("lost MESSAGE"), so that the loss of node 2
// stops node 1 too. A launcher whose job has ended says "bye CODE" first, and is no longer watched.
// Lines of text over TCP, read and written without blocking inside the supervisor's poll() loop: no thread, since
// the launcher forks its workers, which a second thread would make unsafe.
// A node is watched from the moment its launcher has connected: if one vanishes before, the workers waiting for it
// at the job's start give up after their own timeout.
#include "heartbeat.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

namespace accel::cli {
namespace {

using steady_clock = std::chrono::steady_clock;
using system_clock = std::chrono::system_clock;

constexpr std::size_t longest_line = 4096;  // a longer line is not the keep-alive's: the connection is dropped

std::string clock_time(system_clock::time_point time) {
  const std::time_t seconds = system_clock::to_time_t(time);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%H:%M:%S UTC", &utc);
  return text;
}

std::string seconds_text(steady_clock::duration duration) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", std::chrono::duration<double>(duration).count());
  return text;
}

std::string ranks_of(int node, int nproc) {
  const int first = node * nproc;
  if (nproc == 1) return "rank " + std::to_string(first);
  if (nproc > 4) return "ranks " + std::to_string(first) + " to " + std::to_string(first + nproc - 1);
  std::string ranks = "ranks ";
  for (int rank = first; rank < first + nproc; ++rank) ranks += (rank == first ? "" : ", ") + std::to_string(rank);
  return ranks;
}

// What the user reads after the lost node's name and why: what it means and what to do.
std::string advice(const heartbeat_options& options) {
  return ". The job cannot go on without it: check that machine and its network, then start the job again on every "
         "node (a job with resume::latest goes on from its newest checkpoint). A node is taken for lost after " +
         seconds_text(options.timeout) + " without a heartbeat (--heartbeat_timeout)";
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

// One connection to another node's launcher.
struct peer_link {
  int fd = -1;
  int node = -1;  // the node at the other end (on node 0: -1 until it has said hello)
  int nproc = 0;
  std::string address;   // the peer's, for messages
  std::string pending;   // what followed the last '\n' read
  std::string reported;  // on node 0: the loss this node found and reported ("lost MESSAGE")
  steady_clock::time_point last_heard = steady_clock::now();
  system_clock::time_point last_heard_clock = system_clock::now();
  bool said_bye = false;

  void heard() {
    last_heard = steady_clock::now();
    last_heard_clock = system_clock::now();
  }

  // A full socket buffer drops the line: a peer that does not read is judged by its own silence.
  void send_line(const std::string& line) const {
    const std::string data = line + "\n";
    [[maybe_unused]] const ssize_t sent = send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }

  // The complete lines that arrived; `ended` when the connection is over (closed, reset, or not the keep-alive's).
  std::vector<std::string> read_lines(bool& ended) {
    char buffer[4096];
    for (;;) {
      const ssize_t n = recv(fd, buffer, sizeof buffer, MSG_DONTWAIT);
      if (n > 0) {
        pending.append(buffer, static_cast<std::size_t>(n));
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        ended = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
        break;
      }
    }
    std::vector<std::string> lines;
    std::size_t start = 0;
    for (std::size_t end; (end = pending.find('\n', start)) != std::string::npos; start = end + 1)
      lines.push_back(pending.substr(start, end - start));
    pending.erase(0, start);
    if (pending.size() > longest_line) ended = true;
    if (!lines.empty()) heard();
    return lines;
  }

  // Why the peer is lost, or nothing while it is not: silent beyond `timeout`, or gone without a goodbye.
  std::optional<std::string> why_lost(bool ended, std::chrono::milliseconds timeout) const {
    if (said_bye) return std::nullopt;
    if (ended) {
      return "its launcher's connection ended at " + clock_time(system_clock::now()) +
             " without a goodbye (the launcher was killed)";
    }
    if (!heartbeat_stale(last_heard, steady_clock::now(), timeout)) return std::nullopt;
    return "its launcher has not been heard for " + seconds_text(steady_clock::now() - last_heard) + ", since " +
           clock_time(last_heard_clock) + " (its machine is down, its network link is cut, or its launcher is stopped)";
  }

  void close_link() {
    if (fd >= 0) close(fd);
    fd = -1;
  }
};

std::string words_after(const std::string& line, std::string_view first_word) {
  return line.starts_with(first_word) ? line.substr(first_word.size()) : std::string();
}

// A listening socket on `port`, for IPv6 and IPv4 where the host has IPv6, else IPv4 alone.
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

// ---------------------------------------------------------------------------------------------------------------
// Node 0: watches every other node.

class main_node_heartbeat final : public peer_watch {
 public:
  explicit main_node_heartbeat(const heartbeat_options& options)
      : options_(options), listener_(listen_on(options.port)) {}

  ~main_node_heartbeat() override {
    for (peer_link& link : links_) link.close_link();
    close(listener_);
  }

  main_node_heartbeat(const main_node_heartbeat&) = delete;
  main_node_heartbeat& operator=(const main_node_heartbeat&) = delete;

  void add_fds(std::vector<pollfd>& fds) const override {
    if (finished_) return;
    fds.push_back({listener_, POLLIN, 0});
    for (const peer_link& link : links_) fds.push_back({link.fd, POLLIN, 0});
  }

  steady_clock::time_point next_wakeup() const override {
    if (finished_) return steady_clock::time_point::max();
    steady_clock::time_point wake = next_beat_;
    for (const peer_link& link : links_) {
      if (!link.said_bye) wake = std::min(wake, link.last_heard + options_.timeout);
    }
    return wake;
  }

  std::optional<std::string> on_wakeup() override {
    if (finished_) return std::nullopt;
    accept_all();
    std::optional<std::string> lost;
    for (peer_link& link : links_) {
      bool ended = false;
      for (const std::string& line : link.read_lines(ended)) on_line(link, line);
      if (link.node < 0 || lost) {
        if (ended || (link.node < 0 && heartbeat_stale(link.last_heard, steady_clock::now(), options_.timeout)))
          link.close_link();  // not a launcher of this job, or one that never said hello
        continue;
      }
      if (!link.reported.empty()) {
        lost = link.reported + " (found by node " + std::to_string(link.node) + ")";
        link.close_link();
      } else if (const std::optional<std::string> why = link.why_lost(ended, options_.timeout)) {
        lost = "node " + std::to_string(link.node) + " (" + ranks_of(link.node, link.nproc) + ", at " + link.address +
               ") is lost: " + *why;
        // A launcher that was only stopped reads this when it runs again, and stops too.
        link.send_line("lost " + *lost + " (found by node 0)");
        link.close_link();
      } else if (ended) {
        link.close_link();  // it said bye
      }
    }
    std::erase_if(links_, [](const peer_link& link) { return link.fd < 0; });
    if (lost) return report(*lost);
    beat_if_due();
    return std::nullopt;
  }

  void finish(int exit_code) override {
    for (peer_link& link : links_) {
      link.send_line("bye " + std::to_string(exit_code));
      link.close_link();
    }
    links_.clear();
    finished_ = true;
  }

 private:
  void accept_all() {
    for (;;) {
      sockaddr_storage address{};
      socklen_t length = sizeof address;
      const int fd = accept4(listener_, reinterpret_cast<sockaddr*>(&address), &length, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) return;
      peer_link link;
      link.fd = fd;
      link.address = address_of(address);
      links_.push_back(std::move(link));
    }
  }

  void on_line(peer_link& link, const std::string& line) {
    if (const std::string hello = words_after(line, "hello "); link.node < 0 && !hello.empty()) {
      int node = -1, nproc = 0;
      if (std::sscanf(hello.c_str(), "%d %d", &node, &nproc) != 2 || node < 1 || node >= options_.nnodes || nproc < 1) {
        std::fprintf(stderr, "accel launch: ignoring a heartbeat from %s that is not of this job's nodes ('%s')\n",
                     link.address.c_str(), line.c_str());
        return;
      }
      for (peer_link& other : links_) {
        if (other.node == node) other.close_link();  // an earlier launcher of the same node
      }
      link.node = node;
      link.nproc = nproc;
      link.send_line("welcome");
    } else if (line.starts_with("bye")) {
      link.said_bye = true;
    } else if (line.starts_with("lost ") && link.node > 0) {
      link.reported = line.substr(5);
    }
  }

  // Tells the other nodes which node is lost (each then stops its workers) and stops watching.
  std::string report(const std::string& lost) {
    for (const peer_link& link : links_) {
      if (link.node > 0 && !link.said_bye) link.send_line("lost " + lost + " (found by node 0)");
    }
    finished_ = true;
    return lost + advice(options_);
  }

  void beat_if_due() {
    const steady_clock::time_point now = steady_clock::now();
    if (now < next_beat_) return;
    for (const peer_link& link : links_) {
      if (link.node > 0) link.send_line("beat");
    }
    next_beat_ = now + options_.interval;
  }

  heartbeat_options options_;
  int listener_;
  std::vector<peer_link> links_;
  steady_clock::time_point next_beat_ = steady_clock::now();
  bool finished_ = false;
};

// ---------------------------------------------------------------------------------------------------------------
// The other nodes: each watches node 0, and hears from it which other node is lost.

class other_node_heartbeat final : public peer_watch {
 public:
  explicit other_node_heartbeat(const heartbeat_options& options) : options_(options) {}

  ~other_node_heartbeat() override { link_.close_link(); }

  other_node_heartbeat(const other_node_heartbeat&) = delete;
  other_node_heartbeat& operator=(const other_node_heartbeat&) = delete;

  void add_fds(std::vector<pollfd>& fds) const override {
    if (link_.fd >= 0) fds.push_back({link_.fd, static_cast<short>(connected_ ? POLLIN : POLLOUT), 0});
  }

  steady_clock::time_point next_wakeup() const override {
    if (finished_) return steady_clock::time_point::max();
    if (!connected_) return link_.fd >= 0 ? connect_deadline_ : next_attempt_;
    return std::min(next_beat_, link_.last_heard + options_.timeout);
  }

  std::optional<std::string> on_wakeup() override {
    if (finished_) return std::nullopt;
    if (!connected_ && !advance_connection()) return std::nullopt;
    bool ended = false;
    const std::vector<std::string> lines = link_.read_lines(ended);
    if (!welcomed_ && std::find(lines.begin(), lines.end(), "welcome") == lines.end()) {
      // Not node 0's launcher yet (what accepted the connection may be something else): watched once welcomed.
      if (ended || heartbeat_stale(link_.last_heard, steady_clock::now(), options_.timeout)) retry_later();
      return std::nullopt;
    }
    welcomed_ = true;
    for (const std::string& line : lines) {
      if (line.starts_with("bye")) link_.said_bye = true;
      if (const std::string lost = words_after(line, "lost "); !lost.empty() && !link_.said_bye) {
        finished_ = true;
        return lost + advice(options_);
      }
    }
    if (const std::optional<std::string> why = link_.why_lost(ended, options_.timeout)) {
      finished_ = true;
      const std::string lost = "node 0 (" + ranks_of(0, options_.nproc_per_node) + ": the main node, at " +
                               options_.master_addr + ", which holds the job's store) is lost: " + *why;
      link_.send_line("lost " + lost);  // node 0, if it was only stopped, reads it when it runs again
      link_.close_link();
      return lost + advice(options_);
    }
    if (link_.said_bye) {  // node 0's job has ended: nothing more to watch
      finished_ = true;
      link_.close_link();
      return std::nullopt;
    }
    beat_if_due();
    return std::nullopt;
  }

  void finish(int exit_code) override {
    if (connected_ && link_.fd >= 0) link_.send_line("bye " + std::to_string(exit_code));
    link_.close_link();
    finished_ = true;
  }

 private:
  void retry_later() {
    link_.close_link();
    link_ = peer_link{};
    connected_ = false;
    next_attempt_ = steady_clock::now() + std::min(options_.interval, connect_retry);
  }

  // Connects to node 0's launcher, one attempt at a time; returns whether the connection is made.
  bool advance_connection() {
    const steady_clock::time_point now = steady_clock::now();
    if (link_.fd < 0) {
      if (now < next_attempt_) return false;
      next_attempt_ = now + std::min(options_.interval, connect_retry);
      start_connecting();
      if (link_.fd < 0) return false;
    }
    pollfd writable{link_.fd, POLLOUT, 0};
    if (poll(&writable, 1, 0) <= 0) {
      if (now >= connect_deadline_) link_.close_link();  // try again, a fresh attempt
      return false;
    }
    int error = 0;
    socklen_t length = sizeof error;
    if (getsockopt(link_.fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0 || error != 0) {
      link_.close_link();  // node 0's launcher is not listening yet
      return false;
    }
    connected_ = true;
    link_.heard();
    link_.send_line("hello " + std::to_string(options_.node_rank) + " " + std::to_string(options_.nproc_per_node));
    next_beat_ = now + options_.interval;
    return true;
  }

  void start_connecting() {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (getaddrinfo(options_.master_addr.c_str(), std::to_string(options_.port).c_str(), &hints, &found) != 0) return;
    const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd >= 0 && (connect(fd, found->ai_addr, found->ai_addrlen) == 0 || errno == EINPROGRESS)) {
      link_.fd = fd;
      connect_deadline_ = steady_clock::now() + options_.timeout;
    } else if (fd >= 0) {
      close(fd);
    }
    freeaddrinfo(found);
  }

  void beat_if_due() {
    const steady_clock::time_point now = steady_clock::now();
    if (now < next_beat_) return;
    link_.send_line("beat");
    next_beat_ = now + options_.interval;
  }

  // Node 0's launcher may start after this one: tried again soon, so that the nodes are watched within a moment of
  // both launchers' start.
  static constexpr std::chrono::milliseconds connect_retry{200};

  heartbeat_options options_;
  peer_link link_;
  bool connected_ = false;  // a connection is made
  bool welcomed_ = false;   // node 0's launcher answered the hello: from then on, node 0 is watched
  bool finished_ = false;
  steady_clock::time_point next_attempt_ = steady_clock::now();
  steady_clock::time_point connect_deadline_ = steady_clock::now();
  steady_clock::time_point next_beat_ = steady_clock::now();
};

}  // namespace

std::unique_ptr<peer_watch> make_heartbeat(const heartbeat_options& options) {
  if (options.node_rank == 0) return std::make_unique<main_node_heartbeat>(options);
  return std::make_unique<other_node_heartbeat>(options);
}

}  // namespace accel::cli
