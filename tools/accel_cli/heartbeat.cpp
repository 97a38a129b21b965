// The keep-alive between the launchers of a job of several nodes.
//
// Design. Node 0's launcher listens on --heartbeat_port (default: --master_port + 1) at --master_addr (every interface
// with --heartbeat_all_interfaces); every other node's launcher connects to it (again every 0.2 s until it answers).
// Nothing a connection says is acted on before it has proved that its launcher holds the job's secret
// (ACCEL_JOB_SECRET, job_secret.hpp): node 0 sends "challenge NONCE", the other answers "hello NODE NPROC NONCE
// PROOF", node 0 checks the proof and answers "welcome PROOF", which the other checks; from then on every line is
// sealed with a key of the connection (heartbeat_link.hpp). A connection that fails is refused ("refused WHY") and
// closed, and so is a second hello for a node that is connected already. Both ends then send "beat" every
// --heartbeat_interval seconds, and each takes the other for lost when it has heard nothing from it for
// --heartbeat_timeout seconds (its machine or its link is down: no connection is closed), or when the connection ends
// without "bye" (its launcher was killed). A star, not a mesh: node 0 watches every node, every node watches node 0,
// and node 0 tells the others which node it lost ("lost MESSAGE"), so that the loss of node 2 stops node 1 too. A
// launcher whose job has ended says "bye CODE" first: with 0 it is no longer watched; with another code (a worker
// failed, the launcher was interrupted) its job is over and so is everyone's: the others stop their workers.
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
// listen on the rendezvous endpoint. The others say "join ID NPROC NONCE PROOF" instead of "hello" (answered
// "welcome", or "refused WHY" for another ID or NPROC) and wait, beating; node 0 starts attempt 0 when MAX nodes have
// joined, or MIN once no other has joined within the last call, numbering the nodes in the order they joined: "go A
// PORT NNODES RANK WHAT" (the static job's "go" has the same form). A node lost is then a failure of the attempt, no
// longer a reason to end the job: the next attempt, after the restart delay, has the nodes joined then (the
// survivors, and any that joined since, up to MAX), if at least MIN; node 0 lost still ends the job. Within
// --rdzv_conf join_timeout (600 s, torchrun's default) a launcher must have reached the rendezvous, and the
// rendezvous must have gathered MIN nodes; otherwise the launcher says what it waited for and exits with 1.
#include "heartbeat.hpp"

#include <accel/detail/support/worker_variables.hpp>
#include <fcntl.h>
#include <netdb.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <set>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

#include "heartbeat_link.hpp"
#include "job_secret.hpp"

namespace accel::cli {
namespace {

using steady_clock = std::chrono::steady_clock;
using system_clock = std::chrono::system_clock;

// Connections to node 0 that have not proved themselves yet: more, and the oldest is closed (a flood of connections
// cannot take every descriptor, nor keep a launcher of the job out for long).
constexpr std::size_t most_unproved_connections = 32;
// Refusals named on the terminal; those beyond are counted only.
constexpr int most_refusals_shown = 10;
// After accept() failed for want of memory or descriptors, the heartbeat port is not waited on for this long (it
// would be ready again at once: the launcher would spin).
constexpr std::chrono::milliseconds accept_pause{100};

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

// How the launchers of one job come to hold the same secret, for the refusals.
constexpr const char* same_secret_advice =
    "give every node's launcher the same ACCEL_JOB_SECRET (without it, each uses ~/.config/accel/job_secret, the "
    "same only where the machines share the home directory)";

// Why a proved connection's line is not taken: it does not bear the connection's seal.
constexpr const char* unsealed_line =
    "a line on its connection did not bear the seal of the job's secret (it was altered on the way, or written by "
    "another process), so the connection was dropped";

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

// What a launcher's goodbye ("bye CODE") means for one that hears it: nothing when its job ended well, or when the
// nodes had agreed that the job was over (`job_over`); otherwise why the job cannot go on here (peer_link::left). A
// job that failed or was stopped on one node is over on every node, whose workers would otherwise run on alone.
std::string goodbye_meaning(const std::string& bye, bool restarts_agreed, bool job_over) {
  if (job_over) return "";
  if (restarts_agreed) return left_early(bye);
  int code = 1;
  if (std::sscanf(bye.c_str(), "bye %d", &code) != 1) code = 1;
  if (code == 0) return "";
  const int signal_number = code - 128;
  const std::string how =
      signal_number > 0 && signal_number < NSIG
          ? "signal " + std::to_string(signal_number) + ", " + strsignal(signal_number) + ", stopped it"
          : "a worker failed, or the launcher could not go on";
  return "its launcher left the job with exit code " + std::to_string(code) + " (" + how +
         ") before the job was over here: a job that failed or was stopped on one node ends on every node";
}

// ---------------------------------------------------------------------------------------------------------------
// Node 0: watches every other node.

class main_node_heartbeat final : public peer_watch {
 public:
  main_node_heartbeat(const heartbeat_options& options, std::vector<int> listeners)
      : options_(options), listeners_(std::move(listeners)), spare_(open("/dev/null", O_RDONLY | O_CLOEXEC)) {
    for (int node = 0; node < options.nnodes && !options.elastic; ++node) members_.insert(node);
  }

