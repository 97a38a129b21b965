// One connection between two launchers of a job (heartbeat.cpp's keep-alive), and what proves who is at its other
// end. A connection is anyone's until the handshake: node 0 sends a fresh nonce ("challenge N0"); the other launcher
// answers with its words ("hello NODE NPROC" or "join ID NPROC"), a nonce of its own and a keyed hash of both nonces
// and its words under the job's secret; node 0 checks it and answers "welcome" with a keyed hash of both nonces of
// its own, which the other checks. From then on every line carries a keyed hash under a key of this connection (made
// from the secret and both nonces), of the line, its direction and its number: a line that a stranger wrote, altered
// or replayed from another connection is not acted on. The secret itself never crosses the network.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace accel::cli {

// `text` as it may reach a terminal: its control characters (C0 but tab, DEL, and C1 as UTF-8 writes them) as \xNN,
// so that a line from the network cannot move the cursor, recolour or retitle the operator's terminal.
std::string printable(std::string_view text);

// The handshake's keyed hashes under the job's `secret`, of node 0's nonce `challenge` and the other's `nonce`
// (hexadecimal): the other launcher's proof for its `words`, node 0's in its welcome, and the connection's key.
std::string node_proof(std::string_view secret, std::string_view challenge, std::string_view nonce,
                       std::string_view words);
std::string main_node_proof(std::string_view secret, std::string_view challenge, std::string_view nonce);
std::string connection_key(std::string_view secret, std::string_view challenge, std::string_view nonce);

// One connection to another node's launcher.
struct peer_link {
  int fd = -1;
  int node = -1;  // the node at the other end (on node 0: -1 until it has said hello)
  int nproc = 0;
  std::string address;   // the peer's, for messages
  std::string pending;   // what followed the last '\n' read
  std::string reported;  // on node 0: the loss this node found and reported ("lost MESSAGE")
  std::chrono::steady_clock::time_point last_heard = std::chrono::steady_clock::now();
  std::chrono::system_clock::time_point last_heard_clock = std::chrono::system_clock::now();
  bool said_bye = false;
  std::string left;     // how its launcher left before the job was over (a goodbye, or a line not of the job)
  bool joined = false;  // an elastic job's launcher that joined the rendezvous (node: its rank in the attempt, or -1)
  // The handshake: node 0's nonce on this connection, and the key that seals each line once both ends proved that
  // they hold the job's secret (empty before). `from_main_node`: whether this end is node 0 (the lines' direction).
  std::string challenge;
  std::string key;
  bool from_main_node = false;
  mutable std::uint64_t sent = 0;  // lines sealed and sent, and opened, on this connection: each line's number
  std::uint64_t received = 0;

  bool proved() const { return !key.empty(); }

  void heard();

  // Seals the line once the connection is proved. A full socket buffer drops the line: a peer that does not read is
  // judged by its own silence.
  void send_line(const std::string& line) const;

  // The complete lines that arrived, as they came (sealed once proved: open() them); `ended` when the connection is
  // over (closed, reset, or a line too long for the keep-alive).
  std::vector<std::string> read_lines(bool& ended);

  // The text of a sealed line (printable()), when its seal is this connection's next one; nothing otherwise.
  std::optional<std::string> open(const std::string& line);

  // Why the peer is lost, or nothing while it is not: silent beyond `timeout`, or gone without a goodbye.
  std::optional<std::string> why_lost(bool ended, std::chrono::milliseconds timeout) const;

  void close_link();
};

// The peer's address as text (an IPv4 peer of a dual-stack socket without its "::ffff:").
std::string address_of(const sockaddr_storage& address);

// A listening socket on `host`:`port` (an elastic job's rendezvous endpoint), or -1 when `host` is not this machine's
// address or another launcher here listens there already: this launcher then joins the one that does.
int listen_at(const std::string& host, int port);

// Node 0's listening sockets on `port`: on every address of `host` (the address the other nodes connect to) that
// this machine has, or on every interface with `all_interfaces`. Throws std::runtime_error naming the port, the
// address and the fix when there is none.
std::vector<int> listen_for_nodes(const std::string& host, int port, bool all_interfaces);

}  // namespace accel::cli
