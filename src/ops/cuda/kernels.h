// src/ops/cuda/kernels.h — plain-C++ parameter blocks and launchers of the CUDA kernels.
//
// The .cu files hold the kernels and thin launchers that return a cudaError_t as int (0 =
// success); dispatch.cpp turns Tensors into these blocks and errors into typed exceptions.
// No CUDA header is included here, so g++-compiled files can use it.
#pragma once

#include <cstdint>

namespace kvattn::ops::cuda_impl::k {

// Element types the kernels understand (mirrors kvattn::DType's float types).
enum class Elt : int { f32 = 0, f16 = 1, bf16 = 2, e4m3 = 3, e5m2 = 4 };

// A 1-D or 2-D int32/int64 device index tensor; strides in elements.
struct Idx {
  const void* ptr = nullptr;
  int64_t s0 = 1, s1 = 1;
  bool is64 = false;
};

// ---- reshape_and_cache_flash -----------------------------------------------------------
struct CacheWriteParams {
  const void* key = nullptr;
  const void* value = nullptr;
  int64_t k_st = 0, k_sh = 0, k_sd = 1;  // key strides (elements): token, head, dim
  int64_t v_st = 0, v_sh = 0, v_sd = 1;
  Elt src = Elt::bf16;
  void* key_cache = nullptr;
  void* value_cache = nullptr;
  int64_t kc_sb = 0, kc_so = 0, kc_sh = 0, kc_sd = 1;  // cache strides (elements): block, slot, head, dim
  int64_t vc_sb = 0, vc_so = 0, vc_sh = 0, vc_sd = 1;
  Elt dst = Elt::bf16;
  Idx slots;
  int64_t num_tokens = 0, num_heads = 0, head_size = 0, block_size = 0, num_blocks = 0;
  const float* k_scale = nullptr;  // fp8 only
  const float* v_scale = nullptr;
  bool per_head_scale = false;
};
int launch_reshape_and_cache(const CacheWriteParams& p);
// ---- small ops -----------------------------------------------------------------------------
int launch_zero_kv_blocks(const int64_t* addrs, const int64_t* strides, const int64_t* pages,
                          int64_t num_segs, Idx block_ids, int64_t num_ids, int64_t max_page_words);
int launch_copy_page_indices(Idx out, Idx block_table, Idx indptr, int64_t num_reqs);
int launch_mamba_align(Idx out, Idx block_table, Idx seq_lens, int64_t num_reqs, int64_t n_out,
                       int64_t width, int64_t block_size);

struct Fp8DequantParams {
  const uint8_t* k = nullptr;
  const uint8_t* v = nullptr;
  int64_t k_sb = 0, k_so = 0, k_sh = 0, k_sd = 1;
  int64_t v_sb = 0, v_so = 0, v_sh = 0, v_sd = 1;
  Elt src = Elt::e4m3;
  void* ok = nullptr;
  void* ov = nullptr;
  int64_t ok_sb = 0, ok_so = 0, ok_sh = 0, ok_sd = 1;
  int64_t ov_sb = 0, ov_so = 0, ov_sh = 0, ov_sd = 1;
  Elt dst = Elt::bf16;
  Idx block_tables;
  int64_t num_reqs = 0, pages_per_req = 0, page_size = 0, num_heads = 0, head_dim = 0,
          num_pages = 0;
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
};
int launch_kvfp8_dequant(const Fp8DequantParams& p);

struct MergeParams {
  void* out = nullptr;
  int64_t o_st = 0, o_sh = 0, o_sd = 1;
  Elt out_t = Elt::bf16;
  const void* prefix = nullptr;
  int64_t p_st = 0, p_sh = 0, p_sd = 1;
  const void* suffix = nullptr;
  int64_t s_st = 0, s_sh = 0, s_sd = 1;
  Elt in_t = Elt::bf16;
  const float* prefix_lse = nullptr;  // [H, T]
  int64_t pl_sh = 0, pl_st = 1;
  const float* suffix_lse = nullptr;
  int64_t sl_sh = 0, sl_st = 1;
  float* out_lse = nullptr;
  int64_t ol_sh = 0, ol_st = 1;
  int64_t prefill_tokens_with_context = -1;  // -1 = none
  const float* output_scale = nullptr;
  int64_t num_tokens = 0, num_heads = 0, head_dim = 0;
};
int launch_merge_attn_states(const MergeParams& p);

int launch_mask_empty_context_lse(float* lse, int64_t l_sh, int64_t l_st, int64_t num_heads,
                                  int64_t num_tokens, Idx qsl, Idx csl, int64_t num_reqs);

// ---- paged attention --------------------------------------------------------------------------
struct AttnParams {
  const void* q = nullptr;
  int64_t q_st = 0, q_sh = 0, q_sd = 1;  // elements
  Elt q_t = Elt::bf16;
  bool q_vec = false;  // 16-bit query with 16-byte aligned, dim-contiguous rows
  const void* k = nullptr;  // element (0,0,0,0) of the K view
  const void* v = nullptr;
  int64_t k_sb = 0, k_so = 0, k_sh = 0;  // BYTES: page, slot, head (dim stride must be 1)
  int64_t v_sb = 0, v_so = 0, v_sh = 0;
  Elt kv_t = Elt::bf16;
  void* out = nullptr;
  int64_t o_st = 0, o_sh = 0, o_sd = 1;
  Elt out_t = Elt::bf16;
  bool o_vec = false;  // 16-bit output with 16-byte aligned, dim-contiguous rows
  float* lse = nullptr;
  int64_t lse_st = 0, lse_sh = 0;
  bool lse_natural = false;

