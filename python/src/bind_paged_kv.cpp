// Python binding of the paged-KV metadata builder (attention/paged_kv_metadata.h): the
// paged_kv_indptr / paged_kv_indices / paged_kv_last_page_len a FlashInfer-style kernel plans
// from, computed as vLLM's FlashInfer backend computes them (_compute_flashinfer_kv_metadata),
// with the same implementation the native backend's builder uses.  build() returns a dict of
// kvattn Tensors (views of the builder's persistent buffers, valid until its next build());
// python/kvattn/metadata.py turns it into a PagedKVMetadata in the caller's framework.
#include <pybind11/stl.h>

#include "batch_py.h"
#include "bindings.h"
#include "kvattn/attention/paged_kv_metadata.h"

namespace py = pybind11;

namespace kvattn::python {
namespace {

void bind_paged_kv(py::module_& m) {
  py::class_<PagedKVMetadataBuilder>(m, "PagedKVMetadataBuilder", R"doc(Builds the paged-KV description of a step.

For each request r of a CommonAttentionMetadata (rows ordered decodes first):
  num_pages[r]              = ceil(seq_len[r] / page_size) (minus the shared pages under cascade)
  paged_kv_indptr           = [0, cumsum(num_pages)]                       [num_reqs + 1] int32
  paged_kv_indices          = block_table[r, :num_pages[r]] concatenated   [indptr[-1]] int32
  paged_kv_last_page_len[r] = seq_len % page_size, or page_size when that is 0 and seq_len != 0
as vLLM's FlashInfer backend computes them.  Under DCP (dcp_world_size > 1) prefill rows keep
only their context and every length becomes this rank's local length first.  Buffers are
sized at construction (max_num_reqs, max_model_len); build() allocates nothing.)doc")
      .def(py::init([](int64_t max_num_reqs, int64_t max_model_len, int64_t page_size, int64_t dcp_world_size,
                       int64_t dcp_rank, int64_t cp_kv_cache_interleave_size, int64_t num_blocks,
                       int64_t num_speculative_tokens, const std::string& device) {
             PagedKVMetadataConfig c;
             c.max_num_reqs = max_num_reqs;
             c.max_model_len = max_model_len;
             c.page_size = page_size;
             c.dcp_world_size = dcp_world_size;
             c.dcp_rank = dcp_rank;
             c.cp_kv_cache_interleave_size = cp_kv_cache_interleave_size;
             c.num_blocks = num_blocks;
             c.num_speculative_tokens = num_speculative_tokens;
             c.device = Device::parse(device);
             c.validate();
             return std::make_unique<PagedKVMetadataBuilder>(c);
           }),
           py::kw_only(), py::arg("max_num_reqs") = 256, py::arg("max_model_len") = 8192, py::arg("page_size") = 16,
           py::arg("dcp_world_size") = 1, py::arg("dcp_rank") = 0, py::arg("cp_kv_cache_interleave_size") = 1,
           py::arg("num_blocks") = 0, py::arg("num_speculative_tokens") = 0, py::arg("device") = "cpu",
           "page_size: the kernel block size; num_blocks > 0 checks every block id against the pool; "
           "num_speculative_tokens > 0 reads seq_lens instead of seq_lens_cpu_upper_bound.")
      .def_property_readonly("page_size", [](const PagedKVMetadataBuilder& b) { return b.config().page_size; })
      .def_property_readonly("max_num_reqs", [](const PagedKVMetadataBuilder& b) { return b.config().max_num_reqs; })
      .def_property_readonly("max_num_pages",
                             [](const PagedKVMetadataBuilder& b) { return b.config().max_num_pages(); })
      .def(
          "_build_fields",
          [](PagedKVMetadataBuilder& b, py::object common_attn_metadata, int64_t num_decodes,
             int64_t common_prefix_len) {
            MMPrefixRanges ranges;
            const CommonAttentionMetadata cm = cm_from_py(common_attn_metadata, ranges);
            const PagedKVMetadata& md = b.build(cm, num_decodes, common_prefix_len);
            py::dict d;
            d["paged_kv_indptr"] = md.paged_kv_indptr;
            d["paged_kv_indptr_cpu"] = md.paged_kv_indptr_cpu;
            d["paged_kv_indices"] = md.paged_kv_indices;
            d["paged_kv_indices_cpu"] = md.paged_kv_indices_cpu;
            d["paged_kv_last_page_len"] = md.paged_kv_last_page_len;
            d["paged_kv_last_page_len_cpu"] = md.paged_kv_last_page_len_cpu;
            d["seq_lens_cpu"] = md.seq_lens_cpu;
            d["num_reqs"] = md.num_reqs;
            d["num_actual_pages"] = md.num_actual_pages;
            d["use_cascade"] = md.use_cascade;
            d["num_common_kv_blocks"] = md.num_common_kv_blocks;
            d["shared_kv_page_indices"] =
                md.shared_kv_page_indices.defined() ? py::cast(md.shared_kv_page_indices) : py::none();
            d["shared_kv_last_page_len"] = md.shared_kv_last_page_len;
            return d;
          },
          py::arg("common_attn_metadata"), py::arg("num_decodes") = 0, py::arg("common_prefix_len") = 0);
}

}  // namespace

KVATTN_PY_BINDER(bind_paged_kv);

}  // namespace kvattn::python
