// read_file.h — whole-file reads for the model layer's JSON files (private header).
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "kvattn/core/error.h"

namespace kvattn::model::detail {

// The bytes of `path`; InvalidArgument naming the file when it cannot be read.
inline std::string read_file(const std::filesystem::path& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f)
    throw InvalidArgument(fmt::format("cannot read '{}': {}; a Hugging Face model directory has "
                                      "it",
                                      path.string(), std::strerror(errno)));
  std::string out;
  char buf[1 << 16];
  size_t n;
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (!ec) out.reserve(static_cast<size_t>(size));
  while ((n = std::fread(buf, 1, sizeof buf, f.get())) > 0) out.append(buf, n);
  if (std::ferror(f.get()))
    throw InvalidArgument(fmt::format("error reading '{}'", path.string()));
  return out;
}

}  // namespace kvattn::model::detail