  ~main_node_heartbeat() override {
    for (peer_link& link : links_) link.close_link();
    for (const int listener : listeners_) close(listener);
    if (spare_ >= 0) close(spare_);
  }

  main_node_heartbeat(const main_node_heartbeat&) = delete;
  main_node_heartbeat& operator=(const main_node_heartbeat&) = delete;

  void add_fds(std::vector<pollfd>& fds) const override {
    if (finished_) return;
    if (steady_clock::now() >= accept_paused_until_) {
      for (const int listener : listeners_) fds.push_back({listener, POLLIN, 0});
    }
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
    if (forming_ && !job_over_) wake = std::min(wake, join_deadline_);
    if (steady_clock::now() < accept_paused_until_) wake = std::min(wake, accept_paused_until_);
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
      const bool ended = read_link(link);
      if (link.fd < 0) continue;  // refused
      if (!link.proved() || link.node < 0 || lost) {
        // A connection that never proved itself, or an elastic job's launcher waiting for an attempt (closed when
        // silent), or any after a loss was found.
        if (ended || (link.node < 0 && heartbeat_stale(link.last_heard, steady_clock::now(), options_.timeout)))
          link.close_link();
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
    if (forming_ && !job_over_) form_if_ready();
    go_if_due();
    beat_if_due();
    return std::nullopt;
  }

  void finish(int exit_code) override {
    for (peer_link& link : links_) {
      if (link.proved()) link.send_line("bye " + std::to_string(exit_code));
      link.close_link();
    }
    links_.clear();
    finished_ = true;
  }

 private:
  // ---- connections and their handshake (heartbeat_link.hpp)

  // Reads what `link` sent and acts on it: its handshake, then its sealed lines. Returns whether it ended.
  bool read_link(peer_link& link) {
    bool ended = false;
    for (const std::string& line : link.read_lines(ended)) {
      if (link.fd < 0) break;
      if (!link.proved()) {
        on_handshake(link, line);
        continue;
      }
      const std::optional<std::string> text = link.open(line);
      if (!text) {
        link.left = unsealed_line;
        return true;
      }
      on_line(link, *text);
    }
    return ended;
  }

  void accept_all() {
    if (steady_clock::now() < accept_paused_until_) return;
    for (const int listener : listeners_) {
      for (;;) {
        sockaddr_storage address{};
        socklen_t length = sizeof address;
        const int fd = accept4(listener, reinterpret_cast<sockaddr*>(&address), &length, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0) {
          challenge(fd, address_of(address));
          continue;
        }
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if ((errno == EMFILE || errno == ENFILE) && shed_connection(listener)) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) accept_paused_until_ = steady_clock::now() + accept_pause;
        break;
      }
    }
  }

