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
//
// Restarts agreed across the nodes (--max_restarts with --nnodes > 1), on the same connections, node 0 deciding, as
// torchrun's agents do through their rendezvous. Attempts are numbered from 0 on every node:
// - a node whose worker fails stops its own workers and tells node 0 "failed A CODE TIME WHAT" (A: the attempt; TIME:
//   when, in microseconds of the system clock, so that node 0 names the earliest failure, not the first message);
// - node 0 (at the first failure it hears of, its own included) sends every node "restart A WHAT": each stops its
//   workers of attempt A (SIGTERM, then SIGKILL after --grace_period), as for a failure of its own; a node whose
//   hello comes after that order gets it with the welcome;
// - a node whose workers of attempt A have all ended (failed, stopped or succeeded) says "ended A";
// - once every node has ended attempt A: none failed, node 0 sends "end 0" and the job is over on every node; one
//   failed and restarts are left, node 0 waits --restart_delay, picks a free port for the next attempt's store and
//   sends each node "go A+1 PORT NNODES RANK WHAT" (a fresh rendezvous: nothing of attempt A's store is met again);
//   none left, it sends "end CODE WHAT" and every launcher exits with the failing worker's code, naming it and the
//   attempts.
// The heartbeats go on between attempts. A node lost (silent, or its launcher gone before node 0 said "end") is never
// restarted: the job's nodes are fixed, so every launcher names it and exits with 1, as without restarts. A node that
// has not connected when its attempt has ended on this node counts as lost after --heartbeat_timeout.
//
// Elastic membership (--rdzv_backend c10d, --nnodes MIN:MAX), on the same protocol: node 0 is the launcher that can
// listen on the rendezvous endpoint. The others say "join ID NPROC" instead of "hello" (answered "welcome", or
// "refused WHY" for another ID or NPROC) and wait, beating; node 0 starts attempt 0 when MAX nodes have joined, or
// MIN once no other has joined within the last call, numbering the nodes in the order they joined: "go A PORT NNODES
// RANK WHAT" (the static job's "go" has the same form). A node lost is then a failure of the attempt, no longer a
// reason to end the job: the next attempt, after the restart delay, has the nodes joined then (the survivors, and
// any that joined since, up to MAX), if at least MIN; node 0 lost still ends the job.
#include "heartbeat.hpp"

#include <accel/detail/support/worker_variables.hpp>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <set>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

namespace accel::cli {
namespace {

using steady_clock = std::chrono::steady_clock;
using system_clock = std::chrono::system_clock;

// A longer line is not the keep-alive's: the connection is dropped.
constexpr std::size_t longest_keepalive_line = 4096;

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
  std::string left;     // with restarts agreed across nodes: how its launcher left before the job was over
  bool joined = false;  // an elastic job's launcher that joined the rendezvous (node: its rank in the attempt, or -1)

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
    if (pending.size() > longest_keepalive_line) ended = true;
    if (!lines.empty()) heard();
    return lines;
  }

