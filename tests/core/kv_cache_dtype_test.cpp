#include <gtest/gtest.h>

#include <string>

#include "kvattn/core/error.h"
#include "kvattn/core/kv_cache_dtype.h"

using namespace kvattn;

TEST(KVCacheDType, OneTableOfVllmNamesRoundTrips) {
  const std::vector<std::string> want = {"auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "nvfp4"};
  EXPECT_EQ(kv_cache_dtype_choices(), want);
  EXPECT_EQ(kv_cache_dtype_choices_str(), "auto, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2, nvfp4");
  ASSERT_EQ(kAllKVCacheDTypes.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(kv_cache_dtype_name(kAllKVCacheDTypes[i]), want[i]);
    EXPECT_EQ(parse_kv_cache_dtype(want[i]), kAllKVCacheDTypes[i]);
  }
  // "fp8" keeps its own name; it stores what "fp8_e4m3" stores.
  EXPECT_EQ(parse_kv_cache_dtype("fp8"), KVCacheDType::Fp8);
  EXPECT_EQ(kv_cache_storage_dtype(KVCacheDType::Fp8, DType::bf16), DType::fp8_e4m3);
}

TEST(KVCacheDType, OtherSpellingsAreRefusedWithTheValidNames) {
  for (const char* bad : {"bf16", "half", "fp16", "float32", "FP8", "Auto", "fp8e4m3", "int8", ""}) {
    SCOPED_TRACE(bad);
    EXPECT_FALSE(kv_cache_dtype_from_name(bad).has_value());
    try {
      (void)parse_kv_cache_dtype(bad);
      ADD_FAILURE() << "accepted";
    } catch (const InvalidArgument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(std::string("'") + bad + "'"), std::string::npos) << m;
      EXPECT_NE(m.find("auto, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2, nvfp4"), std::string::npos) << m;
    }
  }
}

TEST(KVCacheDType, StorageAndQuantisation) {
  EXPECT_EQ(kv_cache_storage_dtype(KVCacheDType::Auto, DType::f32), DType::f32);
  EXPECT_EQ(kv_cache_storage_dtype(KVCacheDType::Auto, DType::f16), DType::f16);
  EXPECT_EQ(kv_cache_storage_dtype(KVCacheDType::BFloat16, DType::f32), DType::bf16);
  EXPECT_EQ(kv_cache_storage_dtype(KVCacheDType::Float16, DType::bf16), DType::f16);
  EXPECT_EQ(kv_cache_storage_dtype(KVCacheDType::Fp8E4M3, DType::bf16), DType::fp8_e4m3);
  EXPECT_EQ(kv_cache_storage_dtype(KVCacheDType::Fp8E5M2, DType::bf16), DType::fp8_e5m2);
  EXPECT_EQ(kv_cache_storage_dtype(KVCacheDType::Nvfp4, DType::bf16), DType::u8);
  int fp8 = 0, quantized = 0;
  for (KVCacheDType t : kAllKVCacheDTypes) {
    fp8 += is_fp8(t);
    quantized += is_quantized(t);
  }
  EXPECT_EQ(fp8, 3);
  EXPECT_EQ(quantized, 4);
  EXPECT_TRUE(is_nvfp4(KVCacheDType::Nvfp4));
  EXPECT_FALSE(is_quantized(KVCacheDType::BFloat16));
  EXPECT_EQ(kv_cache_dtype_names(std::vector<KVCacheDType>{KVCacheDType::Auto, KVCacheDType::Fp8E5M2}),
            "auto, fp8_e5m2");
}
