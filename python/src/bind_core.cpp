// Python bindings of core/: DType names, Device, Tensor (with DLPack in both directions).
#include <dlpack/dlpack.h>
#include <pybind11/stl.h>

#include <cstdint>

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

Dims dims_from(const std::vector<int64_t>& v) { return dims_from_py(v); }

// NumPy's __array_interface__ type string of a dtype NumPy has (bf16 and fp8 have none).
const char* numpy_typestr(DType t) {
  switch (t) {
    case DType::f32: return "<f4";
    case DType::f16: return "<f2";
    case DType::u8: return "|u1";
    case DType::i8: return "|i1";
    case DType::i32: return "<i4";
    case DType::i64: return "<i8";
    default:
      throw InvalidArgument(std::string("a ") + dtype_name(t) +
                            " tensor has no NumPy dtype; view it as bytes first "
                            "(t.view_as_dtype('uint8')) or convert it (t.to_dtype('float32'))");
  }
}

// The array interface of a CPU tensor: NumPy builds a *writable* zero-copy view from it and
// keeps the Tensor (hence its storage) alive as the array's base.
py::dict array_interface(const Tensor& t) {
  if (!t.device().is_cpu())
    throw InvalidArgument("__array_interface__: tensor is on " + t.device().str() +
                          "; only CPU tensors can be viewed by NumPy (use torch/cupy.from_dlpack)");
  py::dict d;
  d["version"] = 3;
  d["shape"] = shape_tuple(t.shape());
  d["typestr"] = numpy_typestr(t.dtype());
  py::tuple strides(t.dim());
  for (int i = 0; i < t.dim(); ++i) strides[static_cast<size_t>(i)] = t.strides()[i] * t.element_size();
  d["strides"] = strides;
  d["data"] = py::make_tuple(reinterpret_cast<uintptr_t>(t.data()), false);
  return d;
}

}  // namespace

Dims dims_from_py(const std::vector<int64_t>& v) { return Dims{std::span<const int64_t>(v.data(), v.size())}; }

Tensor optional_tensor(const py::object& obj) {
  if (obj.is_none()) return Tensor();
  return as_tensor(obj);
}

DType dtype_from_py(const py::handle& obj) {
  std::string name;
  if (py::isinstance<py::str>(obj)) {
    name = obj.cast<std::string>();
  } else if (py::isinstance<py::type>(obj)) {
    // A NumPy scalar type such as np.float16.
    name = py::str(py::module_::import("numpy").attr("dtype")(obj));
  } else {
    name = py::str(obj);  // numpy.dtype('float16') -> "float16"; torch.float16 -> "torch.float16"
  }
  if (name.rfind("torch.", 0) == 0) name = name.substr(6);
  if (name == "bool") name = "uint8";
  return parse_dtype(name);
}

KVCacheDType kv_cache_dtype_from_py(const py::handle& obj) {
  if (py::isinstance<KVCacheDType>(obj)) return obj.cast<KVCacheDType>();
  if (py::isinstance<py::str>(obj)) return parse_kv_cache_dtype(obj.cast<std::string>());
  throw InvalidArgument("kv_cache_dtype must be a KVCacheDType or one of its names (" + kv_cache_dtype_choices_str() +
                        "), got " + std::string(py::str(py::type::of(obj))));
}

Tensor as_tensor(const py::object& obj) {
  if (py::isinstance<Tensor>(obj)) return obj.cast<Tensor>();
  if (py::hasattr(obj, "__dlpack__")) {
    // NumPy < 1.25 refuses to export bool arrays through DLPack: view them as uint8 (same bytes).
    if (py::hasattr(obj, "dtype") && py::str(py::type::of(obj).attr("__module__")).cast<std::string>() == "numpy" &&
        py::str(obj.attr("dtype")).cast<std::string>() == "bool")
      return tensor_from_capsule(obj.attr("view")("uint8").attr("__dlpack__")());
    return tensor_from_capsule(obj.attr("__dlpack__")());
  }
  if (py::isinstance<py::capsule>(obj)) return tensor_from_capsule(obj.cast<py::capsule>());
  throw InvalidArgument(std::string("expected a kvattn.Tensor or an object with __dlpack__ (NumPy array, "
                                    "PyTorch or CuPy tensor), got ") +
                        std::string(py::str(py::type::of(obj))));
}

Tensor as_int32_tensor(const py::object& obj, const char* name) {
  Tensor t = as_tensor(obj);
  const DType dt = t.dtype();
  if (dt == DType::i32 || (dt != DType::i64 && dt != DType::i8 && dt != DType::u8)) return t;
  KVATTN_CHECK(t.device().is_cpu(),
               "{}: a {} tensor on {} is converted to int32 on the CPU only; pass an int32 tensor or a CPU one",
               name, dtype_name(dt), t.device().str());
  Tensor out = Tensor::empty(t.shape(), DType::i32);
  int32_t* o = out.data_ptr<int32_t>();
  const Tensor c = t.contiguous();
  const int64_t n = c.numel();
  for (int64_t i = 0; i < n; ++i) {
    int64_t v = 0;
    if (dt == DType::i64) v = c.data_ptr<int64_t>()[i];
    else if (dt == DType::i8) v = c.data_ptr<int8_t>()[i];
    else v = c.data_ptr<uint8_t>()[i];
    KVATTN_CHECK(v >= INT32_MIN && v <= INT32_MAX,
                 "{}: element {} = {} does not fit in int32 (kvattn's index and length type); lengths and "
                 "ids must be below 2^31", name, i, v);
    o[i] = static_cast<int32_t>(v);
  }
  return out;
}

