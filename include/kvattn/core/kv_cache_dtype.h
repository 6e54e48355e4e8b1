// kvattn/core/kv_cache_dtype.h — the KV cache's storage type: vLLM's `kv_cache_dtype`.
//
// One enum and one table of names, used from the CLI and Python down to the kernels.  The
// names are vLLM's CacheDType spellings (vllm/config/cache.py):
//   "auto"      the model's dtype (the cache stores what attention computes in)
//   "bfloat16"  bfloat16 storage         "float16"   float16 storage
//   "fp8"       fp8 e4m3 (vLLM's CUDA meaning of "fp8")
//   "fp8_e4m3"  fp8 e4m3 (OCP E4M3FN)    "fp8_e5m2"  fp8 e5m2
//   "nvfp4"     NVFP4 (packed fp4 + fp8 block scales): a recognised name that kvattn has no
//               kernel for; backends refuse it (validate_configuration says why) and the kernels
//               answer Unsupported.
// Parsing is exact (no case folding, no other aliases), so "bf16" or "half" is an error that
// lists the accepted names.  "fp8" and "fp8_e4m3" store the same bytes but keep their own names,
// so a requested value prints as it was given.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvattn/core/dtype.h"

namespace kvattn {

enum class KVCacheDType : uint8_t { Auto, BFloat16, Float16, Fp8, Fp8E4M3, Fp8E5M2, Nvfp4 };

// Every value, in the order of the name table (and of kv_cache_dtype_choices()).
inline constexpr std::array<KVCacheDType, 7> kAllKVCacheDTypes = {
    KVCacheDType::Auto, KVCacheDType::BFloat16, KVCacheDType::Float16, KVCacheDType::Fp8,
    KVCacheDType::Fp8E4M3, KVCacheDType::Fp8E5M2, KVCacheDType::Nvfp4};

// vLLM's spelling: "auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "nvfp4".
const char* kv_cache_dtype_name(KVCacheDType t) noexcept;
// The value whose name is exactly `name`; nullopt otherwise.
std::optional<KVCacheDType> kv_cache_dtype_from_name(std::string_view name) noexcept;
// Like kv_cache_dtype_from_name; throws InvalidArgument naming the bad value and listing the
// accepted names (kv_cache_dtype_choices()).
KVCacheDType parse_kv_cache_dtype(std::string_view name);
// Every accepted name, table order.
std::vector<std::string> kv_cache_dtype_choices();
// "auto, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2, nvfp4" (for help texts and messages).
std::string kv_cache_dtype_choices_str();
// The names of `dtypes` joined by ", " (e.g. a backend's supported set, for messages).
std::string kv_cache_dtype_names(std::span<const KVCacheDType> dtypes);

// fp8 / fp8_e4m3 / fp8_e5m2.
constexpr bool is_fp8(KVCacheDType t) noexcept {
  return t == KVCacheDType::Fp8 || t == KVCacheDType::Fp8E4M3 || t == KVCacheDType::Fp8E5M2;
}
constexpr bool is_nvfp4(KVCacheDType t) noexcept { return t == KVCacheDType::Nvfp4; }
// Quantised storage (vLLM is_quantized_kv_cache): fp8 or nvfp4; auto and the 16-bit floats are not.
constexpr bool is_quantized(KVCacheDType t) noexcept { return is_fp8(t) || is_nvfp4(t); }

// The element dtype of the cache: auto -> model_dtype; bfloat16 / float16 -> bf16 / f16;
// fp8 and fp8_e4m3 -> fp8_e4m3; fp8_e5m2 -> fp8_e5m2; nvfp4 -> u8 (packed bytes, as FlashInfer's
// get_dtype_for_flashinfer).
constexpr DType kv_cache_storage_dtype(KVCacheDType t, DType model_dtype) noexcept {
  switch (t) {
    case KVCacheDType::Auto: return model_dtype;
    case KVCacheDType::BFloat16: return DType::bf16;
    case KVCacheDType::Float16: return DType::f16;
    case KVCacheDType::Fp8:
    case KVCacheDType::Fp8E4M3: return DType::fp8_e4m3;
    case KVCacheDType::Fp8E5M2: return DType::fp8_e5m2;
    case KVCacheDType::Nvfp4: return DType::u8;
  }
  return model_dtype;
}

}  // namespace kvattn