  Idx qo_indptr;
  bool paged_form = true;
  Idx kv_indptr, kv_indices, last_page_len;  // form A
  Idx block_table, seq_lens;                 // form B
  int64_t max_blocks = 0;                    // form B row width
  int64_t kv_entries = 0;  // form A: rows of kv_indices (host decisions only: the small path's average length)

  int batch = 0;
  int64_t num_tokens = 0;
  int hq = 0, hkv = 0, group = 1, head_dim = 0, page_size = 0;
  int page_shift = -1;  // log2(page_size) when a power of two, else -1
  int64_t num_pages = 0;
  bool causal = true;
  int64_t window_left = -1;
  float soft_cap = 0.f;   // <= 0 off
  float sm_scale = 1.f;   // sm_scale * q_scale * k_scale
  float v_scale = 1.f;
  const float* sinks = nullptr;
  int64_t sinks_s = 1;
  const int32_t* mm = nullptr;  // [num_tokens, 2]
  int64_t mm_s0 = 2, mm_s1 = 1;
  const int32_t* xqa = nullptr;  // [num_tokens, P] words
  int64_t xqa_s0 = 0, xqa_s1 = 1;
};

// Workspace the paged-attention launcher needs (bytes), given the split bound it will use.
struct AttnPlanShape {
  int config = 0;      // 0 = decode (16 rows / CTA, warps split KV), 1 = prefill (64 rows / CTA)
  int max_splits = 1;  // S_max
  int64_t max_items = 0;
  int grid = 0;        // persistent CTAs
  int target_ctas = 0;
  int64_t workspace_bytes = 0;  // plan_bytes + scratch_bytes (one workspace holds both)
  // The workspace in two regions: the plan tables the plan kernel writes and later calls may
  // reuse (request bounds, work items, split chunk, work counter, token map, stream-K tables),
  // and the per-call scratch (split partials) that every call overwrites.
  int64_t plan_bytes = 0, scratch_bytes = 0;
  bool reuse_plan = false;  // launch_paged_attention's !run_plan, for its launchers (not a decision)
  bool mixed_kv_lens = false;  // the caller's KvLengthsHint::mixed: decode config runs stream-K (see streamk_on)
  int small = 0;        // 1: small-call path (decode config, one launch: see KernelRouting::small_decode)
  int small_units = 0;  // its (request, row tile, KV head) unit bound
  int cluster = 0;      // small path on the cluster kernel (small_decode.cu): pieces per unit, else 0
};
// Fills the shape (host-side decisions) — returns 0 or an error code; `supported` false with
// a reason when the head dim / dtype combination has no kernel.
int plan_paged_attention(const AttnParams& p, int num_sms, AttnPlanShape* shape, const char** why);
// plan_ws: the shape's plan region (plan_bytes); scratch_ws: its scratch region (scratch_bytes).
// run_plan false: the plan region already holds the plan of a call with the same plan inputs
// (batch, index tensors and their contents, heads, page size, masks, options; the caller's
// PagedAttentionPlan decides) and the plan kernel is skipped.  The work counters reset
// themselves at the end of every attention launch, so a kept plan stays ready to run.
int launch_paged_attention(const AttnParams& p, const AttnPlanShape& shape, void* plan_ws, void* scratch_ws,
                           bool run_plan);
// Small-call decode path (AttnPlanShape::small): one launch that plans in every CTA, runs the
// decode tiles and merges the split pieces of a (request, row tile, KV head) unit in the CTA
// whose piece arrives last (self-resetting counters, CUDA-graph safe).  Routing
// (KernelRouting::small_decode): automatic = decode calls of <= 32 requests whose units all fit
// one wave of CTAs; off = never; force = every decode call of <= 32 requests.  Where it fits, the
// cluster kernel of small_decode.cu runs it (sm_90+: the pieces of a (request, KV head) unit are
// one thread-block cluster and merge over distributed shared memory), attn_kernel<..., SMALL>
// otherwise.  Decode-config calls of attn_kernel run under KernelRouting::decode_options (the
// kOpt* bits of routing.h).
// Plans (current device) that chose a chunk which does not divide the request (synchronises;
// tests).
int64_t rem_split_plans();

// ---- paged prefill (prefill_kernel.cu) -------------------------------------------------------
// FA2-class kernel for calls with many query rows per request over bf16/f16 caches; the
// launcher runs its own plan kernel (no split-KV, but for the wgmma kernel's cut tail:
// hopper_prefill.h).  dispatch.cpp asks prefill_eligible() first and falls back to
// launch_paged_attention() for everything else.
// Routing: KernelRouting::prefill (automatic: supported and large calls; off: always attn_kernel;
// force: every supported call).
bool prefill_supported(const AttnParams& p);       // dtype / head dim / options it implements
bool prefill_eligible(const AttnParams& p, int num_sms);  // supported and chosen (mode, size)
// The plan tables (kept with a plan) and the scratch a launch writes and reads (the wgmma
// kernel's partial results of units cut in its list's tail; 0 bytes where it cuts none).
int64_t prefill_workspace_bytes(const AttnParams& p, int num_sms);
int64_t prefill_scratch_bytes(const AttnParams& p, int num_sms);
// run_plan false: `workspace` already holds the plan of a call with the same plan inputs (see
// launch_paged_attention); the plan kernel is skipped.  scratch: prefill_scratch_bytes() of
// device memory, or null (the plan then cuts no unit).
int launch_prefill_attention(const AttnParams& p, int num_sms, void* workspace, void* scratch, bool run_plan);

}  // namespace kvattn::ops::cuda_impl::k
