/// \file
/// What progress.hpp declares and does not define: included by it in header-only mode, compiled once into
/// accel::compiled with ACCEL_SEPARATE_COMPILATION.
#pragma once

#include "../progress.hpp"

namespace accel::detail::progress_text {

std::string compact_number(double value) {
  char exact[64];
  char general[64];
  const auto format = std::chars_format::general;
  const std::string_view shortest(exact, std::to_chars(exact, exact + sizeof exact, value, format).ptr);
  std::string rounded(general, std::to_chars(general, general + sizeof general, value, format, 3).ptr);
  if (const auto e = rounded.find('e'); e != std::string::npos)
    while (rounded.size() > e + 3 && rounded[e + 2] == '0') rounded.erase(e + 2, 1);  // "1e-05" -> "1e-5"
  return rounded.size() < shortest.size() ? rounded : std::string(shortest);
}

std::string fixed(double value, int digits) {
  char buffer[64];  // a rate: far fewer digits than that
  char* end = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::fixed, digits).ptr;
  return std::string(buffer, end);
}

std::string clock_time(std::chrono::seconds duration) {
  const long long total = std::max<long long>(duration.count(), 0);
  const long long hours = total / 3600, minutes = total / 60 % 60, seconds = total % 60;
  char buffer[32];
  if (hours > 0)
    std::snprintf(buffer, sizeof buffer, "%lld:%02lld:%02lld", hours, minutes, seconds);
  else
    std::snprintf(buffer, sizeof buffer, "%02lld:%02lld", minutes, seconds);
  return buffer;
}

std::size_t columns(std::string_view text) {
  return static_cast<std::size_t>(std::ranges::count_if(text, [](char c) { return (c & 0xC0) != 0x80; }));
}

std::string fit(std::string text, std::size_t limit) {
  std::size_t seen = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if ((text[i] & 0xC0) == 0x80) continue;
    if (seen++ == limit) {
      text.resize(i);
      break;
    }
  }
  return text;
}

std::string snapshot::counts() const {
  return has_total() ? std::to_string(count) + "/" + std::to_string(total) : std::to_string(count);
}

std::string snapshot::remaining_time() const {
  if (count >= total) return clock_time(std::chrono::seconds(0));
  if (!has_rate()) return "?";
  const double per_iteration = seconds() / static_cast<double>(count);
  return clock_time(std::chrono::seconds(std::llround(per_iteration * static_cast<double>(total - count))));
}

std::string snapshot::rate() const {
  if (!has_rate()) return "? it/s";
  const double per_second = static_cast<double>(count) / seconds();
  return per_second >= 1 ? fixed(per_second, 2) + " it/s" : fixed(1 / per_second, 2) + " s/it";
}

std::string terminal_frame(const snapshot& now, std::string_view prefix, std::string_view postfix, std::size_t width) {
  const std::size_t room = width > 0 ? width - 1 : 0;
  const std::string times = now.elapsed_time() + (now.has_total() ? "<" + now.remaining_time() : "");
  const std::string status = now.counts() + " [" + times + ", " + now.rate() + std::string(postfix) + "]";
  if (!now.has_total()) return fit(std::string(prefix) + status, room);

  char percent[32];
  std::snprintf(percent, sizeof percent, "%3zu%%|", now.percent());
  const std::string left = std::string(prefix) + percent;
  const std::string right = "| " + status;
  const std::size_t used = columns(left) + columns(right);
  const std::size_t cells = room > used ? room - used : 0;
  const std::size_t filled = std::min(now.count, now.total) * cells / now.total;
  return fit(left + std::string(filled, '#') + std::string(cells - filled, ' ') + right, room);
}

std::string plain_line(const snapshot& now, std::string_view prefix, std::string_view postfix) {
  std::string line = std::string(prefix) + now.counts();
  if (now.has_total())
    line += " (" + std::to_string(now.percent()) + "%) elapsed " + now.elapsed_time() + ", remaining " +
            now.remaining_time();
  else
    line += " elapsed " + now.elapsed_time();
  return line + ", " + now.rate() + std::string(postfix);
}

int descriptor_of(const std::ostream* stream) {
  if (stream == &std::cout) return STDOUT_FILENO;
  if (stream == &std::cerr || stream == &std::clog) return STDERR_FILENO;
  return -1;
}

std::size_t terminal_width(int fd) {
  winsize size{};
  if (fd >= 0 && ::ioctl(fd, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 80;
}
}  // namespace accel::detail::progress_text

namespace accel {

std::string postfix_value::text() const {
  if (const auto* number = std::get_if<double>(&value_)) return detail::progress_text::compact_number(*number);
  return std::get<std::string>(value_);
}
}  // namespace accel

namespace accel::detail {

progress_display::progress_display(progress_options options)
    : options_(std::move(options)),
      fd_(progress_text::descriptor_of(options_.output)),
      redraw_(options_.redraw.value_or(fd_ >= 0 && ::isatty(fd_) == 1)),
      prefix_(options_.description.empty() ? "" : options_.description + ": "),
      start_(options_.clock()),
      last_shown_at_(start_) {
  if (redraw_) show(0, start_);  // the bar appears before the first (maybe slow) iteration, as tqdm's does
}

void progress_display::update(std::size_t count) {
  const auto now = options_.clock();
  if (now - last_shown_at_ >= interval()) show(count, now);
}

void progress_display::finish(std::size_t count) {
  if (redraw_ || last_shown_count_ != count) show(count, options_.clock());
  if (redraw_) *options_.output << '\n' << std::flush;
}

void progress_display::write(std::string_view line, std::size_t count) {
  auto& out = *options_.output;
  if (redraw_) out << "\r\x1b[K";
  out << line << '\n';
  if (redraw_)
    show(count, options_.clock());
  else
    out.flush();
}

void progress_display::set_postfix(std::initializer_list<std::pair<std::string_view, postfix_value>> values) {
  postfix_.clear();
  for (const auto& [name, value] : values) postfix_.emplace_back(name, value);
}

void progress_display::show(std::size_t count, progress_clock::time_point now) {
  const progress_text::snapshot shown{count, options_.total.value_or(0), now - start_};
  auto& out = *options_.output;
  if (redraw_)
    out << '\r' << progress_text::terminal_frame(shown, prefix_, postfix_text(), width()) << "\x1b[K";
  else
    out << progress_text::plain_line(shown, prefix_, postfix_text()) << '\n';
  out.flush();
  last_shown_at_ = now;
  last_shown_count_ = count;
}

std::string progress_display::postfix_text() const {
  std::string text;
  for (const auto& [name, value] : postfix_) text += ", " + name + "=" + value.text();
  return text;
}
}  // namespace accel::detail

namespace accel {

progress_bar::progress_bar(progress_options options)
    : display_(options.enabled ? std::make_unique<detail::progress_display>(std::move(options)) : nullptr) {}

progress_bar& progress_bar::operator=(progress_bar&& other) noexcept {
  progress_bar taken(std::move(other));
  std::swap(count_, taken.count_);
  std::swap(display_, taken.display_);
  return *this;  // `taken` now holds this bar's previous display, closed as it goes
}

void progress_bar::update(std::size_t n) {
  count_ += n;
  if (display_) display_->update(count_);
}

}  // namespace accel
