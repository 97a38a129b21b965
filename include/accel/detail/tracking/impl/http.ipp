/// \file
/// What http.hpp declares and does not define: included by it in header-only mode, compiled once into accel::compiled
/// with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../http.hpp"

namespace accel::detail {

http_endpoint parse_http_uri(std::string_view uri, std::string_view what) {
  const auto bad = [&](const std::string& why) {
    return std::invalid_argument("accel: " + std::string(what) + " is \"" + std::string(uri) + "\": " + why);
  };
  if (uri.starts_with("https://"))
    throw bad(
        "accel's HTTP client speaks plain http:// only (no TLS, to add no library dependency); run a local "
        "TLS-terminating proxy (e.g. `stunnel`, or nginx with proxy_pass https://...) and point it at "
        "http://127.0.0.1:PORT");
  if (!uri.starts_with("http://")) throw bad("expected an http://host:port URI of an MLflow tracking server");
  auto rest = uri.substr(7);
  const auto slash = rest.find('/');
  const auto authority = rest.substr(0, slash);
  http_endpoint endpoint;
  if (slash != std::string_view::npos) endpoint.base_path = std::string(rest.substr(slash));
  while (endpoint.base_path.ends_with('/')) endpoint.base_path.pop_back();
  if (authority.find('@') != std::string_view::npos) throw bad("credentials in the URI are not supported");
  const auto colon = authority.rfind(':');
  endpoint.host = std::string(authority.substr(0, colon));
  if (colon != std::string_view::npos) endpoint.port = std::string(authority.substr(colon + 1));
  if (endpoint.host.empty()) throw bad("it names no host");
  if (endpoint.port.empty() || endpoint.port.find_first_not_of("0123456789") != std::string::npos)
    throw bad("its port is not a number");
  int port = 0;
  const auto [end, error] = std::from_chars(endpoint.port.data(), endpoint.port.data() + endpoint.port.size(), port);
  if (error != std::errc() || port < 1 || port > 65535)
    throw bad("its port " + endpoint.port + " is not one of 1 to 65535 (a TCP port)");
  return endpoint;
}

std::optional<std::string> parse_chunked(std::string_view text) {
  std::string body;
  for (;;) {
    const auto line_end = text.find("\r\n");
    if (line_end == std::string_view::npos) return std::nullopt;
    std::size_t size = 0;
    const auto digits = text.substr(0, text.find_first_of(";\r"));
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), size, 16);
    if (error != std::errc() || end == digits.data()) throw http_error("malformed chunk size in an HTTP response");
    text.remove_prefix(line_end + 2);
    if (size == 0) return text.find("\r\n") == std::string_view::npos ? std::nullopt : std::optional(body);
    if (text.size() < size + 2) return std::nullopt;
    body.append(text.substr(0, size));
    text.remove_prefix(size + 2);
  }
}

std::string_view header_value(std::string_view headers, std::string_view name) {
  while (!headers.empty()) {
    const auto end = headers.find("\r\n");
    const auto line = headers.substr(0, end);
    headers = end == std::string_view::npos ? std::string_view() : headers.substr(end + 2);
    const auto colon = line.find(':');
    if (colon != name.size()) continue;
    bool same = true;
    for (std::size_t i = 0; i < colon; ++i)
      same = same &&
             std::tolower(static_cast<unsigned char>(line[i])) == std::tolower(static_cast<unsigned char>(name[i]));
    if (!same) continue;
    auto value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    return value;
  }
  return {};
}

std::optional<http_response> parse_http_response(std::string_view raw, bool closed) {
  const auto head_end = raw.find("\r\n\r\n");
  if (head_end == std::string_view::npos) {
    if (closed) throw http_error("the server closed the connection before a complete HTTP response");
    return std::nullopt;
  }
  const auto status_end = raw.find("\r\n");
  const auto status_line = raw.substr(0, status_end);
  http_response response;
  if (!status_line.starts_with("HTTP/1.") || status_line.size() < 12 || status_line[8] != ' ')
    throw http_error("malformed HTTP status line \"" + std::string(status_line.substr(0, 80)) + "\"");
  const auto code = status_line.substr(9, 3);
  if (std::from_chars(code.data(), code.data() + 3, response.status).ptr != code.data() + 3)
    throw http_error("malformed HTTP status code in \"" + std::string(status_line) + "\"");
  const auto headers = raw.substr(status_end + 2, head_end - status_end);
  const auto body = raw.substr(head_end + 4);
  if (header_value(headers, "Transfer-Encoding").find("chunked") != std::string_view::npos) {
    auto text = parse_chunked(body);
    if (!text && closed) throw http_error("the server closed the connection inside a chunked HTTP body");
    if (!text) return std::nullopt;
    response.body = std::move(*text);
    return response;
  }
  if (const auto length_text = header_value(headers, "Content-Length"); !length_text.empty()) {
    std::size_t length = 0;
    if (std::from_chars(length_text.data(), length_text.data() + length_text.size(), length).ec != std::errc())
      throw http_error("malformed Content-Length \"" + std::string(length_text) + "\"");
    if (length > max_http_response_bytes)
      throw http_error("the server announces a body of " + std::string(length_text) + " bytes, more than the " +
                       std::to_string(max_http_response_bytes) + " a response may have");
    if (body.size() < length) {
      if (closed) throw http_error("the server closed the connection before the whole HTTP body");
      return std::nullopt;
    }
    response.body = std::string(body.substr(0, length));
    return response;
  }
  if (!closed && response.status != 204 && response.status != 304) return std::nullopt;
  response.body = std::string(body);
  return response;
}