  // Why the peer is lost, or nothing while it is not: silent beyond `timeout`, or gone without a goodbye.
  std::optional<std::string> why_lost(bool ended, std::chrono::milliseconds timeout) const {
    if (!left.empty()) return left;
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

// ---------------------------------------------------------------------------------------------------------------
// Restarts agreed across the nodes: what the messages carry.

// A worker's failure as a node reports it: its exit code, when (the earliest of several is the one named, whichever
// message arrives first) and what, e.g. "on node 1, worker rank 3 (pid 42) exited with code 17".
struct failure_report {
  int exit_code = 1;
  std::int64_t at_us = 0;
  std::string text;
};

std::int64_t clock_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(system_clock::now().time_since_epoch()).count();
}

// "A CODE TIME TEXT" (the words after "failed "), from node `node`: the attempt and the report, when well formed.
std::optional<std::pair<int, failure_report>> parse_failure(const std::string& words, int node) {
  int attempt = 0, consumed = 0;
  failure_report report;
  long long at_us = 0;
  if (std::sscanf(words.c_str(), "%d %d %lld %n", &attempt, &report.exit_code, &at_us, &consumed) != 3)
    return std::nullopt;
  report.at_us = at_us;
  report.text = "on node " + std::to_string(node) + ", " + words.substr(static_cast<std::size_t>(consumed));
  return std::pair{attempt, std::move(report)};
}

// "NUMBER ... TEXT" (the words after "go ", "restart " or "end "): N numbers and the rest, when well formed.
template <std::size_t N>
std::optional<std::pair<std::array<int, N>, std::string>> parse_numbers(const std::string& words) {
  std::array<int, N> numbers{};
  std::size_t at = 0;
  for (int& number : numbers) {
    int consumed = 0;
    if (std::sscanf(words.c_str() + at, "%d %n", &number, &consumed) != 1) return std::nullopt;
    at += static_cast<std::size_t>(consumed);
  }
  return std::pair{numbers, words.substr(at)};
}

std::string restarts_text(int count) { return std::to_string(count) + (count == 1 ? " restart" : " restarts"); }

// What a launcher that left before node 0 said the job was over did, for the others' message.
std::string left_early(const std::string& bye) {
  return "its launcher left the job (exit code " + (bye.size() > 4 ? bye.substr(4) : std::string("?")) +
         ") before the nodes had agreed that it was over (it was stopped by a signal, or it was lost itself)";
}

// A listening socket on `host`:`port` (an elastic job's rendezvous endpoint), or -1 when `host` is not this machine's
// address or another launcher here listens there already: this launcher then joins the one that does.
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
  main_node_heartbeat(const heartbeat_options& options, int listener) : options_(options), listener_(listener) {
    for (int node = 0; node < options.nnodes && !options.elastic; ++node) members_.insert(node);
  }

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
    if (go_at_) wake = std::min(wake, *go_at_);
    if (last_call_at_) wake = std::min(wake, *last_call_at_);
    if (ended_at_) wake = std::min(wake, *ended_at_ + options_.timeout);
    return wake;
  }

  bool starts_after_rendezvous() const override { return options_.elastic; }

  bool coordinates_restarts() const override { return options_.max_restarts > 0 || options_.elastic; }

  void worker_failed(int exit_code, const std::string& failure) override {
    if (coordinates_restarts()) record_failure({exit_code, clock_us(), "on node 0, " + failure});
  }

  std::optional<std::string> take_restart_order() override { return std::exchange(order_, std::nullopt); }

  void attempt_ended() override {
    ended_.insert(0);
    ended_at_ = steady_clock::now();
    decide();
  }

  std::optional<attempt_verdict> verdict() override { return std::exchange(verdict_, std::nullopt); }

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
      } else if (const std::optional<std::string> why = link.why_lost(ended, options_.timeout);
                 why && options_.elastic) {
        member_lost(link, *why);
      } else if (why) {
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
    if (!lost) lost = never_joined();
    if (lost) return report(*lost);
    if (forming_) form_if_ready();
    go_if_due();
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
    if (const std::string join = words_after(line, "join "); options_.elastic && !link.joined && !join.empty()) {
      on_join(link, join);
    } else if (options_.elastic && line.starts_with("hello ")) {
      link.send_line(
          "refused it is a launcher of a static job (--node_rank), this one is elastic: give every node "
          "the same --nnodes, --rdzv_backend c10d and --rdzv_endpoint");
      link.close_link();
    } else if (const std::string hello = words_after(line, "hello "); link.node < 0 && !hello.empty()) {
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
      // A node that says hello after the attempt's restart was ordered missed the order: without it, its workers
      // would wait for the failed one's forever, and node 0 for its "ended" (seen on a loaded machine).
      if (first_failure_ && !job_over_) link.send_line(restart_order());
    } else if (line.starts_with("bye")) {
      if (coordinates_restarts() && !job_over_)
        link.left = left_early(line);
      else
        link.said_bye = true;
    } else if (line.starts_with("lost ") && link.node > 0) {
      link.reported = line.substr(5);
    } else if (link.node > 0 && coordinates_restarts()) {
      on_attempt_line(link.node, line);
    }
  }

  // ---- restarts agreed across the nodes (the comment at the top)

  void on_attempt_line(int node, const std::string& line) {
    if (const std::string failed = words_after(line, "failed "); !failed.empty()) {
      if (auto parsed = parse_failure(failed, node); parsed && parsed->first == attempt_)
        record_failure(std::move(parsed->second));
    } else if (const std::string ended = words_after(line, "ended "); !ended.empty()) {
      if (std::atoi(ended.c_str()) == attempt_) ended_.insert(node);
      decide();
    }
  }

  // The earliest failure is the one named; the first heard stops the attempt on every node.
  void record_failure(failure_report failure) {
    const bool restart_ordered = first_failure_.has_value();  // by the first failure heard
    if (!first_failure_ || failure.at_us < first_failure_->at_us) first_failure_ = failure;
    if (restart_ordered) return;
    order_ = failure.text;
    broadcast(restart_order());
  }

  // The order to restart the attempt, naming its earliest failure (at the first, the one just heard).
  std::string restart_order() const { return "restart " + std::to_string(attempt_) + " " + first_failure_->text; }

  // Once every node's workers of the attempt have ended: the job is over, or goes on after the delay.
  void decide() {
    const bool all_ended = std::includes(ended_.begin(), ended_.end(), members_.begin(), members_.end());
    if (job_over_ || go_at_ || forming_ || !all_ended) return;
    if (!first_failure_) return end_job(0, "");
    if (restarts_ < options_.max_restarts) {
      go_at_ = steady_clock::now() + options_.restart_delay;
      return;
    }
    end_job(first_failure_->exit_code, first_failure_->text + "; giving up after " + restarts_text(restarts_) +
                                           ": attempt " + std::to_string(attempt_ + 1) + " of " +
                                           std::to_string(options_.max_restarts + 1) + " failed on every node");
  }

  void end_job(int exit_code, const std::string& message) {
    job_over_ = true;
    broadcast("end " + std::to_string(exit_code) + " " + message);
    verdict_ = attempt_verdict{std::nullopt, exit_code, message, std::nullopt, std::nullopt, attempt_};
  }

  // The next attempt, on a fresh port for its store (the last one's may linger in TIME_WAIT, its state is stale). An
  // elastic job's goes on with the nodes joined now, if enough.
  void go_if_due() {
    if (!go_at_ || steady_clock::now() < *go_at_) return;
    go_at_.reset();
    std::string message = first_failure_->text + "; restarting the job on every node (restart " +
                          std::to_string(restarts_ + 1) + " of " + std::to_string(options_.max_restarts) + ")";
    if (options_.elastic) {
      const int available = 1 + joined_count();
      if (available < options_.min_nnodes) {
        return end_job(first_failure_->exit_code,
                       first_failure_->text + "; the job cannot go on: " + std::to_string(available) +
                           (available == 1 ? " node is" : " nodes are") + " left, fewer than the " +
                           std::to_string(options_.min_nnodes) + " of --nnodes MIN:MAX");
      }
      message += " on " + assign_ranks();
    }
    ++restarts_;
    start_attempt(attempt_ + 1, message);
  }

  // Tells every node of the attempt its port, the number of nodes and its rank; the same for this node's verdict.
  void start_attempt(int attempt, const std::string& message) {
    const int port =
        detail::launching::pick_free_port(INADDR_ANY, "accel launch: node 0", " for the next attempt's store");
    const int nnodes = static_cast<int>(members_.size());
    attempt_ = attempt;
    for (const peer_link& link : links_) {
      if (link.node > 0) {
        link.send_line("go " + std::to_string(attempt) + " " + std::to_string(port) + " " + std::to_string(nnodes) +
                       " " + std::to_string(link.node) + " " + message);
      }
    }
    verdict_ = attempt_verdict{port, 0, message, nnodes, 0, attempt};
    first_failure_.reset();
    order_.reset();
    ended_.clear();
    ended_at_.reset();
  }

  // ---- elastic membership (--nnodes MIN:MAX)

  void on_join(peer_link& link, const std::string& words) {
    char id[256] = "";
    int nproc = 0;
    if (std::sscanf(words.c_str(), "%255s %d", id, &nproc) != 2 || id != options_.rdzv_id ||
        nproc != options_.nproc_per_node) {
      link.send_line("refused it joined with '" + words + "', this rendezvous is '" + options_.rdzv_id + " " +
                     std::to_string(options_.nproc_per_node) +
                     "' (--rdzv_id, --nproc_per_node): give every node "
                     "the same values");
      link.close_link();
      return;
    }
    link.joined = true;
    link.nproc = nproc;
    link.send_line("welcome");
  }

  int joined_count() const {
    return static_cast<int>(
        std::count_if(links_.begin(), links_.end(), [](const peer_link& link) { return link.joined && link.fd >= 0; }));
  }

  // The nodes of the next attempt: this one (node 0) and the launchers joined, in the order they joined, up to the
  // most nodes; those beyond wait for a later attempt. Returns "N nodes" for the messages.
  std::string assign_ranks() {
    members_ = {0};
    for (peer_link& link : links_) {
      link.node = -1;
      if (link.joined && link.fd >= 0 && static_cast<int>(members_.size()) < options_.nnodes) {
        link.node = static_cast<int>(members_.size());
        members_.insert(link.node);
      }
    }
    return std::to_string(members_.size()) + (members_.size() == 1 ? " node" : " nodes");
  }

  // The first attempt starts once the most nodes have joined, or the fewest and no other within the last call.
  void form_if_ready() {
    const int available = 1 + joined_count();
    if (available < options_.nnodes) {
      if (available < options_.min_nnodes) return last_call_at_.reset();
      if (!last_call_at_) last_call_at_ = steady_clock::now() + options_.last_call;
      if (steady_clock::now() < *last_call_at_) return;
    }
    forming_ = false;
    last_call_at_.reset();
    const std::string nodes = assign_ranks();
    start_attempt(0, "the job starts on " + nodes + " (rendezvous '" + options_.rdzv_id + "')");
  }

  // A node of an elastic job lost: its attempt fails on every node, and the next one goes on without it.
  void member_lost(peer_link& link, const std::string& why) {
    const std::string lost = "node " + std::to_string(link.node) + " (" + ranks_of(link.node, link.nproc) + ", at " +
                             link.address + ") is lost: " + why;
    link.send_line("lost " + lost + " (found by node 0)");
    link.close_link();
    members_.erase(link.node);
    if (!job_over_ && !forming_) record_failure({1, clock_us(), lost});
    decide();
  }

  // A node whose launcher has not connected by --heartbeat_timeout after this node's attempt ended cannot be waited
  // for: it counts as lost.
  std::optional<std::string> never_joined() const {
    if (!ended_at_ || steady_clock::now() < *ended_at_ + options_.timeout) return std::nullopt;
    for (const int node : members_) {
      if (node > 0 &&
          std::none_of(links_.begin(), links_.end(), [&](const peer_link& link) { return link.node == node; })) {
        return "node " + std::to_string(node) + " (" + ranks_of(node, options_.nproc_per_node) +
               ") is lost: its launcher never connected to this node's heartbeat port " + std::to_string(options_.port);
      }
    }
    return std::nullopt;
  }

  void broadcast(const std::string& line) const {
    for (const peer_link& link : links_) {
      if (link.node > 0 || link.joined) link.send_line(line);
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
      if (link.node > 0 || link.joined) link.send_line("beat");
    }
    next_beat_ = now + options_.interval;
  }

  heartbeat_options options_;
  int listener_;
  std::vector<peer_link> links_;
  steady_clock::time_point next_beat_ = steady_clock::now();
  bool finished_ = false;
  // Restarts agreed across the nodes: the attempt running, its first failure, the nodes whose workers have ended it.
  int attempt_ = 0;
  int restarts_ = 0;
  std::optional<failure_report> first_failure_;  // its earliest; once one is heard, the restart is ordered
  std::optional<std::string> order_;             // for this node's workers
  std::set<int> ended_;
  std::set<int> members_;                             // the nodes of the attempt, 0 included
  std::optional<steady_clock::time_point> ended_at_;  // when this node's workers ended the attempt
  std::optional<steady_clock::time_point> go_at_;     // when the next attempt starts
  std::optional<attempt_verdict> verdict_;
  bool job_over_ = false;
  bool forming_ = options_.elastic;                       // an elastic job's first attempt is not formed yet
  std::optional<steady_clock::time_point> last_call_at_;  // then: when it starts with fewer than the most nodes
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
    const steady_clock::time_point unwelcome =
        ended_at_ && !welcomed_ ? *ended_at_ + options_.timeout : steady_clock::time_point::max();
    if (!connected_) return std::min(link_.fd >= 0 ? connect_deadline_ : next_attempt_, unwelcome);
    return std::min({next_beat_, link_.last_heard + options_.timeout, unwelcome});
  }

  bool coordinates_restarts() const override { return options_.max_restarts > 0 || options_.elastic; }

  bool starts_after_rendezvous() const override { return options_.elastic; }

  void worker_failed(int exit_code, const std::string& failure) override {
    if (!coordinates_restarts()) return;
    tell_node_0("failed " + std::to_string(attempt_) + " " + std::to_string(exit_code) + " " +
                std::to_string(clock_us()) + " " + failure);
  }

  std::optional<std::string> take_restart_order() override { return std::exchange(order_, std::nullopt); }

  void attempt_ended() override {
    ended_at_ = steady_clock::now();
    tell_node_0("ended " + std::to_string(attempt_));
  }

  std::optional<attempt_verdict> verdict() override { return std::exchange(verdict_, std::nullopt); }

  std::optional<std::string> on_wakeup() override {
    if (finished_) return std::nullopt;
    if (ended_at_ && !welcomed_ && steady_clock::now() >= *ended_at_ + options_.timeout) {
      finished_ = true;
      return main_node() + " is lost: its launcher was never reached at " + options_.master_addr + " port " +
             std::to_string(options_.port) + advice(options_);
    }
    if (!connected_ && !advance_connection()) return std::nullopt;
    bool ended = false;
    const std::vector<std::string> lines = link_.read_lines(ended);
    if (const auto refused = std::find_if(lines.begin(), lines.end(),
                                          [](const std::string& line) { return line.starts_with("refused "); });
        refused != lines.end()) {
      finished_ = true;
      return "the rendezvous at " + options_.master_addr + ":" + std::to_string(options_.port) +
             " refused this node: " + refused->substr(8);
    }
    if (!welcomed_ && std::find(lines.begin(), lines.end(), "welcome") == lines.end()) {
      // Not node 0's launcher yet (what accepted the connection may be something else): watched once welcomed.
      if (ended || heartbeat_stale(link_.last_heard, steady_clock::now(), options_.timeout)) retry_later();
      return std::nullopt;
    }
    if (!welcomed_) {
      welcomed_ = true;
      for (const std::string& line : std::exchange(outbox_, {})) link_.send_line(line);
    }
    for (const std::string& line : lines) {
      if (line.starts_with("bye") && coordinates_restarts() && !job_over_) link_.left = left_early(line);
      if (line.starts_with("bye")) link_.said_bye = true;
      if (const std::string lost = words_after(line, "lost "); !lost.empty() && !link_.said_bye) {
        finished_ = true;
        return lost + advice(options_);
      }
      if (coordinates_restarts()) on_attempt_line(line);
    }
    if (const std::optional<std::string> why = link_.why_lost(ended, options_.timeout)) {
      finished_ = true;
      const std::string lost = main_node() + " is lost: " + *why;
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
    link_.send_line(options_.elastic ? "join " + options_.rdzv_id + " " + std::to_string(options_.nproc_per_node)
                                     : "hello " + std::to_string(options_.node_rank) + " " +
                                           std::to_string(options_.nproc_per_node));
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

  std::string main_node() const {
    return "node 0 (" + ranks_of(0, options_.nproc_per_node) + ": the main node, at " + options_.master_addr +
           ", which holds the job's store)";
  }

  // ---- restarts agreed across the nodes (the comment at the top)

  // Before node 0's launcher has answered, what this node has to say waits.
  void tell_node_0(const std::string& line) {
    if (welcomed_)
      link_.send_line(line);
    else
      outbox_.push_back(line);
  }

  void on_attempt_line(const std::string& line) {
    if (const std::string restart = words_after(line, "restart "); !restart.empty()) {
      if (auto order = parse_numbers<1>(restart); order && order->first[0] == attempt_ && !ended_at_)
        order_ = order->second;
    } else if (const std::string go = words_after(line, "go "); !go.empty()) {
      if (auto next = parse_numbers<4>(go)) {                         // A PORT NNODES RANK
        const auto [attempt, port, nnodes, node_rank] = next->first;  // this node's rank among those of the attempt
        attempt_ = attempt;
        verdict_ = attempt_verdict{port, 0, next->second, nnodes, node_rank, attempt};
        order_.reset();
        ended_at_.reset();
      }
    } else if (const std::string end = words_after(line, "end "); !end.empty()) {
      if (auto over = parse_numbers<1>(end)) {
        job_over_ = true;
        verdict_ = attempt_verdict{std::nullopt, over->first[0], over->second, std::nullopt, std::nullopt, attempt_};
      }
    }
  }

  // Node 0's launcher may start after this one: tried again soon, so that the nodes are watched within a moment of
  // both launchers' start.
  static constexpr std::chrono::milliseconds connect_retry{200};

  heartbeat_options options_;
  peer_link link_;
  bool connected_ = false;  // a connection is made
  bool welcomed_ = false;   // node 0's launcher answered the hello: from then on, node 0 is watched
  bool finished_ = false;
  // Restarts agreed across the nodes: the attempt running, node 0's order to stop it, what node 0 decided after it.
  int attempt_ = 0;
  std::optional<std::string> order_;
  std::optional<steady_clock::time_point> ended_at_;  // when this node's workers ended the attempt
  std::optional<attempt_verdict> verdict_;
  bool job_over_ = false;
  std::vector<std::string> outbox_;
  steady_clock::time_point next_attempt_ = steady_clock::now();
  steady_clock::time_point connect_deadline_ = steady_clock::now();
  steady_clock::time_point next_beat_ = steady_clock::now();
};

}  // namespace

std::unique_ptr<peer_watch> make_heartbeat(const heartbeat_options& options) {
  if (options.elastic) {
    if (const int listener = listen_at(options.master_addr, options.port); listener >= 0)
      return std::make_unique<main_node_heartbeat>(options, listener);
    return std::make_unique<other_node_heartbeat>(options);
  }
  if (options.node_rank == 0) return std::make_unique<main_node_heartbeat>(options, listen_on(options.port));
  return std::make_unique<other_node_heartbeat>(options);
}

}  // namespace accel::cli
