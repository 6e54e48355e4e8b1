// kvattn/ops/reshape_and_cache.h — write this step's K and V into the paged cache.
//
// vLLM `reshape_and_cache_flash` (csrc/cache_kernels.cu), as called by FlashInfer's
// `do_kv_cache_update`.  For every token t < slot_mapping.size(0) with slot = slot_mapping[t]
// >= 0:  block = slot / block_size, offset = slot % block_size, and for every head h, dim d
//     key_cache[block, offset, h, d]   = cvt(key[t, h, d])
//     value_cache[block, offset, h, d] = cvt(value[t, h, d])
// where cvt is a plain dtype conversion for kv_cache_dtype auto / bfloat16 / float16 (the cache's
// dtype) and, for fp8, fp8(float(x) / scale[h or 0]) saturating to the format's finite range.
//
// The caches are *strided views* shaped [num_blocks, block_size, num_kv_heads, head_size]
// (the NHD order of the logical axes; any strides), so every KVCacheLayout works:
//   * NHD page interior: natural strides; HND: key_cache = hnd.transpose(1, 2);
//   * vLLM's per-layer [B, H, N, C] view with K and V concatenated in C:
//     split_kv_cache_layer_view() in kvattn/ops/paged_attention.h gives both views.
#pragma once

#include <string_view>

#include "kvattn/core/kv_cache_dtype.h"
#include "kvattn/core/tensor.h"

namespace kvattn::ops {

struct ReshapeAndCacheArgs {
  Tensor key;           // [num_tokens_padded, num_kv_heads, head_size] f32/f16/bf16, any strides
  Tensor value;         // [num_tokens_padded, num_kv_heads, head_size] same dtype as key
  Tensor key_cache;     // [num_blocks, block_size, num_kv_heads, head_size] strided view;
                        //   dtype kv_cache_storage_dtype(kv_cache_dtype, key dtype); fp8 caches
                        //   may also be u8 (viewed as the fp8 format); nvfp4: Unsupported
  Tensor value_cache;   // same shape and dtype as key_cache (strides may differ)
  Tensor slot_mapping;  // [num_tokens] int64 (or int32); num_tokens <= key rows; -1 = skip
  KVCacheDType kv_cache_dtype = KVCacheDType::Auto;
  Tensor k_scale;       // fp8 only: [1] or [num_kv_heads] f32 (per tensor / per head)
  Tensor v_scale;       // fp8 only: same shape as k_scale
};

// Checks every argument (shapes, dtypes, scale sizes, slot < num_blocks * block_size) before
// touching memory, then dispatches on key's device.
void reshape_and_cache_flash(const ReshapeAndCacheArgs& args);

// vLLM argument order; the string form parses the name (parse_kv_cache_dtype).
void reshape_and_cache_flash(const Tensor& key, const Tensor& value, const Tensor& key_cache,
                             const Tensor& value_cache, const Tensor& slot_mapping,
                             KVCacheDType kv_cache_dtype, const Tensor& k_scale, const Tensor& v_scale);
void reshape_and_cache_flash(const Tensor& key, const Tensor& value, const Tensor& key_cache,
                             const Tensor& value_cache, const Tensor& slot_mapping,
                             std::string_view kv_cache_dtype, const Tensor& k_scale,
                             const Tensor& v_scale);

}  // namespace kvattn::ops