  // Out of descriptors, a pending connection would keep the port ready and the launcher spinning: the spare
  // descriptor is let go to accept it and close it at once (as nginx and libuv do), then taken again.
  bool shed_connection(int listener) {
    if (spare_ < 0) return false;
    close(spare_);
    const int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) close(fd);
    spare_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (!said_out_of_descriptors_) {
      said_out_of_descriptors_ = true;
      rlimit limit{};
      getrlimit(RLIMIT_NOFILE, &limit);
      std::fprintf(stderr,
                   "accel launch: node 0's launcher has no file descriptor left (ulimit -n %llu): connections to its "
                   "heartbeat port are closed at once until some are free\n",
                   static_cast<unsigned long long>(limit.rlim_cur));
    }
    return fd >= 0;
  }

  // A new connection: nothing it says counts before it answers this connection's challenge.
  void challenge(int fd, std::string address) {
    if (static_cast<std::size_t>(std::count_if(links_.begin(), links_.end(), [](const peer_link& link) {
          return link.fd >= 0 && !link.proved();
        })) >= most_unproved_connections) {
      std::find_if(links_.begin(), links_.end(), [](const peer_link& link) {
        return link.fd >= 0 && !link.proved();
      })->close_link();
    }
    peer_link link;
    link.fd = fd;
    link.address = std::move(address);
    link.from_main_node = true;
    link.challenge = random_hex(16);
    link.send_line("challenge " + link.challenge);
    links_.push_back(std::move(link));
  }

  // "hello NODE NPROC NONCE PROOF" or "join ID NPROC NONCE PROOF", the proof checked before anything else.
  void on_handshake(peer_link& link, const std::string& line) {
    std::vector<std::string> words;
    for (std::size_t start = 0; start <= line.size() && words.size() <= 5;) {
      const std::size_t space = std::min(line.find(' ', start), line.size());
      words.push_back(line.substr(start, space - start));
      start = space + 1;
    }
    if (words.size() != 5 || (words[0] != "hello" && words[0] != "join"))
      return refuse(link, "this is the heartbeat port of an accel launch job: say hello with the job's secret first",
                    "it did not say hello as a launcher of the job");
    const std::string said = words[0] + " " + words[1] + " " + words[2];
    if (!same_secret_text(words[4], node_proof(options_.secret, link.challenge, words[3], said)))
      return refuse(link, std::string("this node does not hold the job's secret: ") + same_secret_advice,
                    std::string("it does not hold the job's secret (if it is a launcher of this job: ") +
                        same_secret_advice + ")");
    if (words[0] == "join") return on_join(link, words[1], words[2], words[3]);
    on_hello(link, words[1], words[2], words[3]);
  }

  void on_hello(peer_link& link, const std::string& node_text, const std::string& nproc_text,
                const std::string& nonce) {
    if (options_.elastic) {
      return refuse(link,
                    "it is a launcher of a static job (--node_rank), this one is elastic: give every node the same "
                    "--nnodes, --rdzv_backend c10d and --rdzv_endpoint",
                    "a launcher of a static job (--node_rank) said hello to this elastic job");
    }
    const int node = std::atoi(node_text.c_str()), nproc = std::atoi(nproc_text.c_str());
    if (node < 1 || node >= options_.nnodes || nproc < 1) {
      const std::string why = "node " + printable(node_text) + " is not one of this job's nodes 1 to " +
                              std::to_string(options_.nnodes - 1) + " (--nnodes " + std::to_string(options_.nnodes) +
                              ", --node_rank): give every node the same --nnodes";
      return refuse(link, why, why);
    }
    if (const auto connected = std::find_if(
            links_.begin(), links_.end(), [&](const peer_link& other) { return other.fd >= 0 && other.node == node; });
        connected != links_.end()) {
      const std::string why = "node " + std::to_string(node) + " is connected already, from " + connected->address +
                              ": a second launcher with --node_rank " + std::to_string(node) +
                              " (give each node its own --node_rank)";
      return refuse(link, why, why);
    }
    welcome(link, nonce);
    link.node = node;
    link.nproc = nproc;
    // A node that says hello after the attempt's restart was ordered missed the order: without it, its workers
    // would wait for the failed one's forever, and node 0 for its "ended" (seen on a loaded machine).
    if (first_failure_ && !job_over_) link.send_line(restart_order());
  }

