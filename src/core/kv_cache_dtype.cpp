#include "kvattn/core/kv_cache_dtype.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kvattn/core/error.h"

namespace kvattn {

namespace {

struct Entry {
  KVCacheDType t;
  std::string_view name;
};
// The one table of names (vLLM's CacheDType spellings); kAllKVCacheDTypes order.
constexpr Entry kNames[] = {
    {KVCacheDType::Auto, "auto"},         {KVCacheDType::BFloat16, "bfloat16"},
    {KVCacheDType::Float16, "float16"},   {KVCacheDType::Fp8, "fp8"},
    {KVCacheDType::Fp8E4M3, "fp8_e4m3"},  {KVCacheDType::Fp8E5M2, "fp8_e5m2"},
    {KVCacheDType::Nvfp4, "nvfp4"},
};
static_assert(std::size(kNames) == kAllKVCacheDTypes.size());

}  // namespace

const char* kv_cache_dtype_name(KVCacheDType t) noexcept {
  for (const Entry& e : kNames)
    if (e.t == t) return e.name.data();
  return "?";
}

std::optional<KVCacheDType> kv_cache_dtype_from_name(std::string_view name) noexcept {
  for (const Entry& e : kNames)
    if (e.name == name) return e.t;
  return std::nullopt;
}

std::vector<std::string> kv_cache_dtype_choices() {
  std::vector<std::string> v;
  for (const Entry& e : kNames) v.emplace_back(e.name);
  return v;
}

std::string kv_cache_dtype_choices_str() { return fmt::format("{}", fmt::join(kv_cache_dtype_choices(), ", ")); }

std::string kv_cache_dtype_names(std::span<const KVCacheDType> dtypes) {
  std::string s;
  for (KVCacheDType t : dtypes) {
    if (!s.empty()) s += ", ";
    s += kv_cache_dtype_name(t);
  }
  return s;
}

KVCacheDType parse_kv_cache_dtype(std::string_view name) {
  if (auto t = kv_cache_dtype_from_name(name)) return *t;
  throw InvalidArgument(fmt::format("unknown kv_cache_dtype '{}'; valid: {} (\"auto\" stores the model dtype; "
                                    "\"fp8\" is fp8_e4m3)",
                                    name, kv_cache_dtype_choices_str()));
}

}  // namespace kvattn
