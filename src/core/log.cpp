#include "kvattn/core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>

namespace kvattn {

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto l = spdlog::stderr_color_mt("kvattn");
    const char* lvl = std::getenv("KVATTN_LOG_LEVEL");
    l->set_level(lvl ? spdlog::level::from_str(lvl) : spdlog::level::warn);
    l->set_pattern("[%n %l] %v");
    return l;
  }();
  return *instance;
}

}  // namespace kvattn
