// src/ops/cuda/dispatch.cpp — the CUDA side of the ops/ entry points (see
// src/ops/cuda_dispatch.h): Tensors -> kernel parameter blocks, errors -> typed exceptions.
// Plain C++ (g++), so fmt's checked format strings work here; kernels live in the .cu files.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <vector>

#include "kvattn/core/buffer.h"
#include "kvattn/core/cuda_runtime_api.h"
#include "ops/common.h"
#include "ops/cuda/attention_path.h"
#include "ops/cuda/dcp_kernels.h"
#include "ops/cuda/f32_attention.h"
#include "ops/cuda/hopper_prefill.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/page_decode.h"
#include "ops/cuda/routing.h"
#include "ops/cuda_dispatch.h"
#include "ops/plan_state.h"

namespace kvattn::ops::cuda_impl {
namespace {

void check_launch(int err, const char* op) {
  if (err == 0) return;
  const auto e = static_cast<cudaError_t>(err);
  throw InternalError(fmt::format("{}: CUDA kernel launch failed: error {} ({}); if this follows an earlier "
                                  "failure the context may be corrupted — run under compute-sanitizer",
                                  op, err, cudaGetErrorString(e)));
}

// Makes the tensor's device current for the launch.
class DeviceGuard {
 public:
  explicit DeviceGuard(const Tensor& t) {
    cudaGetDevice(&prev_);
    if (t.device().index != prev_) cudaSetDevice(t.device().index);
    cur_ = t.device().index;
  }
  ~DeviceGuard() {
    if (cur_ != prev_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0, cur_ = 0;
};

k::Elt elt_of(DType t, const char* op, const char* name) {
  switch (t) {
    case DType::f32: return k::Elt::f32;
    case DType::f16: return k::Elt::f16;
    case DType::bf16: return k::Elt::bf16;
    case DType::fp8_e4m3: return k::Elt::e4m3;
    case DType::fp8_e5m2: return k::Elt::e5m2;
    default: break;
  }
  throw Unsupported(fmt::format("{}: `{}` has dtype {}, which the CUDA kernels do not read", op, name, dtype_name(t)));
}

k::Idx idx_of(const Tensor& t) {
  k::Idx x;
  if (!t.defined()) return x;
  x.ptr = t.data();
  x.is64 = t.dtype() == DType::i64;
  x.s0 = t.dim() >= 1 ? t.stride(0) : 1;
  x.s1 = t.dim() >= 2 ? t.stride(1) : 1;
  return x;
}

// The persistent workspace of paged_attention, one per device: grown (never shrunk) when a
// call needs more.  A call inside CUDA-graph capture must not grow it: run one step of the
// largest shape before capturing (as FlashInfer's plan() is run before capture).
struct Workspace {
  std::mutex mu;
  std::shared_ptr<Buffer> buf[16];
};
Workspace& workspace() {
  static Workspace w;
  return w;
}
void* workspace_for(int device, int64_t bytes) {
  Workspace& w = workspace();
  std::lock_guard<std::mutex> lock(w.mu);
  auto& b = w.buf[device & 15];
  if (!b || static_cast<int64_t>(b->size()) < bytes) {
    b.reset();
    const int64_t grow = std::max<int64_t>(bytes, int64_t(1) << 20);
    b = Buffer::allocate(static_cast<size_t>(grow + grow / 4), Device::cuda(device));
  }
  return b->data();
}

// Serialises the enqueue of one paged_attention call (plan kernel, attention, split merge) per
// device: calls from several host threads on one device (e.g. DCP ranks sharing a GPU) would
// otherwise interleave their launches on the device's default stream and overwrite each
// other's plan and partial results in the shared workspace.  Held only while enqueuing.
std::mutex& launch_mutex(int device) {
  static std::mutex m[16];
  return m[device & 15];
}

// ---- kept plans (PagedAttentionPlan) ------------------------------------------------------------
// Everything a plan kernel's tables depend on besides the contents of the index tensors (the
// caller's invalidate() covers those): which plan kernel, the index tensors' addresses and strides,
// the batch's sizes, the masks the plan reads, the routing settings that pick the kernel (and so its
// tile sizes), the launch shape.  Not the K/V caches, query, output or scales: they may change
// from call to call (the layers of a step).
void add_idx(std::vector<int64_t>& key, const k::Idx& x) {
  key.insert(key.end(), {static_cast<int64_t>(reinterpret_cast<uintptr_t>(x.ptr)), x.s0, x.s1, x.is64 ? 1 : 0});
}
std::vector<int64_t> plan_key(const k::AttnParams& p, int device, const k::AttnPlanShape* shape) {
  std::vector<int64_t> key;
  key.reserve(64);
  key.insert(key.end(), {device, shape == nullptr ? 1 : 2, p.batch, p.num_tokens, p.hq, p.hkv, p.head_dim,
                         p.page_size, p.num_pages, static_cast<int64_t>(p.q_t), static_cast<int64_t>(p.kv_t),
                         p.causal ? 1 : 0, p.window_left, p.mm != nullptr ? 1 : 0, p.xqa != nullptr ? 1 : 0,
                         p.paged_form ? 1 : 0, p.max_blocks});
  for (const k::Idx* x : {&p.qo_indptr, &p.kv_indptr, &p.kv_indices, &p.last_page_len, &p.block_table, &p.seq_lens})
    add_idx(key, *x);
  // the prefill kernels' plan (shape == nullptr): its row tile is fixed per head_dim
  // (prefill_kernel.cu PfCfgOf); the wgmma kernel's plan lists its units in an order of its own,
  // so the setting that may route a call to it, its L2 section budget, grid cap and tail split
  // are part of the key
  if (shape == nullptr) {
    key.push_back(static_cast<int64_t>(k::kernel_routing().prefill_hopper));
    key.push_back(k::kernel_routing().prefill_l2_budget);
    key.push_back(k::kernel_routing().prefill_hopper_ctas);  // the grid its list is dealt to
    key.push_back(k::kernel_routing().prefill_tail_split);
  } else {
    const k::KernelRouting& r = k::kernel_routing();
    key.insert(key.end(), {shape->config, shape->max_splits, shape->max_items, shape->grid, shape->target_ctas,
                           shape->small, shape->mixed_kv_lens ? 1 : 0, r.decode_options, r.decode_splits, r.decode_chunk});
  }
  return key;
}

// The plan region of `plan` for a call with `key` (grown to `bytes` on `device`); *run_plan
// says whether the call must run its plan kernel (no kept plan of this key) or may skip it.
// Called with the device's launch mutex held; plan_done() marks the plan kept once the launch
// was enqueued without error.
void* plan_region(PagedAttentionPlan::State& st, const std::vector<int64_t>& key, int64_t bytes, int device,
                  bool* run_plan) {
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.valid.load(std::memory_order_relaxed) && st.key == key && st.buf &&
      static_cast<int64_t>(st.buf->size()) >= bytes && st.buf->device().index == device) {
    *run_plan = false;
    return st.buf->data();
  }
  st.valid.store(false, std::memory_order_relaxed);
  if (!st.buf || static_cast<int64_t>(st.buf->size()) < bytes || st.buf->device().index != device) {
    st.buf.reset();
    st.buf = Buffer::allocate(static_cast<size_t>(std::max<int64_t>(bytes, 4096)), Device::cuda(device));
  }
  st.key = key;
  *run_plan = true;
  return st.buf->data();
}
void plan_done(PagedAttentionPlan::State& st, bool run_plan) {
  std::lock_guard<std::mutex> lock(st.mu);
  if (run_plan) {
    st.valid.store(true, std::memory_order_relaxed);
    st.plans.fetch_add(1, std::memory_order_relaxed);
  } else {
    st.reuses.fetch_add(1, std::memory_order_relaxed);
  }
}

int sm_count(int device) {
  static int cached[16] = {0};
  int& c = cached[device & 15];
  if (c == 0) c = kvattn::cuda::multiprocessor_count(device);
  return c;
}

}  // namespace

bool available() noexcept { return true; }

// ---- reshape_and_cache_flash -----------------------------------------------------------------
void reshape_and_cache_flash(const ReshapeAndCacheArgs& a) {
  static constexpr const char* op = "reshape_and_cache_flash";
  const detail::CacheWriteDims d = detail::validate_reshape_and_cache(a);
  DeviceGuard guard(a.key);
  k::CacheWriteParams p;
  p.key = a.key.data();
  p.value = a.value.data();
  p.k_st = a.key.stride(0); p.k_sh = a.key.stride(1); p.k_sd = a.key.stride(2);
  p.v_st = a.value.stride(0); p.v_sh = a.value.stride(1); p.v_sd = a.value.stride(2);
  p.src = elt_of(a.key.dtype(), op, "key");
  p.key_cache = a.key_cache.data();
  p.value_cache = a.value_cache.data();
  p.kc_sb = a.key_cache.stride(0); p.kc_so = a.key_cache.stride(1); p.kc_sh = a.key_cache.stride(2);
  p.kc_sd = a.key_cache.stride(3);
  p.vc_sb = a.value_cache.stride(0); p.vc_so = a.value_cache.stride(1); p.vc_sh = a.value_cache.stride(2);
  p.vc_sd = a.value_cache.stride(3);
  p.dst = elt_of(d.cache_dtype, op, "key_cache");
  p.slots = idx_of(a.slot_mapping);
  p.num_tokens = d.num_tokens;
  p.num_heads = d.num_heads;
  p.head_size = d.head_size;
  p.block_size = d.block_size;
  p.num_blocks = d.num_blocks;
  if (is_fp8(a.kv_cache_dtype)) {
    p.k_scale = static_cast<const float*>(a.k_scale.data());
    p.v_scale = static_cast<const float*>(a.v_scale.data());
    p.per_head_scale = d.per_head_scale;
    if (d.per_head_scale && (a.k_scale.stride(0) != 1 || a.v_scale.stride(0) != 1))
      throw Unsupported(fmt::format("{}: per-head k_scale/v_scale must be contiguous on CUDA (stride {} / {}); "
                                    "pass .contiguous() copies", op, a.k_scale.stride(0), a.v_scale.stride(0)));
  }
  check_launch(k::launch_reshape_and_cache(p), op);
}

// ---- paged_attention ---------------------------------------------------------------------------------
namespace {
// The kernels' parameter block of a validated call.
k::AttnParams attn_params(const PagedAttentionArgs& a, const detail::AttnDims& d) {
  static constexpr const char* op = "paged_attention";
  k::AttnParams p;
  p.q = a.query.data();
  p.q_st = a.query.stride(0); p.q_sh = a.query.stride(1); p.q_sd = a.query.stride(2);
  p.q_t = elt_of(a.query.dtype(), op, "query");
  p.kv_t = elt_of(a.k_cache.dtype(), op, "k_cache");
  const int64_t es = a.k_cache.element_size();
  for (const auto& [t, name] : {std::pair{&a.k_cache, "k_cache"}, std::pair{&a.v_cache, "v_cache"}}) {
    // float32 caches go to the SIMT kernel (f32_attention.cu), which reads rows element by element
    const bool f32_rows = p.kv_t == k::Elt::f32 && t->stride(3) == 1;
    const bool ok = f32_rows || (t->stride(3) == 1 && (reinterpret_cast<uintptr_t>(t->data()) % 16) == 0 &&
                    (t->stride(0) * es) % 16 == 0 && (t->stride(1) * es) % 16 == 0 && (t->stride(2) * es) % 16 == 0 &&
                    (d.head_dim * es) % 16 == 0);
    if (!ok)
      throw Unsupported(fmt::format(
          "{}: the CUDA kernel streams 16-byte rows, so `{}` needs head_dim contiguous (stride 1) and 16-byte "
          "aligned page/slot/head strides; got {}. Every KVCacheLayout of vLLM satisfies this — make a "
          "contiguous copy of an unusual view", op, name, t->str()));
  }
  p.k = a.k_cache.data();
  p.v = a.v_cache.data();
  p.k_sb = a.k_cache.stride(0) * es; p.k_so = a.k_cache.stride(1) * es; p.k_sh = a.k_cache.stride(2) * es;
  p.v_sb = a.v_cache.stride(0) * es; p.v_so = a.v_cache.stride(1) * es; p.v_sh = a.v_cache.stride(2) * es;
  p.out = a.out.data();
  p.o_st = a.out.stride(0); p.o_sh = a.out.stride(1); p.o_sd = a.out.stride(2);
  p.out_t = elt_of(a.out.dtype(), op, "out");
  auto vec16 = [](const Tensor& t) {
    return t.element_size() == 2 && t.stride(2) == 1 && (reinterpret_cast<uintptr_t>(t.data()) % 16) == 0 &&
           (t.stride(0) * 2) % 16 == 0 && (t.stride(1) * 2) % 16 == 0;
  };
  p.q_vec = vec16(a.query);
  p.o_vec = vec16(a.out);
  if (a.lse.defined()) {
    p.lse = static_cast<float*>(a.lse.data());
    p.lse_st = a.lse.stride(0);
    p.lse_sh = a.lse.stride(1);
  }
  p.lse_natural = a.lse_base == LseBase::E;
  p.qo_indptr = idx_of(a.qo_indptr);
  p.paged_form = d.paged_form;
  if (d.paged_form) {
    p.kv_indptr = idx_of(a.paged_kv_indptr);
    p.kv_indices = idx_of(a.paged_kv_indices);
    p.last_page_len = idx_of(a.paged_kv_last_page_len);
    p.kv_entries = a.paged_kv_indices.size(0);
  } else {
    p.block_table = idx_of(a.block_table);
    p.seq_lens = idx_of(a.seq_lens);
    p.max_blocks = a.block_table.size(1);
  }
  p.batch = static_cast<int>(d.batch);
  p.num_tokens = d.num_tokens;
  p.hq = static_cast<int>(d.num_qo_heads);
  p.hkv = static_cast<int>(d.num_kv_heads);
  p.group = static_cast<int>(d.num_qo_heads / d.num_kv_heads);
  p.head_dim = static_cast<int>(d.head_dim);
  p.page_size = static_cast<int>(d.page_size);
  if ((d.page_size & (d.page_size - 1)) == 0) {
    int sh = 0;
    while ((int64_t(1) << sh) < d.page_size) ++sh;
    p.page_shift = sh;
  }
  p.num_pages = d.num_pages;
  p.causal = a.causal;
  p.window_left = a.window_left;
  p.soft_cap = a.logits_soft_cap > 0 ? static_cast<float>(a.logits_soft_cap) : 0.f;
  p.sm_scale = static_cast<float>(d.sm_scale * a.q_scale * a.k_scale);
  p.v_scale = static_cast<float>(a.v_scale);
  if (a.sinks.defined()) {
    p.sinks = static_cast<const float*>(a.sinks.data());
    p.sinks_s = a.sinks.stride(0);
  }
  if (a.mm_prefix_ranges.defined()) {
    p.mm = static_cast<const int32_t*>(a.mm_prefix_ranges.data());
    p.mm_s0 = a.mm_prefix_ranges.stride(0);
    p.mm_s1 = a.mm_prefix_ranges.stride(1);
  }
  if (a.xqa_draft_mask.defined()) {
    p.xqa = static_cast<const int32_t*>(a.xqa_draft_mask.data());
    p.xqa_s0 = a.xqa_draft_mask.stride(0);
    p.xqa_s1 = a.xqa_draft_mask.stride(1);
  }
  return p;
}

AttentionPathQuery path_query(const PagedAttentionArgs& a) {
  AttentionPathQuery q;
  q.num_sms = sm_count(a.query.device().index);
  q.max_query_len = a.max_query_len;
  q.mixed_kv_lens = a.kv_lengths == KvLengthsHint::mixed;
  return q;
}
}  // namespace

AttentionPathChoice attention_path_for(const PagedAttentionArgs& a) {
  const detail::AttnDims d = detail::validate_paged_attention(a);
  DeviceGuard guard(a.query);
  return select_attention_path(attn_params(a, d), path_query(a));
}

void paged_attention(const PagedAttentionArgs& a) {
  static constexpr const char* op = "paged_attention";
  const detail::AttnDims d = detail::validate_paged_attention(a);
  DeviceGuard guard(a.query);
  const k::AttnParams p = attn_params(a, d);
  if (p.batch == 0 || p.num_tokens == 0) return;
  const int dev = a.query.device().index;
  const AttentionPathQuery q = path_query(a);
  const AttentionPathChoice c = select_attention_path(p, q);
  check_launch(c.error, op);
  switch (c.path) {
    case AttentionPath::unsupported:
      throw Unsupported(fmt::format("{}: {} (head_dim {}, query {}, cache {}); use CPU tensors for this case", op, c.reason,
                                    d.head_dim, dtype_name(a.query.dtype()), dtype_name(a.k_cache.dtype())));
    case AttentionPath::f32: {  // one launch, no plan or workspace
      std::lock_guard<std::mutex> launch_lock(launch_mutex(dev));
      check_launch(k::launch_f32_attention(p), op);
      return;
    }
    case AttentionPath::prefill_wgmma:
    case AttentionPath::prefill_mma: {  // one plan for both kernels (prefill_kernel.cu)
      std::lock_guard<std::mutex> launch_lock(launch_mutex(dev));
      const int64_t bytes = k::prefill_workspace_bytes(p, q.num_sms);
      const int64_t scratch = k::prefill_scratch_bytes(p, q.num_sms);
      if (a.plan == nullptr) {
        char* ws = static_cast<char*>(workspace_for(dev, bytes + scratch));
        check_launch(k::launch_prefill_attention(p, q.num_sms, ws, scratch > 0 ? ws + bytes : nullptr, true), op);
        return;
      }
      PagedAttentionPlan::State& st = a.plan->state();
      bool run_plan = true;
      void* ws = plan_region(st, plan_key(p, dev, nullptr), bytes, dev, &run_plan);
      void* scratch_ws = scratch > 0 ? workspace_for(dev, scratch) : nullptr;
      check_launch(k::launch_prefill_attention(p, q.num_sms, ws, scratch_ws, run_plan), op);
      plan_done(st, run_plan);
      return;
    }
    case AttentionPath::page_decode: {
      std::lock_guard<std::mutex> launch_lock(launch_mutex(dev));
      const k::PageDecodeShape ps = k::page_decode_shape(p, q.num_sms, a.max_query_len);
      if (a.plan == nullptr) {
        char* ws = static_cast<char*>(workspace_for(dev, ps.plan_bytes + ps.scratch_bytes));
        check_launch(k::launch_page_decode(p, ps, ws, ws + ps.plan_bytes, true), op);
        return;
      }
      PagedAttentionPlan::State& st = a.plan->state();
      bool run_plan = true;
      std::vector<int64_t> key = plan_key(p, dev, nullptr);
      key[1] = 3;  // this path's plan (the prefill kernel's is 1, attn_kernel's 2)
      key.insert(key.end(), {ps.grid, ps.rows});
      void* plan_ws = plan_region(st, key, ps.plan_bytes, dev, &run_plan);
      check_launch(k::launch_page_decode(p, ps, plan_ws, workspace_for(dev, ps.scratch_bytes), run_plan), op);
      plan_done(st, run_plan);
      return;
    }
    case AttentionPath::small_cluster:
    case AttentionPath::small_decode:
    case AttentionPath::attn_kernel: {
      const k::AttnPlanShape& shape = c.shape;
      std::lock_guard<std::mutex> launch_lock(launch_mutex(dev));
      if (a.plan == nullptr || shape.small) {  // the small path plans inside its one launch: nothing to keep
        char* ws = static_cast<char*>(workspace_for(dev, shape.workspace_bytes));
        check_launch(k::launch_paged_attention(p, shape, ws, ws + shape.plan_bytes, true), op);
        return;
      }
      PagedAttentionPlan::State& st = a.plan->state();
      bool run_plan = true;
      void* plan_ws = plan_region(st, plan_key(p, dev, &shape), shape.plan_bytes, dev, &run_plan);
      check_launch(k::launch_paged_attention(p, shape, plan_ws, workspace_for(dev, shape.scratch_bytes), run_plan), op);
      plan_done(st, run_plan);
      return;
    }
  }
}

// ---- merge_attn_states / mask_empty_context_lse -----------------------------------------------------
void merge_attn_states(const MergeAttnStatesArgs& a) {
  static constexpr const char* op = "merge_attn_states";
  const detail::MergeDims d = detail::validate_merge(a);
  DeviceGuard guard(a.output);
  k::MergeParams p;
  p.out = a.output.data();
  p.o_st = a.output.stride(0); p.o_sh = a.output.stride(1); p.o_sd = a.output.stride(2);
  p.out_t = elt_of(a.output.dtype(), op, "output");
  p.prefix = a.prefix_output.data();
  p.p_st = a.prefix_output.stride(0); p.p_sh = a.prefix_output.stride(1); p.p_sd = a.prefix_output.stride(2);
  p.suffix = a.suffix_output.data();
  p.s_st = a.suffix_output.stride(0); p.s_sh = a.suffix_output.stride(1); p.s_sd = a.suffix_output.stride(2);
  p.in_t = elt_of(a.prefix_output.dtype(), op, "prefix_output");
  p.prefix_lse = static_cast<const float*>(a.prefix_lse.data());
  p.pl_sh = a.prefix_lse.stride(0); p.pl_st = a.prefix_lse.stride(1);
  p.suffix_lse = static_cast<const float*>(a.suffix_lse.data());
  p.sl_sh = a.suffix_lse.stride(0); p.sl_st = a.suffix_lse.stride(1);
  if (a.output_lse.defined()) {
    p.out_lse = static_cast<float*>(a.output_lse.data());
    p.ol_sh = a.output_lse.stride(0); p.ol_st = a.output_lse.stride(1);
  }
  p.prefill_tokens_with_context = a.prefill_tokens_with_context ? std::max<int64_t>(*a.prefill_tokens_with_context, 0) : -1;
  if (a.output_scale.defined()) p.output_scale = static_cast<const float*>(a.output_scale.data());
  p.num_tokens = d.num_tokens;
  p.num_heads = d.num_heads;
  p.head_dim = d.head_dim;
  check_launch(k::launch_merge_attn_states(p), op);
}

void mask_empty_context_lse(const Tensor& lse, const Tensor& query_start_loc, const Tensor& context_start_loc) {
  DeviceGuard guard(lse);
  const int64_t R = query_start_loc.size(0) - 1;
  check_launch(k::launch_mask_empty_context_lse(static_cast<float*>(lse.data()), lse.stride(0), lse.stride(1),
                                                lse.size(0), lse.size(1), idx_of(query_start_loc),
                                                idx_of(context_start_loc), R),
               "mask_empty_context_lse");
}

// ---- small ops -----------------------------------------------------------------------------------------
void zero_kv_blocks(const Tensor& seg_addrs, const Tensor& seg_block_strides, const Tensor& seg_page_sizes,
                    const Tensor& block_ids) {
  static constexpr const char* op = "zero_kv_blocks";
  DeviceGuard guard(block_ids);
  for (const auto& [t, name] : {std::pair{&seg_addrs, "seg_addrs"}, std::pair{&seg_block_strides, "seg_block_strides"},
                                std::pair{&seg_page_sizes, "seg_page_sizes"}})
    if (t->stride(0) != 1)
      throw Unsupported(fmt::format("{}: `{}` must be contiguous on CUDA, got stride {}", op, name, t->stride(0)));
  // The launch grid needs the largest page; the table is built once (KVBlockZeroer), so read
  // the sizes back here (one small D2H copy) unless the caller's table is tiny.
  const int64_t S = seg_addrs.size(0);
  if (S == 0 || block_ids.size(0) == 0) return;
  std::vector<int64_t> pages(static_cast<size_t>(S));
  kvattn::cuda::memcpy(pages.data(), seg_page_sizes.data(), static_cast<size_t>(S) * 8);
  int64_t max_page = 0;
  for (int64_t v : pages) max_page = std::max(max_page, v);
  check_launch(k::launch_zero_kv_blocks(static_cast<const int64_t*>(seg_addrs.data()),
                                        static_cast<const int64_t*>(seg_block_strides.data()),
                                        static_cast<const int64_t*>(seg_page_sizes.data()), S, idx_of(block_ids),
                                        block_ids.size(0), max_page),
               op);
}

void copy_page_indices(const Tensor& paged_kv_indices, const Tensor& block_table, const Tensor& paged_kv_indptr) {
  DeviceGuard guard(paged_kv_indices);
  check_launch(k::launch_copy_page_indices(idx_of(paged_kv_indices), idx_of(block_table), idx_of(paged_kv_indptr),
                                           block_table.size(0)),
               "copy_page_indices");
}

void mamba_align_block_table(const Tensor& out, const Tensor& block_table, const Tensor& seq_lens, int64_t block_size) {
  DeviceGuard guard(out);
  check_launch(k::launch_mamba_align(idx_of(out), idx_of(block_table), idx_of(seq_lens), out.size(0), out.size(1),
                                     block_table.size(1), block_size),
               "mamba_align_block_table");
}

void kvfp8_dequant(const Tensor& k_cache, const Tensor& v_cache, const Tensor& block_tables, const Tensor& k_scale,
                   const Tensor& v_scale, const Tensor& out_k_cache, const Tensor& out_v_cache) {
  static constexpr const char* op = "kvfp8_dequant";
  DeviceGuard guard(k_cache);
  k::Fp8DequantParams p;
  p.k = static_cast<const uint8_t*>(k_cache.data());
  p.v = static_cast<const uint8_t*>(v_cache.data());
  p.k_sb = k_cache.stride(0); p.k_so = k_cache.stride(1); p.k_sh = k_cache.stride(2); p.k_sd = k_cache.stride(3);
  p.v_sb = v_cache.stride(0); p.v_so = v_cache.stride(1); p.v_sh = v_cache.stride(2); p.v_sd = v_cache.stride(3);
  p.src = elt_of(k_cache.dtype(), op, "k_cache");
  p.ok = out_k_cache.data();
  p.ov = out_v_cache.data();
  p.ok_sb = out_k_cache.stride(0); p.ok_so = out_k_cache.stride(1); p.ok_sh = out_k_cache.stride(2);
  p.ok_sd = out_k_cache.stride(3);
  p.ov_sb = out_v_cache.stride(0); p.ov_so = out_v_cache.stride(1); p.ov_sh = out_v_cache.stride(2);
  p.ov_sd = out_v_cache.stride(3);
  p.dst = elt_of(out_k_cache.dtype(), op, "out_k_cache");
  p.block_tables = idx_of(block_tables);
  p.num_reqs = block_tables.size(0);
  p.pages_per_req = block_tables.size(1);
  p.page_size = k_cache.size(1);
  p.num_heads = k_cache.size(2);
  p.head_dim = k_cache.size(3);
  p.num_pages = k_cache.size(0);
  p.k_scale = static_cast<const float*>(k_scale.data());
  p.v_scale = static_cast<const float*>(v_scale.data());
  check_launch(k::launch_kvfp8_dequant(p), op);
}


// ---- DCP pieces (kernels in dcp_ops.cu) ----------------------------------------------------------
void copy_(const Tensor& dst, const Tensor& src, float scale) {
  DeviceGuard g(dst);
  if (scale == 1.0f && dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    const cudaError_t e = cudaMemcpyAsync(dst.data(), src.data(), static_cast<size_t>(dst.nbytes()),
                                          cudaMemcpyDeviceToDevice, nullptr);
    return check_launch(static_cast<int>(e), "copy_");
  }
  k::CopyParams p;
  p.src = src.data();
  p.dst = dst.data();
  p.ndim = dst.dim();
  for (int d = 0; d < dst.dim(); ++d) {
    p.shape[d] = dst.size(d);
    p.src_stride[d] = src.stride(d);
    p.dst_stride[d] = dst.stride(d);
  }
  p.numel = dst.numel();
  p.scale = scale;
  if (dst.dtype() == src.dtype() && scale == 1.0f) {
    p.elt_bytes = static_cast<int>(dst.element_size());
  } else {
    p.src_elt = elt_of(src.dtype(), "copy_", "src");
    p.dst_elt = elt_of(dst.dtype(), "copy_", "dst");
  }
  check_launch(k::launch_strided_copy(p), "copy_");
}

void dcp_lse_scale_pack(const Tensor& partial, const Tensor& all_lse, int64_t rank, bool lse_base_e,
                        const Tensor& packed, const Tensor& global_lse) {
  DeviceGuard g(partial);
  KVATTN_CHECK(all_lse.is_contiguous(), "dcp_lse_scale_pack: on CUDA `all_lse` must be contiguous, got {}",
               all_lse.str());
  k::DcpScalePackParams p;
  p.partial = partial.data();
  p.partial_elt = elt_of(partial.dtype(), "dcp_lse_scale_pack", "partial");
  p.p_st = partial.stride(0);
  p.p_sh = partial.stride(1);
  p.p_sd = partial.stride(2);
  p.all_lse = static_cast<const float*>(all_lse.data());
  p.packed = static_cast<float*>(packed.data());
  if (global_lse.defined()) {
    p.global_lse = static_cast<float*>(global_lse.data());
    p.g_st = global_lse.stride(0);
    p.g_sh = global_lse.stride(1);
  }
  p.W = all_lse.size(0);
  p.T = partial.size(0);
  p.H = partial.size(1) / p.W;
  p.D = partial.size(2);
  p.rank = rank;
  p.base_e = lse_base_e;
  check_launch(k::launch_dcp_lse_scale_pack(p), "dcp_lse_scale_pack");
}

void dcp_lse_combine(const Tensor& partials, const Tensor& lses, bool lse_base_e, const Tensor& out,
                     const Tensor& global_lse) {
  DeviceGuard g(partials);
  k::DcpCombineParams p;
  p.partials = partials.data();
  p.partials_elt = elt_of(partials.dtype(), "dcp_lse_combine", "partials");
  p.p_sw = partials.stride(0);
  p.p_st = partials.stride(1);
  p.p_sh = partials.stride(2);
  p.p_sd = partials.stride(3);
  p.lses = static_cast<const float*>(lses.data());
  p.l_sw = lses.stride(0);
  p.l_st = lses.stride(1);
  p.l_sh = lses.stride(2);
  p.out = out.data();
  p.out_elt = elt_of(out.dtype(), "dcp_lse_combine", "out");
  p.o_st = out.stride(0);
  p.o_sh = out.stride(1);
  p.o_sd = out.stride(2);
  if (global_lse.defined()) {
    p.global_lse = static_cast<float*>(global_lse.data());
    p.g_st = global_lse.stride(0);
    p.g_sh = global_lse.stride(1);
  }
  p.W = partials.size(0);
  p.T = partials.size(1);
  p.H = partials.size(2);
  p.D = partials.size(3);
  p.base_e = lse_base_e;
  check_launch(k::launch_dcp_lse_combine(p), "dcp_lse_combine");
}

}  // namespace kvattn::ops::cuda_impl
