// What proves that a launcher belongs to the job: a secret every launcher of the job holds, never sent or printed,
// and the keyed hashes (HMAC-SHA-256, written here: the tool links nothing but the C++ library) by which the
// launchers' connections show they hold it. docs/cluster.md states the trust model; heartbeat.cpp the handshake.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace accel::cli {

// The variable that gives a job its secret, the same on every node.
inline constexpr const char* job_secret_variable = "ACCEL_JOB_SECRET";
inline constexpr std::size_t shortest_job_secret = 16;

// The job's secret: ACCEL_JOB_SECRET when set (not empty), which is then removed from this process's environment so
// that the workers do not inherit it; otherwise the user's own, in $XDG_CONFIG_HOME/accel/job_secret (or
// ~/.config/accel/job_secret), made on first use (random, readable by its owner alone), which the launchers of a job
// share when their machines share the home directory. Throws usage_error naming the fix when the variable is too
// short, when the file is readable by others, or when there is neither.
std::string load_job_secret();

// SHA-256 of `data` (FIPS 180-4), 32 bytes.
std::string sha256(std::string_view data);

// HMAC-SHA-256 of `message` under `key` (RFC 2104), 32 bytes.
std::string hmac_sha256(std::string_view key, std::string_view message);

// `bytes` as lower-case hexadecimal.
std::string hex(std::string_view bytes);

// `count` bytes from the kernel's random source, as hexadecimal (a nonce, or a new secret). Throws
// std::runtime_error when there is none.
std::string random_hex(std::size_t count);

// Whether `a` and `b` are equal, in a time that does not depend on where they differ.
bool same_secret_text(std::string_view a, std::string_view b);

}  // namespace accel::cli
