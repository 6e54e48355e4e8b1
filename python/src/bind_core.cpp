// Python bindings of core/: DType names, Device, Tensor (with DLPack in both directions).
#include <dlpack/dlpack.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "kvattn/core/cuda_runtime_api.h"
#include "kvattn/core/dlpack_bridge.h"

namespace py = pybind11;

namespace kvattn::python {

std::vector<std::function<void(py::module_&)>>& extra_binders() {
  static std::vector<std::function<void(py::module_&)>> list;
  return list;
}

namespace {

constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";

Tensor tensor_from_capsule(py::capsule cap) {
  if (std::string(cap.name()) != kCapsuleName)
    throw InvalidArgument("from_dlpack: the capsule was already consumed or is not a DLPack tensor");
  auto* managed = static_cast<DLManagedTensor*>(cap.get_pointer());
  // Mark consumed before taking ownership, so the capsule destructor does not free it too.
  PyCapsule_SetName(cap.ptr(), kUsedCapsuleName);
  return from_dlpack(managed);
}

py::capsule capsule_from_tensor(const Tensor& t) {
  DLManagedTensor* managed = to_dlpack(t);
  return py::capsule(managed, kCapsuleName, [](PyObject* obj) {
    // Called when the capsule dies; if nobody consumed it, free it here.
    if (PyCapsule_IsValid(obj, kCapsuleName)) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(obj, kCapsuleName));
      if (m && m->deleter) m->deleter(m);
    }
  });
}

py::tuple shape_tuple(const Dims& d) {
  py::tuple t(d.size());
  for (int i = 0; i < d.size(); ++i) t[static_cast<size_t>(i)] = d[i];
  return t;
}

Dims dims_from(const std::vector<int64_t>& v) { return Dims{std::span<const int64_t>(v.data(), v.size())}; }

}  // namespace

Tensor as_tensor(const py::object& obj) {
  if (py::isinstance<Tensor>(obj)) return obj.cast<Tensor>();
  if (py::hasattr(obj, "__dlpack__")) return tensor_from_capsule(obj.attr("__dlpack__")());
  if (py::isinstance<py::capsule>(obj)) return tensor_from_capsule(obj.cast<py::capsule>());
  throw InvalidArgument(std::string("expected a kvattn.Tensor or an object with __dlpack__ (NumPy array, "
                                    "PyTorch or CuPy tensor), got ") +
                        std::string(py::str(py::type::of(obj))));
}

void bind_core(py::module_& m) {
  m.def("dtype_names", [] {
    std::vector<std::string> names;
    for (DType t : kAllDTypes) names.emplace_back(dtype_name(t));
    return names;
  }, "Canonical names of the element types kvattn knows.");
  m.def("cuda_available", &cuda::available, "True when this build has CUDA and a GPU is present.");
  m.def("built_with_cuda", &cuda::built_with_cuda);

  py::class_<Tensor>(m, "Tensor", "A strided view over CPU or CUDA memory (kvattn::Tensor).")
      .def_property_readonly("shape", [](const Tensor& t) { return shape_tuple(t.shape()); })
      .def_property_readonly("strides", [](const Tensor& t) { return shape_tuple(t.strides()); },
                             "Strides in elements (as torch), not bytes.")
      .def_property_readonly("dtype", [](const Tensor& t) { return std::string(dtype_name(t.dtype())); })
      .def_property_readonly("device", [](const Tensor& t) { return t.device().str(); })
      .def_property_readonly("ndim", &Tensor::dim)
      .def("numel", &Tensor::numel)
      .def("is_contiguous", &Tensor::is_contiguous)
      .def("data_ptr", [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data()); })
      .def("contiguous", &Tensor::contiguous)
      .def("clone", &Tensor::clone)
      .def("view", [](const Tensor& t, const std::vector<int64_t>& s) { return t.view(dims_from(s)); })
      .def("permute", [](const Tensor& t, const std::vector<int64_t>& o) { return t.permute(dims_from(o)); })
      .def("select", &Tensor::select, py::arg("dim"), py::arg("index"))
      .def("slice", &Tensor::slice, py::arg("dim"), py::arg("start"), py::arg("end"), py::arg("step") = 1)
      .def("view_as_dtype", [](const Tensor& t, const std::string& d) { return t.view_as(parse_dtype(d)); })
      .def("to_dtype", [](const Tensor& t, const std::string& d) { return t.to(parse_dtype(d)); })
      .def("tolist", &Tensor::to_double_vector, "All elements in row-major order as floats.")
      .def("__repr__", &Tensor::str)
      .def("__dlpack__", [](const Tensor& t, py::object /*stream*/) { return capsule_from_tensor(t); },
           py::arg("stream") = py::none())
      .def("__dlpack_device__", [](const Tensor& t) {
        return py::make_tuple(t.device().is_cpu() ? static_cast<int>(kDLCPU) : static_cast<int>(kDLCUDA),
                              t.device().index);
      });

  m.def("from_dlpack", &as_tensor, py::arg("obj"),
        "Zero-copy view of any object with __dlpack__ (or a DLPack capsule) as a kvattn.Tensor.");
  m.def("empty", [](const std::vector<int64_t>& shape, const std::string& dtype, const std::string& device) {
    return Tensor::empty(dims_from(shape), parse_dtype(dtype), Device::parse(device));
  }, py::arg("shape"), py::arg("dtype") = "float32", py::arg("device") = "cpu");
  m.def("zeros", [](const std::vector<int64_t>& shape, const std::string& dtype, const std::string& device) {
    return Tensor::zeros(dims_from(shape), parse_dtype(dtype), Device::parse(device));
  }, py::arg("shape"), py::arg("dtype") = "float32", py::arg("device") = "cpu");
}

}  // namespace kvattn::python
