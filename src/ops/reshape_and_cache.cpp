// reshape_and_cache_flash: check once, then dispatch on the key's device.
#include "kvattn/ops/reshape_and_cache.h"

#include "ops/common.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cuda_dispatch.h"

namespace kvattn::ops {
using namespace detail;

void reshape_and_cache_flash(const ReshapeAndCacheArgs& args) {
  const CacheWriteDims d = validate_reshape_and_cache(args);
  if (args.key.device().is_cuda()) return cuda_impl::reshape_and_cache_flash(args);
  cpu::reshape_and_cache_flash(args, d);
}

void reshape_and_cache_flash(const Tensor& key, const Tensor& value, const Tensor& key_cache,
                             const Tensor& value_cache, const Tensor& slot_mapping, KVCacheDType kv_cache_dtype,
                             const Tensor& k_scale, const Tensor& v_scale) {
  ReshapeAndCacheArgs a;
  a.key = key; a.value = value; a.key_cache = key_cache; a.value_cache = value_cache;
  a.slot_mapping = slot_mapping; a.kv_cache_dtype = kv_cache_dtype;
  a.k_scale = k_scale; a.v_scale = v_scale;
  reshape_and_cache_flash(a);
}

void reshape_and_cache_flash(const Tensor& key, const Tensor& value, const Tensor& key_cache,
                             const Tensor& value_cache, const Tensor& slot_mapping, std::string_view kv_cache_dtype,
                             const Tensor& k_scale, const Tensor& v_scale) {
  reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, parse_kv_cache_dtype(kv_cache_dtype),
                          k_scale, v_scale);
}

}  // namespace kvattn::ops
