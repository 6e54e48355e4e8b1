// kvattn/attention/backend_registry.h — backends by name, and the selector that picks one for
// a layer configuration and says why every candidate was taken or rejected (vLLM's
// attention selector + AttentionBackendEnum registry).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kvattn/attention/backend.h"

namespace kvattn {

class AttentionBackendRegistry {
 public:
  // The process-wide registry, pre-populated with FLASHINFER (native) and REFERENCE.
  static AttentionBackendRegistry& global();

  // Adds (or replaces) a backend; `priority` orders automatic selection (lower first).
  void register_backend(AttentionBackendPtr backend, int priority);
  // InvalidArgument listing the registered names when `name` is unknown.
  AttentionBackendPtr get(std::string_view name) const;
  bool contains(std::string_view name) const;
  // Names in selection order.
  std::vector<std::string> names() const;

 private:
  struct Entry {
    AttentionBackendPtr backend;
    int priority = 0;
  };
  std::map<std::string, Entry, std::less<>> entries_;
};

// One line per candidate: "FLASHINFER: selected" or "REFERENCE: rejected (head_size 80 not
// supported (supported: [64, 128]); ...)".
struct BackendSelection {
  AttentionBackendPtr backend;
  std::vector<std::string> log;
  std::string summary() const;  // the log joined with newlines
};

// Picks the first backend (in priority order, or exactly `requested` when given) whose
// validate_configuration is empty, logging every decision (logger() at info).  Throws
// InvalidArgument when `requested` is unknown (listing the names) or rejected, or when no
// backend accepts the configuration; the message carries every backend's reasons.
BackendSelection select_attention_backend(const AttentionSelectorConfig& sel, const BackendConfig& config,
                                          const std::optional<std::string>& requested = std::nullopt,
                                          const AttentionBackendRegistry& registry = AttentionBackendRegistry::global());

}  // namespace kvattn
