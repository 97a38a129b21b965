// The job's secret and HMAC-SHA-256; job_secret.hpp says what each is for.
#include "job_secret.hpp"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>

#include "command.hpp"

namespace accel::cli {
namespace {

// ---------------------------------------------------------------------------------------------------------------
// SHA-256 (FIPS 180-4, section 6.2)

constexpr std::array<std::uint32_t, 64> round_constants{
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

constexpr std::uint32_t rotate_right(std::uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

// One 64-byte block into the state.
void compress(std::array<std::uint32_t, 8>& state, const unsigned char* block) {
  std::array<std::uint32_t, 64> w{};
  for (int t = 0; t < 16; ++t)
    w[t] = static_cast<std::uint32_t>(block[4 * t]) << 24 | static_cast<std::uint32_t>(block[4 * t + 1]) << 16 |
           static_cast<std::uint32_t>(block[4 * t + 2]) << 8 | static_cast<std::uint32_t>(block[4 * t + 3]);
  for (int t = 16; t < 64; ++t) {
    const std::uint32_t s0 = rotate_right(w[t - 15], 7) ^ rotate_right(w[t - 15], 18) ^ (w[t - 15] >> 3);
    const std::uint32_t s1 = rotate_right(w[t - 2], 17) ^ rotate_right(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  auto [a, b, c, d, e, f, g, h] = state;
  for (int t = 0; t < 64; ++t) {
    const std::uint32_t t1 = h + (rotate_right(e, 6) ^ rotate_right(e, 11) ^ rotate_right(e, 25)) +
                             ((e & f) ^ (~e & g)) + round_constants[t] + w[t];
    const std::uint32_t t2 =
        (rotate_right(a, 2) ^ rotate_right(a, 13) ^ rotate_right(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  const std::array<std::uint32_t, 8> added{a, b, c, d, e, f, g, h};
  for (std::size_t i = 0; i < 8; ++i) state[i] += added[i];
}

// ---------------------------------------------------------------------------------------------------------------
// The user's secret file

std::filesystem::path user_secret_path() {
  if (const char* xdg = std::getenv("XDG_CONFIG_HOME"); xdg != nullptr && *xdg != '\0')
    return std::filesystem::path(xdg) / "accel" / "job_secret";
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
    return std::filesystem::path(home) / ".config" / "accel" / "job_secret";
  throw usage_error(std::string("no job secret: set ") + job_secret_variable +
                    " to the same value on every node (at least 16 characters, e.g. the output of 'python3 -c \"import "
                    "secrets; print(secrets.token_hex(32))\"'); without it accel uses ~/.config/accel/job_secret, but "
                    "neither XDG_CONFIG_HOME nor HOME is set");
}

// The file's secret, when it exists: refused when others may read it, or when it is not one.
std::optional<std::string> read_user_secret(const std::filesystem::path& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    throw usage_error("cannot read the job secret " + path.string() + ": " + std::strerror(errno));
  }
  struct stat info{};
  char text[256];
  const ssize_t length = fstat(fd, &info) == 0 ? read(fd, text, sizeof text) : -1;
  close(fd);
  if (length < 0 || !S_ISREG(info.st_mode) || info.st_uid != geteuid() || (info.st_mode & 077) != 0) {
    throw usage_error("the job secret " + path.string() +
                      " must be a file of yours that no one else can read or write (chmod 600 " + path.string() +
                      "), or set " + job_secret_variable);
  }
  std::string secret(text, static_cast<std::size_t>(length));
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.size() < shortest_job_secret)
    throw usage_error("the job secret " + path.string() +
                      " holds fewer than 16 characters: remove it (accel makes a "
                      "new one) or set " +
                      std::string(job_secret_variable));
  return secret;
}

// A new random secret in `path`, written whole under another name and linked into place, so that two launchers
// making it at once agree on the first one's; returns the secret in place.
std::string make_user_secret(const std::filesystem::path& path) {
  std::error_code error;
  std::filesystem::create_directories(path.parent_path(), error);
  const std::filesystem::path partial = path.string() + "." + std::to_string(getpid()) + ".partial";
  const std::string secret = random_hex(32);
  const int fd = open(partial.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  const std::string text = secret + "\n";
  const bool written = fd >= 0 && write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int write_errno = errno;
  if (fd >= 0) close(fd);
  const bool linked = written && (link(partial.c_str(), path.c_str()) == 0 || errno == EEXIST);
  unlink(partial.c_str());
  if (!linked)
    throw usage_error("cannot make the job secret " + path.string() + ": " +
                      std::strerror(written ? errno : write_errno) + "; set " + job_secret_variable +
                      " to the same value on every node instead");
  if (auto existing = read_user_secret(path)) return *existing;
  throw usage_error("the job secret " + path.string() + " vanished as it was made; run the launcher again");
}

}  // namespace

std::string sha256(std::string_view data) {
  std::array<std::uint32_t, 8> state{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                     0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  const auto* bytes = reinterpret_cast<const unsigned char*>(data.data());
  std::size_t whole = data.size() / 64 * 64;
  for (std::size_t at = 0; at < whole; at += 64) compress(state, bytes + at);
  // The last bytes, 0x80, zeros and the length in bits (big-endian): one or two blocks.
  std::array<unsigned char, 128> tail{};
  const std::size_t left = data.size() - whole;
  std::memcpy(tail.data(), bytes + whole, left);
  tail[left] = 0x80;
  const std::size_t tail_size = left < 56 ? 64 : 128;
  const std::uint64_t bits = static_cast<std::uint64_t>(data.size()) * 8;
  for (int i = 0; i < 8; ++i) tail[tail_size - 1 - i] = static_cast<unsigned char>(bits >> (8 * i));
  for (std::size_t at = 0; at < tail_size; at += 64) compress(state, tail.data() + at);
  std::string digest(32, '\0');
  for (std::size_t i = 0; i < 32; ++i) digest[i] = static_cast<char>(state[i / 4] >> (24 - 8 * (i % 4)));
  return digest;
}

std::string hmac_sha256(std::string_view key, std::string_view message) {
  std::string block_key = key.size() > 64 ? sha256(key) : std::string(key);
  block_key.resize(64, '\0');
  std::string inner(64, '\0'), outer(64, '\0');
  for (std::size_t i = 0; i < 64; ++i) {
    inner[i] = static_cast<char>(block_key[i] ^ 0x36);
    outer[i] = static_cast<char>(block_key[i] ^ 0x5c);
  }
  return sha256(outer + sha256(inner.append(message)));
}

std::string hex(std::string_view bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string text;
  text.reserve(bytes.size() * 2);
  for (const char byte : bytes) {
    const auto value = static_cast<unsigned char>(byte);
    text += digits[value >> 4];
    text += digits[value & 15];
  }
  return text;
}

std::string random_hex(std::size_t count) {
  std::string bytes(count, '\0');
  for (std::size_t got = 0; got < count;) {
    const ssize_t n = getrandom(bytes.data() + got, count - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::system_error(errno, std::generic_category(), "getrandom (a nonce for the launchers)");
    got += static_cast<std::size_t>(n);
  }
  return hex(bytes);
}

bool same_secret_text(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char difference = 0;
  for (std::size_t i = 0; i < a.size(); ++i) difference |= static_cast<unsigned char>(a[i] ^ b[i]);
  return difference == 0;
}

std::string load_job_secret() {
  if (const char* given = std::getenv(job_secret_variable); given != nullptr && *given != '\0') {
    std::string secret = given;
    unsetenv(job_secret_variable);  // the workers need it not: a program that logs its environment cannot show it
    if (secret.size() < shortest_job_secret)
      throw usage_error(std::string(job_secret_variable) + " holds " + std::to_string(secret.size()) +
                        " characters: give at least 16, the same on every node (e.g. the output of 'python3 -c "
                        "\"import secrets; print(secrets.token_hex(32))\"')");
    return secret;
  }
  const std::filesystem::path path = user_secret_path();
  if (auto secret = read_user_secret(path)) return *secret;
  return make_user_secret(path);
}

}  // namespace accel::cli
