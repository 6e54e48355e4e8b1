// Shared declarations of the Python bindings.  bind_core() is called first; other layers'
// binding files register themselves with KVATTN_PY_BINDER so adding one needs no edit here.
// Conventions (python/DESIGN.md): tensors arrive through as_tensor (zero-copy DLPack views),
// optional tensors are None or a tensor, dtypes are names or NumPy/PyTorch dtype objects.
#pragma once

#include <pybind11/pybind11.h>

#include <functional>
#include <optional>
#include <vector>

#include "kvattn/core/kv_cache_dtype.h"
#include "kvattn/core/tensor.h"

namespace kvattn::python {

void bind_core(pybind11::module_& m);
std::vector<std::function<void(pybind11::module_&)>>& extra_binders();

// Accepts a kvattn Tensor or any object with __dlpack__ (NumPy, PyTorch, CuPy) and returns a
// zero-copy kvattn view of it.
Tensor as_tensor(const pybind11::object& obj);
// An integer tensor argument that vLLM converts itself (e.g. `seq_lens_cpu`, which vLLM's tests
// pass as torch.tensor([...]), i.e. int64): int32 tensors as is (zero-copy); int64 / int8 / uint8
// CPU tensors as an int32 copy, each value checked to fit (InvalidArgument naming `name`, the
// element and its value); other dtypes unchanged, for the callee's own dtype check.
Tensor as_int32_tensor(const pybind11::object& obj, const char* name);
// None -> an undefined Tensor; anything else -> as_tensor(obj).
Tensor optional_tensor(const pybind11::object& obj);
// A dtype given as a kvattn name ("bfloat16", "fp8_e4m3"), a NumPy dtype / scalar type, or a
// PyTorch dtype (torch.float16 -> "float16").  InvalidArgument listing the valid names.
DType dtype_from_py(const pybind11::handle& obj);
// A kv_cache_dtype given as a KVCacheDType or one of its names (parse_kv_cache_dtype: InvalidArgument
// listing the accepted names).
KVCacheDType kv_cache_dtype_from_py(const pybind11::handle& obj);
// Dims from a Python sequence of ints.
Dims dims_from_py(const std::vector<int64_t>& v);

}  // namespace kvattn::python

#define KVATTN_PY_BINDER(fn) \
  static const bool kvattn_py_binder_##fn = (::kvattn::python::extra_binders().push_back(&fn), true)
