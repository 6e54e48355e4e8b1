// Shared declarations of the Python bindings.  bind_core() is called first; other layers'
// binding files register themselves with KVATTN_PY_BINDER so adding one needs no edit here.
#pragma once

#include <pybind11/pybind11.h>

#include <functional>
#include <vector>

#include "kvattn/core/tensor.h"

namespace kvattn::python {

void bind_core(pybind11::module_& m);
std::vector<std::function<void(pybind11::module_&)>>& extra_binders();

// Accepts a kvattn Tensor or any object with __dlpack__ (NumPy, PyTorch, CuPy) and returns a
// zero-copy kvattn view of it.
Tensor as_tensor(const pybind11::object& obj);

}  // namespace kvattn::python

#define KVATTN_PY_BINDER(fn) \
  static const bool kvattn_py_binder_##fn = (::kvattn::python::extra_binders().push_back(&fn), true)
