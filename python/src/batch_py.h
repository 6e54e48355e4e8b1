// Conversions between the Python CommonAttentionMetadata dataclass (python/kvattn/metadata.py)
// and the C++ aggregate, shared by the batch and attention bindings.
#pragma once

#include <pybind11/pybind11.h>

#include "kvattn/batch/common_attention_metadata.h"
#include "kvattn/batch/mm_prefix.h"

namespace kvattn::python {

// {row: [(start, end), ...]} (vLLM's dict[int, list[tuple[int, int]]]) <-> MMPrefixRanges.
MMPrefixRanges mm_ranges_from_py(const pybind11::handle& obj);
pybind11::dict mm_ranges_to_py(const MMPrefixRanges& r);

// Reads the dataclass's fields by attribute (zero-copy views).  mm_req_doc_ranges is converted
// into `ranges_storage`, which must outlive the returned metadata.
CommonAttentionMetadata cm_from_py(const pybind11::handle& obj, MMPrefixRanges& ranges_storage);
// Field name -> value (kvattn Tensors / ints / None) for building the dataclass.
pybind11::dict cm_to_fields(const CommonAttentionMetadata& cm);

}  // namespace kvattn::python
