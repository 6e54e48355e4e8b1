// The op harness's CPU cases (op_harness.h): every public op x dtype x KV layout on CPU against
// its oracle, as named cases, e.g. paged_attention/OpHarness.Run/bf16_kv_fp8e4m3_LBNHC_cpu_prefill_gqa3_causal_scales.
#include "op_harness.h"

namespace kvattn::ops::harness {
namespace {

KVATTN_OP_HARNESS_INSTANTIATE(Dev::cpu);

}  // namespace
}  // namespace kvattn::ops::harness
