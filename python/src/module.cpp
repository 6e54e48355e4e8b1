// The `kvattn._kvattn` extension module: entry point.  Each bind_*.cpp file adds one layer's
// bindings; error translation is registered here once.
#include <pybind11/pybind11.h>

#include "bindings.h"
#include "kvattn/core/error.h"

namespace py = pybind11;

PYBIND11_MODULE(_kvattn, m) {
  m.doc() = "kvattn: paged KV cache, batch preparation and attention kernels";
  m.attr("__version__") = "0.1.0";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const kvattn::InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.message().c_str());
    } catch (const kvattn::Unsupported& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.message().c_str());
    } catch (const kvattn::OutOfMemory& e) {
      PyErr_SetString(PyExc_MemoryError, e.message().c_str());
    } catch (const kvattn::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
  kvattn::python::bind_core(m);
  for (auto& binder : kvattn::python::extra_binders()) binder(m);
}
