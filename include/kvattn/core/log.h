// kvattn/core/log.h — one spdlog logger for the library ("kvattn").  Level from
// KVATTN_LOG_LEVEL (trace, debug, info, warn, error, off); default warn.
#pragma once

#include <spdlog/spdlog.h>

namespace kvattn {
spdlog::logger& logger();
}  // namespace kvattn
