// zero_kv_blocks: check the segment table, then dispatch on the block ids' device.
#include "kvattn/ops/zero_kv_blocks.h"

#include <utility>

#include "ops/common.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cuda_dispatch.h"

namespace kvattn::ops {
using namespace detail;

void zero_kv_blocks(const Tensor& seg_addrs, const Tensor& seg_block_strides, const Tensor& seg_page_sizes,
                    const Tensor& block_ids) {
  static constexpr const char* op = "zero_kv_blocks";
  check_dim(seg_addrs, 1, op, "seg_addrs", "[num_segments]");
  check_dim(seg_block_strides, 1, op, "seg_block_strides", "[num_segments]");
  check_dim(seg_page_sizes, 1, op, "seg_page_sizes", "[num_segments]");
  check_dim(block_ids, 1, op, "block_ids", "[num_blocks_to_zero]");
  for (const auto& [t, name] : {std::pair{&seg_addrs, "seg_addrs"}, std::pair{&seg_block_strides, "seg_block_strides"},
                                std::pair{&seg_page_sizes, "seg_page_sizes"}}) {
    check_dtype_in(*t, {DType::i64}, op, name);
    check_size(*t, 0, seg_addrs.size(0), op, name, "num_segments (seg_addrs.size(0))");
    check_same_device(block_ids, *t, op, name);
  }
  check_index_dtype(block_ids, op, "block_ids");
  if (block_ids.device().is_cuda()) return cuda_impl::zero_kv_blocks(seg_addrs, seg_block_strides, seg_page_sizes, block_ids);
  const IndexView addr(seg_addrs), stride(seg_block_strides), page(seg_page_sizes), ids(block_ids);
  for (int64_t s = 0; s < seg_addrs.size(0); ++s) {
    KVATTN_CHECK(addr[s] != 0 && addr[s] % 4 == 0, "{}: seg_addrs[{}] = {:#x} must be a non-null 4-byte aligned address",
                 op, s, static_cast<uint64_t>(addr[s]));
    KVATTN_CHECK(stride[s] >= 0 && page[s] >= 0,
                 "{}: segment {} has block stride {} and page size {} (4-byte words); both must be >= 0", op, s,
                 stride[s], page[s]);
  }
  for (int64_t i = 0; i < block_ids.size(0); ++i)
    KVATTN_CHECK(ids[i] >= 0, "{}: block_ids[{}] = {} must be >= 0", op, i, ids[i]);
  cpu::zero_kv_blocks(seg_addrs, seg_block_strides, seg_page_sizes, block_ids);
}

}  // namespace kvattn::ops
