// kvattn/ops/reference.h — the plain CPU oracles.
//
// Each function computes its op the obvious way (scalar loops, float64 accumulation, a
// two-pass softmax) on CPU tensors.  They check arguments exactly as the entry points do and
// are the ground truth that the optimised CPU path and the CUDA kernels are tested against.
// paged_attention computes its query rows on several threads (each row on its own, so the
// result does not depend on their number).
#pragma once

#include "kvattn/ops/merge_attn_states.h"
#include "kvattn/ops/paged_attention.h"
#include "kvattn/ops/reshape_and_cache.h"

namespace kvattn::ops::reference {

void reshape_and_cache_flash(const ReshapeAndCacheArgs& args);
void paged_attention(const PagedAttentionArgs& args);
void merge_attn_states(const MergeAttnStatesArgs& args);

}  // namespace kvattn::ops::reference