std::string http_request_text(const http_endpoint& endpoint, std::string_view method, std::string_view path,
                              std::string_view json) {
  std::string request = std::string(method) + " " + endpoint.base_path + std::string(path) +
                        " HTTP/1.1\r\nHost: " + endpoint.host + ":" + endpoint.port + "\r\n";
  if (method == "POST")
    request += "Content-Type: application/json\r\nContent-Length: " + std::to_string(json.size()) + "\r\n";
  request += "Connection: close\r\nUser-Agent: accel\r\n\r\n";
  return request.append(json);
}

std::string url_encode(std::string_view text) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (std::isalnum(byte) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += c;
    } else {
      out += '%';
      out += hex[byte >> 4];
      out += hex[byte & 15];
    }
  }
  return out;
}

void wait_for(int fd, short events, http_clock::time_point deadline, std::string_view doing) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - http_clock::now()).count();
    if (left <= 0) throw http_error("timed out " + std::string(doing));
    pollfd entry{fd, events, 0};
    const int ready = ::poll(&entry, 1, static_cast<int>(left));
    if (ready > 0) return;
    if (ready < 0 && errno != EINTR) throw http_error(std::string("poll failed: ") + std::strerror(errno));
  }
}

int connect_to(const http_endpoint& endpoint, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int error = ::getaddrinfo(endpoint.host.c_str(), endpoint.port.c_str(), &hints, &found); error != 0)
    throw http_error("cannot resolve " + endpoint.host + ": " + ::gai_strerror(error));
  std::string why = "no address";
  for (auto* address = found; address != nullptr; address = address->ai_next) {
    socket_handle fd(::socket(address->ai_family, address->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) continue;
    if (::connect(fd.get(), address->ai_addr, address->ai_addrlen) != 0 && errno != EINPROGRESS) {
      why = std::strerror(errno);
      continue;
    }
    try {
      wait_for(fd.get(), POLLOUT, http_clock::now() + timeout, "connecting");
    } catch (const http_error& e) {
      why = e.what();
      continue;
    }
    int error = 0;
    socklen_t size = sizeof error;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &size);
    if (error != 0) {
      why = std::strerror(error);
      continue;
    }
    ::freeaddrinfo(found);
    return fd.release();
  }
  ::freeaddrinfo(found);
  throw http_error("cannot connect to " + endpoint.host + ":" + endpoint.port + ": " + why);
}

http_response http_exchange(const http_endpoint& endpoint, std::string_view request, http_timeouts timeouts) {
  socket_handle fd(connect_to(endpoint, timeouts.connect));
  const auto deadline = http_clock::now() + timeouts.response;
  while (!request.empty()) {
    wait_for(fd.get(), POLLOUT, deadline, "sending an HTTP request");
    const auto sent = ::send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL);
    if (sent < 0 && errno != EAGAIN && errno != EINTR) throw http_error(std::string("send: ") + std::strerror(errno));
    if (sent > 0) request.remove_prefix(static_cast<std::size_t>(sent));
  }
  std::string raw;
  char buffer[16384];
  for (;;) {
    wait_for(fd.get(), POLLIN, deadline, "waiting for the server's HTTP response");
    const auto got = ::recv(fd.get(), buffer, sizeof buffer, 0);
    if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (got < 0) throw http_error(std::string("recv: ") + std::strerror(errno));
    raw.append(buffer, static_cast<std::size_t>(got));
    if (auto response = parse_http_response(raw, got == 0)) return std::move(*response);
    if (raw.size() > max_http_response_bytes)  // a chunked or unbounded body: never held past the limit
      throw http_error("the server's response passes " + std::to_string(max_http_response_bytes) +
                       " bytes, more than a response may have");
  }
}

}  // namespace accel::detail
