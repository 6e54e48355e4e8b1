// src/model/cuda/device_kernels.h — the kernel launchers behind device_ops.h (device_ops.cu).
// Arguments are already validated by the callers in device_ops.cpp / gemm.cpp; each launcher
// enqueues one kernel on the default stream and returns the launch's cudaError_t (0: success).
#pragma once

#include <cstdint>

#include "kvattn/core/dtype.h"
#include "model/cuda/device_ops.h"

namespace kvattn::model::gpu::kernels {

int embedding(const int32_t* ids, int64_t tokens, const void* table, int64_t hidden, float scale, void* out, DType t);
int rms_norm(const void* x, int64_t rows, int64_t dim, int64_t x_stride, const void* w, float eps, bool plus_one,
             void* out, int64_t out_stride, DType t);
int add_rms_norm(const void* x, void* residual, int64_t rows, int64_t dim, const void* w, float eps, bool plus_one,
                 void* out, DType t);
int rope_neox(void* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t token_stride, int64_t head_stride,
              const int64_t* positions, const float* cos_table, const float* sin_table, DType t);
int act_mul(const void* gate_up, int64_t tokens, int64_t inter, GatedActivation act, void* out, DType t);
int add_inplace(void* y, const void* x, int64_t n, DType t);
int soft_cap(void* x, int64_t n, float cap, DType t);
int gather_rows(const void* x, int64_t row_bytes, const int64_t* rows, int64_t n, void* out);
int convert(const void* src, DType src_t, void* dst, DType dst_t, int64_t n);
// y[r, :n] = bias[:n] for r < rows (rows `ldy` elements apart): the bias of a Gemm.
int fill_rows(const void* bias, int64_t rows, int64_t n, void* y, int64_t ldy, DType t);
// The text of a cudaError_t (its name and description).
const char* error_name(int err);
const char* error_string(int err);

}  // namespace kvattn::model::gpu::kernels
