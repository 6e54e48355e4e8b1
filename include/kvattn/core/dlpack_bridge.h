// kvattn/core/dlpack_bridge.h — zero-copy exchange with PyTorch / NumPy / CuPy via DLPack.
//
// to_dlpack() hands out a DLManagedTensor that keeps the Tensor's storage alive until the
// consumer calls its deleter.  from_dlpack() takes ownership of a DLManagedTensor and calls
// its deleter when the last Tensor view over it goes away.  fp8 types use the DLPack 1.x
// type codes (float8_e4m3fn = 10, float8_e5m2 = 12), which PyTorch understands.
#pragma once

#include "kvattn/core/tensor.h"

struct DLManagedTensor;

namespace kvattn {

DLManagedTensor* to_dlpack(const Tensor& t);
Tensor from_dlpack(DLManagedTensor* managed);

}  // namespace kvattn
