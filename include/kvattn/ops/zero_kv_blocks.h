// kvattn/ops/zero_kv_blocks.h — zero newly allocated KV blocks through a segment table.
//
// Executes the table built by kv/'s KVBlockZeroer (vLLM `KVBlockZeroer.zero_block_ids` and
// its `_zero_kv_blocks_kernel`).  A *segment* is one run of bytes that every block owns in
// one layer's view: for block id b and segment s the 4-byte words
//     [seg_addrs[s] + b * seg_block_strides[s] * 4,  + seg_page_sizes[s] * 4)
// are set to zero.  All index math is 64-bit.
#pragma once

#include "kvattn/core/tensor.h"

namespace kvattn::ops {

// seg_addrs         [S] int64  absolute byte address of block 0 of segment s (4-byte aligned)
// seg_block_strides [S] int64  distance between consecutive blocks, in 4-byte words (>= 0)
// seg_page_sizes    [S] int64  words to zero per block, in 4-byte words (>= 0)
// block_ids         [n] int32 or int64, each >= 0
// All four tensors live on the device that owns the memory being zeroed (CPU tensors zero
// host memory, CUDA tensors run the CUDA kernel).  The addresses are trusted: they come from
// a KV-cache view that kv/ has already bounds-checked.  Throws InvalidArgument for mismatched
// lengths, wrong dtypes, negative ids/sizes/strides or misaligned addresses.
void zero_kv_blocks(const Tensor& seg_addrs, const Tensor& seg_block_strides,
                    const Tensor& seg_page_sizes, const Tensor& block_ids);

}  // namespace kvattn::ops
