// src/attention/backend_registry.cpp — registry and selector.
#include "kvattn/attention/backend_registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "kvattn/attention/native_backend.h"
#include "kvattn/attention/reference_backend.h"
#include "kvattn/core/error.h"
#include "kvattn/core/log.h"

namespace kvattn {

AttentionBackendRegistry& AttentionBackendRegistry::global() {
  static AttentionBackendRegistry* registry = [] {
    auto* r = new AttentionBackendRegistry();  // immortal: backends outlive every user
    r->register_backend(std::make_shared<FlashInferBackend>(), 0);
    r->register_backend(std::make_shared<ReferenceBackend>(), 100);
    return r;
  }();
  return *registry;
}

void AttentionBackendRegistry::register_backend(AttentionBackendPtr backend, int priority) {
  KVATTN_CHECK(backend != nullptr, "register_backend: null backend");
  const std::string name = backend->get_name();
  entries_[name] = Entry{std::move(backend), priority};
}

AttentionBackendPtr AttentionBackendRegistry::get(std::string_view name) const {
  auto it = entries_.find(name);
  KVATTN_CHECK(it != entries_.end(), "Unknown attention backend '{}'; registered backends: [{}]", name,
               fmt::join(names(), ", "));
  return it->second.backend;
}

bool AttentionBackendRegistry::contains(std::string_view name) const { return entries_.find(name) != entries_.end(); }

std::vector<std::string> AttentionBackendRegistry::names() const {
  std::vector<std::pair<int, std::string>> order;
  for (const auto& [n, e] : entries_) order.emplace_back(e.priority, n);
  std::stable_sort(order.begin(), order.end());
  std::vector<std::string> out;
  for (auto& [_, n] : order) out.push_back(n);
  return out;
}

std::string BackendSelection::summary() const { return fmt::format("{}", fmt::join(log, "\n")); }

BackendSelection select_attention_backend(const AttentionSelectorConfig& sel, const BackendConfig& config,
                                          const std::optional<std::string>& requested,
                                          const AttentionBackendRegistry& registry) {
  BackendSelection result;
  const std::vector<std::string> candidates =
      requested ? std::vector<std::string>{registry.get(*requested)->get_name()} : registry.names();
  for (const auto& name : candidates) {
    AttentionBackendPtr b = registry.get(name);
    const auto reasons = b->validate_configuration(sel, config);
    if (reasons.empty() && !result.backend) {
      result.backend = b;
      result.log.push_back(fmt::format("{}: selected", name));
    } else if (reasons.empty()) {
      result.log.push_back(fmt::format("{}: valid, not taken (lower priority)", name));
    } else {
      result.log.push_back(fmt::format("{}: rejected ({})", name, fmt::join(reasons, "; ")));
    }
  }
  for (const auto& line : result.log) logger().info("attention backend selection [{}]: {}", sel.str(), line);
  if (!result.backend) {
    if (requested)
      throw InvalidArgument(fmt::format("Attention backend {} cannot run this configuration ({}) on {}: {}", *requested,
                                        sel.str(), config.platform.str(), result.summary()));
    throw InvalidArgument(fmt::format("No attention backend supports this configuration ({}) on {}:\n{}", sel.str(),
                                      config.platform.str(), result.summary()));
  }
  return result;
}

}  // namespace kvattn
