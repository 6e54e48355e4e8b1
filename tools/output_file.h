// tools/output_file.h — what `kvattn run` and `kvattn plan` share about their inputs and
// outputs: full-width integer options with a stated range, and result files that are opened
// before the work starts and whose write and close errors are reported.
#pragma once

#include <fmt/format.h>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#include "kvattn/core/error.h"

namespace kvattn::tools {

// Parses `text` as a whole decimal integer in [lo, hi], checked at full width before any
// narrowing: "4294967298" for an option whose range is [1, 64] is refused, not truncated.
inline int64_t parse_int_option(const std::string& flag, const std::string& text, int64_t lo, int64_t hi) {
  int64_t v = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  if (!text.empty() && *first == '+') ++first;
  const auto [ptr, ec] = std::from_chars(first, last, v);
  const bool whole = !text.empty() && ptr == last && ec != std::errc::invalid_argument;
  if (!whole)
    throw InvalidArgument(fmt::format("{} must be an integer in [{}, {}], got '{}'", flag, lo, hi, text));
  if (ec == std::errc::result_out_of_range || v < lo || v > hi)
    throw InvalidArgument(fmt::format("{} {} is outside the valid range [{}, {}]", flag, text, lo, hi));
  return v;
}

inline constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// A result file: "-" is stdout; any other path is opened (created / truncated) at once, so an
// unwritable path is refused before the work, and write() reports write and close errors
// (a full disk, /dev/full) as InvalidArgument naming the path.
class OutputFile {
 public:
  OutputFile(std::string flag, std::string path) : flag_(std::move(flag)), path_(std::move(path)) {
    if (path_.empty() || path_ == "-") return;
    f_ = std::fopen(path_.c_str(), "wb");
    if (f_ == nullptr)
      throw InvalidArgument(fmt::format("{} '{}' cannot be opened for writing: {}; pass a writable path or '-' for "
                                        "stdout",
                                        flag_, path_, std::strerror(errno)));
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile() {
    if (f_) std::fclose(f_);
  }
  bool enabled() const noexcept { return !path_.empty(); }
  bool is_stdout() const noexcept { return path_ == "-"; }

  void write(const std::string& text) {
    if (path_.empty()) return;
    FILE* out = f_ ? f_ : stdout;
    errno = 0;
    const bool wrote = std::fwrite(text.data(), 1, text.size(), out) == text.size();
    const bool flushed = std::fflush(out) == 0;
    int err = errno;
    bool closed = true;
    if (f_) {
      closed = std::fclose(f_) == 0;
      if (!closed && err == 0) err = errno;
      f_ = nullptr;
    }
    if (!wrote || !flushed || !closed)
      throw InvalidArgument(fmt::format("{}: writing the result to {} failed: {}", flag_,
                                        path_ == "-" ? std::string("stdout") : "'" + path_ + "'",
                                        err ? std::strerror(err) : "I/O error"));
  }

 private:
  std::string flag_, path_;
  FILE* f_ = nullptr;
};

// 328335.9 us -> "328.3 ms"; 2.5e6 us -> "2.50 s"; 41.2 us -> "41.2 us".
inline std::string format_us(double us) {
  if (us >= 1e6) return fmt::format("{:.2f} s", us * 1e-6);
  if (us >= 1e3) return fmt::format("{:.1f} ms", us * 1e-3);
  return fmt::format("{:.1f} us", us);
}

}  // namespace kvattn::tools
