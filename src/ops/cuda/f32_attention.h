// src/ops/cuda/f32_attention.h — the float32-cache paged attention (f32_attention.cu).
//
// A SIMT kernel (no tensor-core operands) for calls whose K/V caches are float32, so that a
// model computing in float32 attends on CUDA with float32 accuracy.  It honours the whole
// AttnParams contract of kernels.h as the CPU reference defines it (both page forms, every
// layout through the byte strides, GQA, causal / non-causal, window, soft cap, sinks, LSE in
// either base, PrefixLM ranges, XQA draft masks) for any query / output float type and any head
// dim the op accepts (multiples of 8 in [8, 512]).  No plan, no workspace: one launch.
// No CUDA header here, so g++-compiled files can include it.
#pragma once

#include "ops/cuda/kernels.h"

namespace kvattn::ops::cuda_impl::k {

// Runs the call (p.kv_t must be Elt::f32; K/V rows need only dim stride 1 and 4-byte
// alignment).  Returns 0 or a cudaError_t as int (cudaErrorInvalidValue for a call outside the
// contract above).
int launch_f32_attention(const AttnParams& p);

}  // namespace kvattn::ops::cuda_impl::k