  // The connection proved itself: node 0 proves itself in turn, and the connection's lines are sealed from now on.
  void welcome(peer_link& link, const std::string& nonce) {
    link.send_line("welcome " + main_node_proof(options_.secret, link.challenge, nonce));
    link.key = connection_key(options_.secret, link.challenge, nonce);
    link.heard();
  }

  // Tells the other end why (its launcher prints it) and closes; the first refusals are named here too, never with
  // what the connection sent.
  void refuse(peer_link& link, const std::string& why, const std::string& shown) {
    link.send_line("refused " + why);
    link.close_link();
    if (++refusals_ > most_refusals_shown) return;
    std::fprintf(stderr, "accel launch: refused a connection to the heartbeat port from %s: %s%s\n",
                 link.address.c_str(), shown.c_str(),
                 refusals_ == most_refusals_shown ? " (further refusals are not shown)" : "");
  }

  // A proved connection's line.
  void on_line(peer_link& link, const std::string& line) {
    if (line.starts_with("bye")) {
      if (const std::string left = goodbye_meaning(line, coordinates_restarts(), job_over_); !left.empty())
        link.left = left;
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

  void on_join(peer_link& link, const std::string& id, const std::string& nproc_text, const std::string& nonce) {
    if (!options_.elastic) {
      return refuse(link,
                    "it is a launcher of an elastic job (--rdzv_backend c10d), this one is static: give every node "
                    "the same --nnodes and --rdzv_backend",
                    "a launcher of an elastic job (--rdzv_backend c10d) joined this static job");
    }
    if (id != options_.rdzv_id || nproc_text != std::to_string(options_.nproc_per_node)) {
      const std::string why = "it joined with '" + printable(id) + " " + printable(nproc_text) +
                              "', this rendezvous is '" + options_.rdzv_id + " " +
                              std::to_string(options_.nproc_per_node) +
                              "' (--rdzv_id, --nproc_per_node): give every node the same values";
      return refuse(link, why, why);
    }
    welcome(link, nonce);
    link.joined = true;
    link.nproc = options_.nproc_per_node;
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
      if (available < options_.min_nnodes && steady_clock::now() >= join_deadline_) {
        return end_job(1, "the rendezvous '" + options_.rdzv_id + "' at " + options_.master_addr + ":" +
                              std::to_string(options_.port) + " gathered " + std::to_string(available) + " of the " +
                              std::to_string(options_.min_nnodes) + " nodes of --nnodes " +
                              std::to_string(options_.min_nnodes) + ":" + std::to_string(options_.nnodes) + " within " +
                              seconds_text(options_.join_timeout) +
                              " (--rdzv_conf join_timeout): start the other nodes' launchers with the same "
                              "--rdzv_endpoint, --rdzv_id and job secret, or give a longer join_timeout");
      }
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
  std::vector<int> listeners_;
  int spare_;  // a descriptor kept to be let go when there is no other (shed_connection)
  steady_clock::time_point accept_paused_until_{};
  bool said_out_of_descriptors_ = false;
  int refusals_ = 0;
  steady_clock::time_point join_deadline_ = steady_clock::now() + options_.join_timeout;
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
  explicit other_node_heartbeat(const heartbeat_options& options) : options_(options) {
    if (options_.elastic) {
      std::fprintf(stderr,
                   "accel launch: joining the rendezvous '%s' at %s; waiting up to %s for it (--rdzv_conf "
                   "join_timeout)\n",
                   options_.rdzv_id.c_str(), endpoint().c_str(), seconds_text(options_.join_timeout).c_str());
    }
  }

  ~other_node_heartbeat() override { link_.close_link(); }

  other_node_heartbeat(const other_node_heartbeat&) = delete;
  other_node_heartbeat& operator=(const other_node_heartbeat&) = delete;

  void add_fds(std::vector<pollfd>& fds) const override {
    if (link_.fd >= 0) fds.push_back({link_.fd, static_cast<short>(connected_ ? POLLIN : POLLOUT), 0});
  }

  steady_clock::time_point next_wakeup() const override {
    if (finished_) return steady_clock::time_point::max();
    steady_clock::time_point unwelcome =
        ended_at_ && !welcomed_ ? *ended_at_ + options_.timeout : steady_clock::time_point::max();
    if (options_.elastic && !welcomed_) unwelcome = std::min(unwelcome, join_deadline_);
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
    if (std::optional<std::string> unreached = never_reached()) {
      finished_ = true;
      link_.close_link();
      return unreached;
    }
    if (!connected_ && !advance_connection()) return std::nullopt;
    bool ended = false;
    std::vector<std::string> lines;
    for (const std::string& line : link_.read_lines(ended)) {
      if (!welcomed_) {
        if (std::optional<std::string> refused = on_handshake(line)) {
          finished_ = true;
          link_.close_link();
          return refused;
        }
      } else if (std::optional<std::string> text = link_.open(line)) {
        lines.push_back(*std::move(text));
      } else {
        link_.left = unsealed_line;
        break;
      }
    }
    if (!welcomed_) {
      // Not node 0's launcher yet (what accepted the connection may be something else): watched once welcomed.
      if (ended || heartbeat_stale(link_.last_heard, steady_clock::now(), options_.timeout)) {
        problem_ = "what answers there did not complete an accel launcher's handshake";
        retry_later();
      }
      return std::nullopt;
    }
    return on_lines(lines, ended);
  }

  void finish(int exit_code) override {
    await_welcome();
    if (welcomed_ && link_.fd >= 0) link_.send_line("bye " + std::to_string(exit_code));
    link_.close_link();
    finished_ = true;
  }

 private:
  std::string endpoint() const { return options_.master_addr + ":" + std::to_string(options_.port); }

  // Node 0 watches this node from its hello on, so a job that ends between the hello and the welcome waits for the
  // welcome (at most --heartbeat_timeout) to seal its goodbye: closed without one, node 0 would take it for killed.
  void await_welcome() {
    const steady_clock::time_point give_up = steady_clock::now() + options_.timeout;
    while (!welcomed_ && !finished_ && link_.fd >= 0 && !link_.challenge.empty()) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(give_up - steady_clock::now()).count();
      if (left <= 0) return;
      pollfd readable{link_.fd, POLLIN, 0};
      poll(&readable, 1, static_cast<int>(left));
      static_cast<void>(on_wakeup());  // the job's exit code is set: a loss found now changes nothing
    }
  }

  // Node 0 never reached: after this node's attempt ended (a static job), or within the join timeout (an elastic
  // job's first rendezvous), saying what was tried.
  std::optional<std::string> never_reached() const {
    const steady_clock::time_point now = steady_clock::now();
    if (ended_at_ && !welcomed_ && now >= *ended_at_ + options_.timeout) {
      return main_node() + " is lost: its launcher was never reached at " + options_.master_addr + " port " +
             std::to_string(options_.port) + advice(options_);
    }
    if (!options_.elastic || welcomed_ || now < join_deadline_) return std::nullopt;
    return "the rendezvous '" + options_.rdzv_id + "' at " + endpoint() + " was not reached within " +
           seconds_text(options_.join_timeout) + " (--rdzv_conf join_timeout): " +
           (problem_.empty() ? std::string("its launcher did not answer") : problem_) +
           "; start the launcher of the node at --rdzv_endpoint, check the address and that this machine reaches "
           "it, or give a longer join_timeout";
  }

  // Node 0's lines before the welcome: its challenge (answered with this node's hello and proof), its welcome (its
  // proof checked), or its refusal. Returns why this launcher cannot go on, if it cannot.
  std::optional<std::string> on_handshake(const std::string& line) {
    if (const std::string challenge = words_after(line, "challenge "); !challenge.empty() && link_.challenge.empty()) {
      link_.challenge = challenge;
      nonce_ = random_hex(16);
      const std::string words =
          (options_.elastic ? "join " + options_.rdzv_id : "hello " + std::to_string(options_.node_rank)) + " " +
          std::to_string(options_.nproc_per_node);
      link_.send_line(words + " " + nonce_ + " " + node_proof(options_.secret, challenge, nonce_, words));
    } else if (const std::string refused = words_after(line, "refused "); !refused.empty()) {
      return (options_.elastic ? "the rendezvous at " + endpoint() : main_node() + "'s launcher at " + endpoint()) +
             " refused this node: " + printable(refused);
    } else if (const std::string proof = words_after(line, "welcome "); !proof.empty() && !link_.challenge.empty()) {
      if (!same_secret_text(proof, main_node_proof(options_.secret, link_.challenge, nonce_)))
        return "the launcher at " + endpoint() +
               " answered as node 0 but does not hold this job's secret: " + same_secret_advice;
      link_.key = connection_key(options_.secret, link_.challenge, nonce_);
      link_.heard();
      welcomed_ = true;
      for (const std::string& waiting : std::exchange(outbox_, {})) link_.send_line(waiting);
    }
    return std::nullopt;
  }

  // Node 0's sealed lines: its goodbye, a loss it found, the attempts' orders; then whether node 0 is lost.
  std::optional<std::string> on_lines(const std::vector<std::string>& lines, bool ended) {
    for (const std::string& line : lines) {
      if (line.starts_with("bye")) {
        link_.left = goodbye_meaning(line, coordinates_restarts(), job_over_);
        link_.said_bye = true;
      }
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

  void retry_later() {
    link_.close_link();
    link_ = peer_link{};
    connected_ = false;
    next_attempt_ = steady_clock::now() + std::min(options_.interval, connect_retry);
  }

  // Connects to node 0's launcher, one attempt at a time; returns whether the connection is made (node 0 speaks
  // first: its challenge).
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
      if (now >= connect_deadline_) {
        link_.close_link();  // try again, a fresh attempt
        problem_ = "connections to it time out (nothing answers at that address)";
      }
      return false;
    }
    int error = 0;
    socklen_t length = sizeof error;
    if (getsockopt(link_.fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0 || error != 0) {
      link_.close_link();  // node 0's launcher is not listening yet
      problem_ = std::string("connecting to it: ") + std::strerror(error);
      return false;
    }
    connected_ = true;
    link_.heard();
    next_beat_ = now + options_.interval;
    return true;
  }

  void start_connecting() {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (const int error =
            getaddrinfo(options_.master_addr.c_str(), std::to_string(options_.port).c_str(), &hints, &found);
        error != 0) {
      const std::string problem = "cannot resolve " + options_.master_addr + " (" + gai_strerror(error) + ")";
      if (options_.elastic && problem != problem_)
        std::fprintf(stderr, "accel launch: %s; trying again until the join timeout\n", problem.c_str());
      problem_ = problem;
      return;
    }
    const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd >= 0 && (connect(fd, found->ai_addr, found->ai_addrlen) == 0 || errno == EINPROGRESS)) {
      link_.fd = fd;
      connect_deadline_ = steady_clock::now() + options_.timeout;
    } else {
      problem_ = std::string("connecting to it: ") + std::strerror(errno);
      if (fd >= 0) close(fd);
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
  bool welcomed_ = false;   // node 0's launcher proved itself: from then on, node 0 is watched
  std::string nonce_;       // this node's, for the handshake on this connection
  std::string problem_;     // why node 0 was not reached at the last try, for the join timeout's message
  steady_clock::time_point join_deadline_ = steady_clock::now() + options_.join_timeout;
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
    if (const int listener = listen_at(options.master_addr, options.port); listener >= 0) {
      if (!options.all_interfaces) return std::make_unique<main_node_heartbeat>(options, std::vector<int>{listener});
      close(listener);  // this launcher hosts the rendezvous: now on every interface
      return std::make_unique<main_node_heartbeat>(options, listen_for_nodes(options.master_addr, options.port, true));
    }
    return std::make_unique<other_node_heartbeat>(options);
  }
  if (options.node_rank == 0) {
    return std::make_unique<main_node_heartbeat>(
        options, listen_for_nodes(options.master_addr, options.port, options.all_interfaces));
  }
  return std::make_unique<other_node_heartbeat>(options);
}

}  // namespace accel::cli
