/// \file
/// A small HTTP/1.1 client on POSIX sockets, for trackers that talk to a server (MLflow's REST API): plain http://
/// only, one request per connection (`Connection: close`), every step bounded by a timeout. Responses with a
/// Content-Length body, a chunked body, or a body ended by the connection's close are read, up to
/// `max_http_response_bytes`.
// IWYU pragma: private, include <accel/tracking.hpp>
#pragma once

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "../config.hpp"

namespace accel::detail {

/// A failure to reach a server or to get its answer (refused, timed out, cut off, malformed); the caller retries.
class http_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Where requests go: `http://host[:port][/base path]`.
struct http_endpoint {
  std::string host;
  std::string port = "80";
  std::string base_path;  // without a trailing slash: "" or "/mlflow"
};

/// Parses an http:// URI; anything else is a clear error naming `what` (the variable or option that gave it).
ACCEL_DECL http_endpoint parse_http_uri(std::string_view uri, std::string_view what);

/// The most bytes of a response read (MLflow's answers are a few kilobytes): a server announcing or sending more is
/// an error, never memory held for it.
inline constexpr std::size_t max_http_response_bytes = 16 << 20;

/// A complete response: the status code and the body (de-chunked).
struct http_response {
  int status = 0;
  std::string body;
};

/// The body of a chunked message (`size CRLF data CRLF ... 0 CRLF CRLF`); nullopt while incomplete.
ACCEL_DECL std::optional<std::string> parse_chunked(std::string_view text);

/// The value of header `name` (any case) in `headers` (the lines after the status line), or "".
ACCEL_DECL std::string_view header_value(std::string_view headers, std::string_view name);

/// Parses what a server sent so far: the response once complete, nullopt while more is due. `closed`: the server
/// has closed the connection, which ends a body of no declared length. Throws `http_error` when malformed.
ACCEL_DECL std::optional<http_response> parse_http_response(std::string_view raw, bool closed);

/// The text of a request: a POST with a JSON body, or a GET (`json` empty) whose `path` holds its query.
ACCEL_DECL std::string http_request_text(const http_endpoint& endpoint, std::string_view method, std::string_view path,
                                         std::string_view json = {});

/// `text` percent-encoded for a URL's query (RFC 3986's unreserved characters kept).
ACCEL_DECL std::string url_encode(std::string_view text);

/// A connected socket, closed on destruction.
class socket_handle {
 public:
  explicit socket_handle(int fd) noexcept : fd_(fd) {}
  socket_handle(const socket_handle&) = delete;
  socket_handle& operator=(const socket_handle&) = delete;
  ~socket_handle() {
    if (fd_ >= 0) ::close(fd_);
  }
  [[nodiscard]] int get() const noexcept { return fd_; }
  /// Hands the descriptor over (no longer closed here).
  [[nodiscard]] int release() noexcept { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

using http_clock = std::chrono::steady_clock;

/// Waits until `fd` is ready for `events` or `deadline` passes (then throws `http_error` saying `doing`).
ACCEL_DECL void wait_for(int fd, short events, http_clock::time_point deadline, std::string_view doing);

/// A non-blocking socket connected to `endpoint` within `timeout`.
ACCEL_DECL int connect_to(const http_endpoint& endpoint, std::chrono::milliseconds timeout);

/// How long each step of a request may take.
struct http_timeouts {
  std::chrono::milliseconds connect{2000};
  /// From the first byte sent to the last byte of the response.
  std::chrono::milliseconds response{5000};
};

/// Sends `request` to `endpoint` and reads the whole response, each step bounded by `timeouts`; throws `http_error`.
ACCEL_DECL http_response http_exchange(const http_endpoint& endpoint, std::string_view request, http_timeouts timeouts);

}  // namespace accel::detail

#if ACCEL_HEADER_ONLY
#include "impl/http.ipp"
#endif
