// tools/int_option.h — integer command-line options parsed at full width and range-checked
// before any narrowing.
//
// The value is parsed into an int64 (a value that is not an integer, or beyond int64, is a parse
// error); the range [lo, hi] is checked by the parser, so `--page-size 0` or `--dcp 4294967298`
// is refused up front with the option's name and valid range (exit code 2), never truncated,
// never a division by zero later.  --help shows the type as INT, the range and the default.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace kvattn::tools {

inline CLI::Option* add_int_option(CLI::App& app, const std::string& name, int64_t& value, int64_t lo, int64_t hi,
                                   const std::string& description) {
  return app.add_option(name, value, description)->type_name("INT")->check(CLI::Range(lo, hi));
}

}  // namespace kvattn::tools
