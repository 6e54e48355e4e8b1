// KVBlockZeroer: segment table over the bound layer views + execution (kv_block_zeroer.h).
#include "kvattn/kv/kv_block_zeroer.h"

#include <fmt/format.h>

#include <algorithm>

#include "kvattn/core/error.h"
#include "kvattn/kv/attention_group.h"
#include "kvattn/ops/zero_kv_blocks.h"

namespace kvattn {

KVBlockZeroer::KVBlockZeroer(Device device, std::span<const AttentionGroup> attn_groups,
                             std::span<const int64_t> kernel_block_sizes, const KVCacheViews& layer_kv_caches,
                             int64_t num_blocks, const std::set<std::string>* runner_only_attn_layers)
    : device_(device), num_blocks_(num_blocks) {
  KVZeroSegmentBuilder builder(num_blocks);
  for (const AttentionGroup& group : attn_groups) {
    const AttentionSpec* spec = as_attention_spec(group.kv_cache_spec);
    if (spec == nullptr) continue;  // Mamba / other state: not zeroed here
    if (group.kv_cache_group_id < 0 ||
        group.kv_cache_group_id >= static_cast<int64_t>(kernel_block_sizes.size()))
      continue;
    const int64_t kernel_bs = kernel_block_sizes[static_cast<size_t>(group.kv_cache_group_id)];
    KVATTN_CHECK(kernel_bs > 0 && spec->block_size() % kernel_bs == 0,
                 "KVBlockZeroer: kernel block size {} of KV cache group {} does not divide its block size {}",
                 kernel_bs, group.kv_cache_group_id, spec->block_size());
    for (const std::string& layer_name : group.layer_names) {
      if (runner_only_attn_layers && runner_only_attn_layers->count(layer_name)) continue;
      auto it = layer_kv_caches.find(layer_name);
      if (it == layer_kv_caches.end() || !it->second.defined()) continue;
      Tensor kv = it->second;
      // Bound views address kernel blocks of a packed cache; zero by manager block.
      if (group.kernel_block_stride) kv = group.map_kv_cache_to_manager_blocks(kv, num_blocks);
      if (kv.device().type != device_.type) continue;
      builder.add_layer(layer_name, kv);
    }
  }
  segs_ = std::move(builder).take();
  if (segs_.empty()) return;
  max_page_words_ = *std::max_element(segs_.page_sizes.begin(), segs_.page_sizes.end());
  seg_addrs_ = Tensor::from_vector(segs_.addrs).to(device_);
  seg_block_strides_ = Tensor::from_vector(segs_.block_strides).to(device_);
  seg_page_sizes_ = Tensor::from_vector(segs_.page_sizes).to(device_);
  if (!device_.is_cpu()) ids_staging_ = Tensor::empty({num_blocks_}, DType::i64, device_);
}

namespace {
template <typename T>
void check_ids(std::span<const T> ids, int64_t num_blocks) {
  for (size_t i = 0; i < ids.size(); ++i)
    KVATTN_CHECK(ids[i] >= 0 && static_cast<int64_t>(ids[i]) < num_blocks,
                 "KVBlockZeroer::zero_block_ids: block id {} (position {}) is out of range; valid ids are "
                 "0..{} (the pool's manager blocks)",
                 static_cast<int64_t>(ids[i]), i, num_blocks - 1);
}
}  // namespace

void KVBlockZeroer::run(const Tensor& block_ids) {
  ops::zero_kv_blocks(seg_addrs_, seg_block_strides_, seg_page_sizes_, block_ids);
}

void KVBlockZeroer::zero_block_ids(std::span<const int64_t> block_ids) {
  if (block_ids.empty() || segs_.empty()) return;
  check_ids(block_ids, num_blocks_);
  const auto n = static_cast<int64_t>(block_ids.size());
  // Host ids are borrowed (no allocation per step); CUDA stages them in a persistent buffer.
  Tensor host = Tensor::from_blob(const_cast<int64_t*>(block_ids.data()), {n}, DType::i64);
  if (device_.is_cpu()) {
    run(host);
    return;
  }
  KVATTN_CHECK(n <= num_blocks_,
               "KVBlockZeroer::zero_block_ids: {} ids exceed the staging buffer of {}; pass each id once", n,
               num_blocks_);
  Tensor staged = ids_staging_.slice(0, 0, n);
  staged.copy_from(host);
  run(staged);
}

void KVBlockZeroer::zero_block_ids(std::span<const int32_t> block_ids) {
  if (block_ids.empty() || segs_.empty()) return;
  check_ids(block_ids, num_blocks_);
  const auto n = static_cast<int64_t>(block_ids.size());
  if (device_.is_cpu()) {
    run(Tensor::from_blob(const_cast<int32_t*>(block_ids.data()), {n}, DType::i32));
    return;
  }
  std::vector<int64_t> wide(block_ids.begin(), block_ids.end());
  zero_block_ids(std::span<const int64_t>(wide));
}

void KVBlockZeroer::warmup(int64_t num_kv_blocks) {
  if (num_kv_blocks > 0) {
    const int64_t zero = 0;
    zero_block_ids(std::span<const int64_t>(&zero, 1));
  }
}

}  // namespace kvattn
