// reshape_and_cache_flash: check once, then dispatch on the key's device.
#include "kvattn/ops/reshape_and_cache.h"

#include <fmt/format.h>

#include "ops/common.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cuda_dispatch.h"

namespace kvattn::ops {
using namespace detail;

KVCacheDType parse_kv_cache_dtype(std::string_view name) {
  if (name == "auto" || name == "bfloat16" || name == "float16" || name == "float32" || name == "bf16" ||
      name == "fp16" || name == "half")
    return KVCacheDType::Auto;
  if (name == "fp8" || name == "fp8_e4m3") return KVCacheDType::Fp8E4M3;
  if (name == "fp8_e5m2") return KVCacheDType::Fp8E5M2;
  throw InvalidArgument(fmt::format("unknown kv_cache_dtype \"{}\"; valid: auto, fp8, fp8_e4m3, fp8_e5m2 "
                                    "(a model dtype name means auto)", name));
}

const char* kv_cache_dtype_name(KVCacheDType t) noexcept {
  switch (t) {
    case KVCacheDType::Auto: return "auto";
    case KVCacheDType::Fp8E4M3: return "fp8_e4m3";
    case KVCacheDType::Fp8E5M2: return "fp8_e5m2";
  }
  return "?";
}

void reshape_and_cache_flash(const ReshapeAndCacheArgs& args) {
  const CacheWriteDims d = validate_reshape_and_cache(args);
  if (args.key.device().is_cuda()) return cuda_impl::reshape_and_cache_flash(args);
  cpu::reshape_and_cache_flash(args, d);
}

void reshape_and_cache_flash(const Tensor& key, const Tensor& value, const Tensor& key_cache,
                             const Tensor& value_cache, const Tensor& slot_mapping, std::string_view kv_cache_dtype,
                             const Tensor& k_scale, const Tensor& v_scale) {
  ReshapeAndCacheArgs a;
  a.key = key; a.value = value; a.key_cache = key_cache; a.value_cache = value_cache;
  a.slot_mapping = slot_mapping; a.kv_cache_dtype = parse_kv_cache_dtype(kv_cache_dtype);
  a.k_scale = k_scale; a.v_scale = v_scale;
  reshape_and_cache_flash(a);
}

}  // namespace kvattn::ops
