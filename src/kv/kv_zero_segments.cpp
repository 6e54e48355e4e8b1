// Segment math of the KV block zeroer: one layer view -> segments (see kv_block_zeroer.h).
#include <fmt/format.h>

#include <algorithm>

#include "kvattn/core/buffer.h"
#include "kvattn/core/error.h"
#include "kvattn/kv/kv_block_zeroer.h"

namespace kvattn {

KVZeroSegmentBuilder::KVZeroSegmentBuilder(int64_t num_blocks) : num_blocks_(num_blocks) {
  KVATTN_CHECK(num_blocks > 0,
               "KVBlockZeroer: num_blocks must be positive, got {}; build the zeroer after the KV "
               "cache is allocated with at least one block",
               num_blocks);
}

void KVZeroSegmentBuilder::add_layer(const std::string& layer_name, const Tensor& kv) {
  KVATTN_CHECK(kv.defined() && kv.dim() >= 1,
               "KVBlockZeroer: layer '{}' has no block dimension (view {}); bind a [B, H, N, C] "
               "view",
               layer_name, kv.str());
  if (kv.numel() == 0) return;  // nothing to zero
  KVATTN_CHECK(kv.data() != nullptr, "KVBlockZeroer: layer '{}' view has no memory", layer_name);
  for (int d = 0; d < kv.dim(); ++d)
    KVATTN_CHECK(kv.stride(d) >= 0,
                 "KVBlockZeroer: layer '{}' view {} has a negative stride in dimension {}; KV cache "
                 "views never do",
                 layer_name, kv.str(), d);

  const int64_t rows = kv.size(0);
  KVATTN_CHECK(rows % num_blocks_ == 0,
               "KVBlockZeroer: layer '{}': {} kernel blocks is not a multiple of {} logical blocks; "
               "pass the manager-block count the cache was allocated with",
               layer_name, rows, num_blocks_);
  const int64_t ratio = rows / num_blocks_;  // kernel blocks per manager block

  const int64_t el = kv.element_size();
  const int64_t block_stride_bytes = kv.stride(0) * el;
  KVATTN_CHECK(block_stride_bytes > 0 && block_stride_bytes % 4 == 0,
               "KVBlockZeroer: layer '{}' block stride of {} bytes is not a positive multiple of 4; "
               "the zeroing kernel writes 4-byte words",
               layer_name, block_stride_bytes);

  // Dimensions whose stride exceeds the block stride lie physically outside the block
  // (LHBNC's head groups): each of their indices is a separate segment.  The others form
  // the page: the byte span from a block's first element to its last.
  std::vector<int> outer_dims;
  int64_t page_bytes = el;
  for (int d = 1; d < kv.dim(); ++d) {
    if (kv.stride(d) * el > block_stride_bytes)
      outer_dims.push_back(d);
    else
      page_bytes += (kv.size(d) - 1) * kv.stride(d) * el;
  }
  KVATTN_CHECK(page_bytes % 4 == 0,
               "KVBlockZeroer: layer '{}' page of {} bytes is not a multiple of 4; the zeroing kernel "
               "writes 4-byte words",
               layer_name, page_bytes);
  const int64_t logical_stride_bytes = block_stride_bytes * ratio;
  const int64_t base = static_cast<int64_t>(reinterpret_cast<intptr_t>(kv.data()));

  // Storage bounds (when the view knows its buffer): the last block of every segment must
  // stay inside it, so zero_block_ids can never write outside the allocation.
  int64_t buf_lo = 0, buf_hi = 0;
  const bool bounded = kv.storage() != nullptr;
  if (bounded) {
    buf_lo = static_cast<int64_t>(reinterpret_cast<intptr_t>(kv.storage()->data()));
    buf_hi = buf_lo + static_cast<int64_t>(kv.storage()->size());
  }

  std::vector<int64_t> idx(outer_dims.size(), 0);
  while (true) {
    int64_t off = 0;
    for (size_t i = 0; i < outer_dims.size(); ++i) off += idx[i] * kv.stride(outer_dims[i]) * el;
    KVATTN_CHECK((base + off) % 4 == 0,
                 "KVBlockZeroer: layer '{}' segment address {:#x} is not 4-byte aligned", layer_name,
                 base + off);
    for (int64_t v = 0; v < ratio; ++v) {
      const int64_t addr = base + off + v * block_stride_bytes;
      if (bounded) {
        const int64_t last_end = addr + (num_blocks_ - 1) * logical_stride_bytes + page_bytes;
        KVATTN_CHECK(addr >= buf_lo && last_end <= buf_hi,
                     "KVBlockZeroer: layer '{}' segment [{:#x}, {:#x}) of block {} leaves its buffer "
                     "[{:#x}, {:#x}); the view's block stride or page does not match the allocation",
                     layer_name, addr + (num_blocks_ - 1) * logical_stride_bytes, last_end,
                     num_blocks_ - 1, buf_lo, buf_hi);
      }
      auto it = seen_.find(addr);
      if (it != seen_.end()) {
        const size_t s = it->second;
        KVATTN_CHECK(segs_.block_strides[s] == logical_stride_bytes / 4,
                     "KVBlockZeroer: layer '{}' overlays a segment at {:#x} with block stride {} "
                     "words, but an earlier layer used {} words; overlaid layers must share the "
                     "block stride",
                     layer_name, addr, logical_stride_bytes / 4, segs_.block_strides[s]);
        segs_.page_sizes[s] = std::max(segs_.page_sizes[s], page_bytes / 4);
        continue;
      }
      seen_.emplace(addr, segs_.addrs.size());
      segs_.addrs.push_back(addr);
      segs_.block_strides.push_back(logical_stride_bytes / 4);
      segs_.page_sizes.push_back(page_bytes / 4);
    }
    // Next outer index (row-major); done after the last.
    int i = static_cast<int>(outer_dims.size()) - 1;
    for (; i >= 0; --i) {
      if (++idx[static_cast<size_t>(i)] < kv.size(outer_dims[static_cast<size_t>(i)])) break;
      idx[static_cast<size_t>(i)] = 0;
    }
    if (i < 0) break;
  }
}

}  // namespace kvattn