void bind_core(py::module_& m) {
  m.def("dtype_names", [] {
    std::vector<std::string> names;
    for (DType t : kAllDTypes) names.emplace_back(dtype_name(t));
    return names;
  }, "Canonical names of the element types kvattn knows.");
  py::enum_<KVCacheDType> kvd(m, "KVCacheDType",
                              "The KV cache's storage type under vLLM's kv_cache_dtype spellings (auto, bfloat16, "
                              "float16, fp8, fp8_e4m3, fp8_e5m2, nvfp4).  Every kv_cache_dtype argument takes a "
                              "member or its name.");
  for (KVCacheDType t : kAllKVCacheDTypes) kvd.value(kv_cache_dtype_name(t), t);
  m.def("parse_kv_cache_dtype", [](const std::string& name) { return parse_kv_cache_dtype(name); }, py::arg("name"),
        "The KVCacheDType of a name (ValueError listing the accepted names).");
  m.def("kv_cache_dtype_name", [](KVCacheDType t) { return std::string(kv_cache_dtype_name(t)); },
        py::arg("kv_cache_dtype"), "vLLM's spelling of a KVCacheDType.");
  m.def("kv_cache_dtype_choices", &kv_cache_dtype_choices,
        "The accepted kv_cache_dtype names ('auto', 'bfloat16', ...).");
  m.def("kv_cache_storage_dtype",
        [](py::object t, py::object model_dtype) {
          return std::string(dtype_name(kv_cache_storage_dtype(kv_cache_dtype_from_py(t), dtype_from_py(model_dtype))));
        },
        py::arg("kv_cache_dtype"), py::arg("model_dtype"),
        "The cache's element dtype name: auto -> model_dtype, fp8 -> 'fp8_e4m3', ...");
  m.def("cuda_available", &cuda::available, "True when this build has CUDA and a GPU is present.");
  m.def("built_with_cuda", &cuda::built_with_cuda, "True when this build has the CUDA kernels (a GPU may still be absent).");

  py::class_<Tensor>(m, "Tensor", R"doc(A strided view over CPU or CUDA memory (kvattn::Tensor).

shape, strides (elements), dtype (a name: 'float16', 'bfloat16', 'fp8_e4m3', 'int32', ...),
device ('cpu' / 'cuda:N'); views (view, permute, select, slice, view_as_dtype) share storage.
Exchange without copies: numpy.asarray(t) (CPU, NumPy dtypes), torch.from_dlpack(t),
kvattn.from_dlpack(x) for any x with __dlpack__.  kvattn functions return Tensors for dtypes
NumPy lacks (bfloat16, fp8); tolist() reads any dtype as floats.)doc")
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
      .def_property_readonly("__array_interface__", &array_interface,
                             "NumPy array interface (CPU tensors): np.asarray(t) is a writable "
                             "zero-copy view that keeps t's storage alive.")
      .def("__repr__", &Tensor::str)
      .def("__dlpack__",
           [](const Tensor& t, py::object /*stream*/, py::kwargs /*max_version, dl_device, copy*/) {
             // kvattn's kernels run on the default stream, so the consumer's stream needs no extra
             // synchronisation; newer consumers' keywords are accepted and a legacy capsule
             // returned, which the DLPack protocol allows.
             return capsule_from_tensor(t);
           },
           py::arg("stream") = py::none())
      .def("__dlpack_device__", [](const Tensor& t) {
        return py::make_tuple(t.device().is_cpu() ? static_cast<int>(kDLCPU) : static_cast<int>(kDLCUDA),
                              t.device().index);
      });

  m.def("from_dlpack", &as_tensor, py::arg("obj"),
        "Zero-copy view of any object with __dlpack__ (or a DLPack capsule) as a kvattn.Tensor.");
  m.def("empty", [](const std::vector<int64_t>& shape, const std::string& dtype, const std::string& device) {
    return Tensor::empty(dims_from(shape), parse_dtype(dtype), Device::parse(device));
  }, py::arg("shape"), py::arg("dtype") = "float32", py::arg("device") = "cpu",
  "An uninitialised kvattn Tensor of `shape` (dtype: a name from dtype_names(); device: 'cpu' or 'cuda:N').");
  m.def("zeros", [](const std::vector<int64_t>& shape, const std::string& dtype, const std::string& device) {
    return Tensor::zeros(dims_from(shape), parse_dtype(dtype), Device::parse(device));
  }, py::arg("shape"), py::arg("dtype") = "float32", py::arg("device") = "cpu",
  "A zero-filled kvattn Tensor of `shape` (dtype: a name from dtype_names(); device: 'cpu' or 'cuda:N').");
}

}  // namespace kvattn::python
