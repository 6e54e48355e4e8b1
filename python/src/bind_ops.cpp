// Python bindings of ops/: the device-neutral kernels (CPU or CUDA, chosen by the tensors'
// device).  Every op writes into tensors the caller passes (vLLM's out=... style), so the
// caller's NumPy/PyTorch/CuPy arrays are written through zero-copy DLPack views.
#include <pybind11/stl.h>

#include "bindings.h"
#include "kvattn/attention/per_layer_parameters.h"
#include "kvattn/ops/ops.h"

namespace py = pybind11;

namespace kvattn::python {
namespace {

// A scale given as None (-> undefined), a float (-> [1] f32 on `device`) or a tensor.
Tensor scale_tensor(const py::object& obj, Device device) {
  if (obj.is_none()) return Tensor();
  if (py::isinstance<py::float_>(obj) || py::isinstance<py::int_>(obj)) {
    Tensor host = Tensor::from_vector<float>({obj.cast<float>()});
    return device.is_cpu() ? host : host.to(device);
  }
  return as_tensor(obj);
}

ops::LseBase lse_base_from(const std::string& s) {
  if (s == "2" || s == "two" || s == "log2") return ops::LseBase::Two;
  if (s == "e" || s == "ln" || s == "natural") return ops::LseBase::E;
  throw InvalidArgument("lse_base must be '2' (FlashInfer, base-2 LSE) or 'e' (natural log), got '" + s + "'");
}

// paged_attention called from Python: under a causal mask the query is the last q_len tokens of
// its sequence, so a sequence shorter than its query is the caller's error.  (The C++ op allows
// such rows for its internal callers: cascade's unique level and DCP ranks pass rows whose own
// KV ends before the query starts.)  Checked on host int32 index arrays of consistent sizes;
// every other malformation is left to the op's own validation.
void check_query_within_sequence(const ops::PagedAttentionArgs& a) {
  if (!a.causal) return;
  const auto host_i32 = [](const Tensor& t, int64_t min_len) {
    return t.defined() && t.device().is_cpu() && t.dim() == 1 && t.dtype() == DType::i32 && t.size(0) >= min_len;
  };
  const auto at = [](const Tensor& t, int64_t i) {
    return static_cast<int64_t>(t.data_ptr<int32_t>()[i * t.stride(0)]);
  };
  if (!host_i32(a.qo_indptr, 1)) return;
  const int64_t batch = a.qo_indptr.size(0) - 1;
  const bool table = a.seq_lens.defined();
  if (table ? !host_i32(a.seq_lens, batch)
            : (!host_i32(a.paged_kv_indptr, batch + 1) || !host_i32(a.paged_kv_last_page_len, batch) ||
               a.k_cache.dim() != 4))
    return;
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t q_len = at(a.qo_indptr, r + 1) - at(a.qo_indptr, r);
    int64_t kv_len = 0;
    if (table) {
      kv_len = at(a.seq_lens, r);
    } else {
      const int64_t pages = at(a.paged_kv_indptr, r + 1) - at(a.paged_kv_indptr, r);
      kv_len = pages <= 0 ? 0 : (pages - 1) * a.k_cache.size(1) + at(a.paged_kv_last_page_len, r);
    }
    KVATTN_CHECK(q_len <= kv_len,
                 "paged_attention: request {} has {} query tokens but its sequence holds {} tokens ({}); with "
                 "causal=True the query is the last q_len tokens of the sequence, so the sequence length must "
                 "count the query's own tokens (seq_len >= q_len)",
                 r, q_len, kv_len,
                 table ? "seq_lens[r]" : "from paged_kv_indptr and paged_kv_last_page_len");
  }
}

void bind_ops(py::module_& m) {
  m.def("set_cpu_num_threads", &ops::set_cpu_num_threads, py::arg("n"),
        "Worker threads of the CPU ops (default: the number of hardware threads).");
  m.def("cpu_num_threads", &ops::cpu_num_threads, "Worker threads the CPU ops use (set_cpu_num_threads).");
  m.def("cuda_ops_available", &ops::cuda_ops_available,
        "True when this build has the CUDA implementations of the ops.");

  m.def(
      "reshape_and_cache_flash",
      [](py::object key, py::object value, py::object key_cache, py::object value_cache,
         py::object slot_mapping, py::object kv_cache_dtype, py::object k_scale, py::object v_scale) {
        Tensor k = as_tensor(key);
        ops::reshape_and_cache_flash(k, as_tensor(value), as_tensor(key_cache), as_tensor(value_cache),
                                     as_tensor(slot_mapping), kv_cache_dtype_from_py(kv_cache_dtype),
                                     scale_tensor(k_scale, k.device()),
                                     scale_tensor(v_scale, k.device()));
      },
      py::arg("key"), py::arg("value"), py::arg("key_cache"), py::arg("value_cache"), py::arg("slot_mapping"),
      py::arg("kv_cache_dtype") = "auto", py::arg("k_scale") = py::none(), py::arg("v_scale") = py::none(),
      R"doc(vLLM's reshape_and_cache_flash: write this step's K/V into the paged cache, in place.

key, value       [num_tokens, num_kv_heads, head_size]
key_cache, value_cache  [num_blocks, block_size, num_kv_heads, head_size] views (any strides;
                 HND caches: pass hnd.transpose(1, 2)); written in place
slot_mapping     [num_tokens] int64/int32, -1 = skip
kv_cache_dtype   a KVCacheDType or its name: "auto", "bfloat16", "float16" (the cache's
                 dtype), "fp8" / "fp8_e4m3", "fp8_e5m2" ("nvfp4": NotImplementedError)
k_scale, v_scale fp8 only: a float or a [1] / [num_kv_heads] float32 tensor)doc");

  py::class_<ops::PagedAttentionPlan>(m, "PagedAttentionPlan", R"doc(A work plan kept across paged_attention calls.

Pass it as paged_attention(..., plan=p) for every layer of an engine step and call
p.invalidate() whenever the batch's index tensors change (once per step): on CUDA the first call
runs the kernels' plan, the later ones reuse it (FlashInfer's plan() once per step, run() per
layer).  Any other change of the plan's inputs (index tensors' addresses, sizes, heads, masks)
re-plans by itself.  CPU tensors ignore it.)doc")
      .def(py::init<>())
      .def("invalidate", &ops::PagedAttentionPlan::invalidate, "The next call plans again.")
      .def_property_readonly("plans", &ops::PagedAttentionPlan::plans, "Calls that ran the plan kernel.")
      .def_property_readonly("reuses", &ops::PagedAttentionPlan::reuses, "Calls that reused the kept plan.");

  m.def(
      "paged_attention",
      [](py::object query, py::object k_cache, py::object v_cache, py::object qo_indptr, py::object out,
         py::object paged_kv_indptr, py::object paged_kv_indices, py::object paged_kv_last_page_len,
         py::object block_table, py::object seq_lens, py::object lse, const std::string& lse_base, bool causal,
         int64_t window_left, double logits_soft_cap, std::optional<double> sm_scale, double q_scale,
         double k_scale, double v_scale, py::object sinks, py::object mm_prefix_ranges,
         py::object xqa_draft_mask, ops::PagedAttentionPlan* plan, const std::string& kv_lengths,
         int64_t max_query_len) {
        ops::PagedAttentionArgs a;
        a.query = as_tensor(query);
        a.k_cache = as_tensor(k_cache);
        a.v_cache = as_tensor(v_cache);
        a.qo_indptr = as_tensor(qo_indptr);
        a.out = as_tensor(out);
        a.paged_kv_indptr = optional_tensor(paged_kv_indptr);
        a.paged_kv_indices = optional_tensor(paged_kv_indices);
        a.paged_kv_last_page_len = optional_tensor(paged_kv_last_page_len);
        a.block_table = optional_tensor(block_table);
        a.seq_lens = optional_tensor(seq_lens);
        a.lse = optional_tensor(lse);
        a.lse_base = lse_base_from(lse_base);
        a.causal = causal;
        a.window_left = window_left;
        a.logits_soft_cap = logits_soft_cap;
        a.sm_scale = sm_scale;
        a.q_scale = q_scale;
        a.k_scale = k_scale;
        a.v_scale = v_scale;
        a.sinks = optional_tensor(sinks);
        a.mm_prefix_ranges = optional_tensor(mm_prefix_ranges);
        a.xqa_draft_mask = optional_tensor(xqa_draft_mask);
        a.plan = plan;
        a.max_query_len = max_query_len;
        if (kv_lengths == "mixed") a.kv_lengths = ops::KvLengthsHint::mixed;
        else if (kv_lengths == "uniform") a.kv_lengths = ops::KvLengthsHint::uniform;
        else if (kv_lengths != "unknown")
          throw InvalidArgument("kv_lengths must be 'unknown', 'uniform' or 'mixed' (a hint for the CUDA decode "
                                "schedule), got '" + kv_lengths + "'");
        check_query_within_sequence(a);
        py::gil_scoped_release release;
        ops::paged_attention(a);
      },
      py::arg("query"), py::arg("k_cache"), py::arg("v_cache"), py::arg("qo_indptr"), py::kw_only(),
      py::arg("out"), py::arg("paged_kv_indptr") = py::none(), py::arg("paged_kv_indices") = py::none(),
      py::arg("paged_kv_last_page_len") = py::none(), py::arg("block_table") = py::none(),
      py::arg("seq_lens") = py::none(), py::arg("lse") = py::none(), py::arg("lse_base") = "2",
      py::arg("causal") = true, py::arg("window_left") = -1, py::arg("logits_soft_cap") = 0.0,
      py::arg("sm_scale") = py::none(), py::arg("q_scale") = 1.0, py::arg("k_scale") = 1.0,
      py::arg("v_scale") = 1.0, py::arg("sinks") = py::none(), py::arg("mm_prefix_ranges") = py::none(),
      py::arg("xqa_draft_mask") = py::none(), py::arg("plan") = nullptr, py::arg("kv_lengths") = "unknown",
      py::arg("max_query_len") = -1,
      R"doc(Batched attention over a paged KV cache (FlashInfer's prefill/decode wrappers' run()).

query [num_tokens, num_qo_heads, head_dim]; k_cache/v_cache [num_pages, page_size,
num_kv_heads, head_dim] views; qo_indptr [batch + 1] (vLLM query_start_loc).  Pages come
either as FlashInfer paged_kv_indptr / paged_kv_indices / paged_kv_last_page_len or as a vLLM
block_table [batch, max_blocks] with seq_lens [batch].  The query is the last q_len tokens of
each sequence.  out [num_tokens, num_qo_heads, head_dim] is written in place; lse
[num_tokens, num_qo_heads] float32 optionally (lse_base '2' as FlashInfer, or 'e').  plan: an
optional PagedAttentionPlan kept across the layers of a step.  kv_lengths: 'unknown', 'uniform'
or 'mixed' (what the caller knows of the KV lengths; 'mixed' lets CUDA decode run stream-K).
max_query_len: the most query rows of any request (vLLM's max_query_len; -1 unknown), checked on
CPU arrays; on CUDA a known small bound lets decode calls take the whole-page decode kernel.
The GIL is released while the kernel runs.)doc");

  m.def("split_kv_cache_layer_view",
        [](py::object layer_view, int64_t head_size) {
          return ops::split_kv_cache_layer_view(as_tensor(layer_view), head_size);
        },
        py::arg("layer_view"), py::arg("head_size"),
        "vLLM's per-layer view [num_blocks, num_heads, block_size, 2 * head_size] -> (k_cache, v_cache) "
        "views [num_blocks, block_size, num_heads, head_size] (FlashInfer's "
        "kv_cache.transpose(1, 2).split(head_size, -1)); zero-copy.");
  m.def("make_xqa_draft_block_mask", &ops::make_xqa_draft_block_mask, py::arg("q_lens"), py::arg("causal") = true,
        "Packed XQA draft mask [sum(q_lens), ceil(max_q_len / 32)] int32 (vLLM "
        "_make_xqa_ragged_draft_block_mask as 32-bit words).");
  m.def(
      "log2_lse_to_ln",
      [](py::object lse) -> py::object {
        // Scalar form (a Python float / int): lse * ln(2) as a float32 value.
        if (py::isinstance<py::float_>(lse) || py::isinstance<py::int_>(lse))
          return py::float_(kvattn::log2_lse_to_ln(lse.cast<float>()));
        ops::log2_lse_to_ln(as_tensor(lse));
        return lse;
      },
      py::arg("lse"),
      "vLLM's log2_lse_to_ln: base-2 LSE (FlashInfer) -> natural log.  A float32 array is "
      "converted in place and returned; a Python number gives float32(lse * ln 2).");

  m.def(
      "merge_attn_states",
      [](py::object output, py::object prefix_output, py::object prefix_lse, py::object suffix_output,
         py::object suffix_lse, py::object output_lse, std::optional<int64_t> prefill_tokens_with_context,
         py::object output_scale) {
        Tensor out = as_tensor(output);
        ops::MergeAttnStatesArgs a;
        a.output = out;
        a.prefix_output = as_tensor(prefix_output);
        a.prefix_lse = as_tensor(prefix_lse);
        a.suffix_output = as_tensor(suffix_output);
        a.suffix_lse = as_tensor(suffix_lse);
        a.output_lse = optional_tensor(output_lse);
        a.prefill_tokens_with_context = prefill_tokens_with_context;
        a.output_scale = scale_tensor(output_scale, out.device());
        py::gil_scoped_release release;
        ops::merge_attn_states(a);
      },
      py::arg("output"), py::arg("prefix_output"), py::arg("prefix_lse"), py::arg("suffix_output"),
      py::arg("suffix_lse"), py::arg("output_lse") = py::none(),
      py::arg("prefill_tokens_with_context") = py::none(), py::arg("output_scale") = py::none(),
      R"doc(vLLM's merge_attn_states: combine two partial attention results by their LSE, in place.

output, prefix_output, suffix_output [num_tokens, num_heads, head_dim]; prefix_lse,
suffix_lse, output_lse [num_heads, num_tokens] float32 natural-log LSEs (+inf read as -inf).
Tokens >= prefill_tokens_with_context take the suffix only.  fp8 output needs output_scale.)doc");
  m.def(
      "mask_empty_context_lse",
      [](py::object lse, py::object query_start_loc, py::object context_start_loc) {
        ops::mask_empty_context_lse(as_tensor(lse), as_tensor(query_start_loc), as_tensor(context_start_loc));
      },
      py::arg("lse"), py::arg("query_start_loc"), py::arg("context_start_loc"),
      "Sets lse[:, qsl[r]:qsl[r+1]] = -inf for every request whose context chunk is empty; in place.");

  m.def(
      "cascade_attention",
      [](py::object query, py::object k_cache, py::object v_cache, py::object qo_indptr,
         py::object shared_kv_page_indices, py::object paged_kv_indptr, py::object paged_kv_indices,
         py::object paged_kv_last_page_len, py::object out, double logits_soft_cap,
         std::optional<double> sm_scale, double q_scale, double k_scale, double v_scale) {
        ops::CascadeAttentionArgs a;
        a.query = as_tensor(query);
        a.k_cache = as_tensor(k_cache);
        a.v_cache = as_tensor(v_cache);
        a.qo_indptr = as_tensor(qo_indptr);
        a.shared_kv_page_indices = as_tensor(shared_kv_page_indices);
        a.paged_kv_indptr = as_tensor(paged_kv_indptr);
        a.paged_kv_indices = as_tensor(paged_kv_indices);
        a.paged_kv_last_page_len = as_tensor(paged_kv_last_page_len);
        a.out = as_tensor(out);
        a.logits_soft_cap = logits_soft_cap;
        a.sm_scale = sm_scale;
        a.q_scale = q_scale;
        a.k_scale = k_scale;
        a.v_scale = v_scale;
        py::gil_scoped_release release;
        ops::cascade_attention(a);
      },
      py::arg("query"), py::arg("k_cache"), py::arg("v_cache"), py::arg("qo_indptr"),
      py::arg("shared_kv_page_indices"), py::arg("paged_kv_indptr"), py::arg("paged_kv_indices"),
      py::arg("paged_kv_last_page_len"), py::kw_only(), py::arg("out"), py::arg("logits_soft_cap") = 0.0,
      py::arg("sm_scale") = py::none(), py::arg("q_scale") = 1.0, py::arg("k_scale") = 1.0,
      py::arg("v_scale") = 1.0,
      "Two-level cascade attention (FlashInfer MultiLevelCascadeAttentionWrapper(2)): shared-prefix "
      "pages for every row, then each request's own pages, merged by LSE; writes out.");

  m.def(
      "dcp_prefill_attention",
      [](py::object query, py::object k_cache, py::object v_cache, py::object qo_indptr,
         py::object paged_kv_indptr, py::object paged_kv_indices, py::object paged_kv_last_page_len,
         py::object key, py::object value, py::object out, int64_t window_left, double logits_soft_cap,
         std::optional<double> sm_scale, double k_scale, double v_scale) {
        ops::DcpPrefillArgs a;
        a.query = as_tensor(query);
        a.k_cache = as_tensor(k_cache);
        a.v_cache = as_tensor(v_cache);
        a.qo_indptr = as_tensor(qo_indptr);
        a.paged_kv_indptr = as_tensor(paged_kv_indptr);
        a.paged_kv_indices = as_tensor(paged_kv_indices);
        a.paged_kv_last_page_len = as_tensor(paged_kv_last_page_len);
        a.key = as_tensor(key);
        a.value = as_tensor(value);
        a.out = as_tensor(out);
        a.window_left = window_left;
        a.logits_soft_cap = logits_soft_cap;
        a.sm_scale = sm_scale;
        a.k_scale = k_scale;
        a.v_scale = v_scale;
        py::gil_scoped_release release;
        ops::dcp_prefill_attention(a);
      },
      py::arg("query"), py::arg("k_cache"), py::arg("v_cache"), py::arg("qo_indptr"), py::arg("paged_kv_indptr"),
      py::arg("paged_kv_indices"), py::arg("paged_kv_last_page_len"), py::arg("key"), py::arg("value"),
      py::kw_only(), py::arg("out"), py::arg("window_left") = -1, py::arg("logits_soft_cap") = 0.0,
      py::arg("sm_scale") = py::none(), py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0,
      "Single-rank DCP prefill (BatchDCPPrefillWrapper shape): non-causal pass over the cached context, "
      "causal pass over the new tokens' key/value, merged by LSE; writes out.");

  m.def(
      "copy_page_indices",
      [](py::object paged_kv_indices, py::object block_table, py::object paged_kv_indptr) {
        ops::copy_page_indices(as_tensor(paged_kv_indices), as_tensor(block_table), as_tensor(paged_kv_indptr));
      },
      py::arg("paged_kv_indices"), py::arg("block_table"), py::arg("paged_kv_indptr"),
      "FlashInfer backend's _copy_page_indices_kernel: paged_kv_indices[indptr[r] + i] = block_table[r, i].");
  m.def(
      "mamba_align_block_table",
      [](py::object out, py::object block_table, py::object seq_lens, int64_t block_size) {
        ops::mamba_align_block_table(as_tensor(out), as_tensor(block_table), as_tensor(seq_lens), block_size);
      },
      py::arg("out"), py::arg("block_table"), py::arg("seq_lens"), py::arg("block_size"),
      "vLLM's _mamba_align_block_table_kernel: out[r, j] = block_table[r, max((seq_lens[r]-1)//bs, 0) + j].");
  m.def(
      "kvfp8_dequant",
      [](py::object k_cache, py::object v_cache, py::object block_tables, py::object k_scale, py::object v_scale,
         py::object out_k_cache, py::object out_v_cache) {
        Tensor k = as_tensor(k_cache);
        ops::kvfp8_dequant(k, as_tensor(v_cache), as_tensor(block_tables), scale_tensor(k_scale, k.device()),
                           scale_tensor(v_scale, k.device()), as_tensor(out_k_cache), as_tensor(out_v_cache));
      },
      py::arg("k_cache"), py::arg("v_cache"), py::arg("block_tables"), py::arg("k_scale"), py::arg("v_scale"),
      py::arg("out_k_cache"), py::arg("out_v_cache"),
      "vLLM's trtllm_prefill_attn_kvfp8_dequant: fp8 pages -> bf16/f16 mock pages r * P + 1 + c.");
  m.def("make_mock_block_table", &ops::make_mock_block_table, py::arg("num_reqs"), py::arg("pages_per_req"),
        "[num_reqs, pages_per_req] int32 with entries r * P + 1 + c.");
  m.def(
      "zero_kv_blocks",
      [](py::object seg_addrs, py::object seg_block_strides, py::object seg_page_sizes, py::object block_ids) {
        ops::zero_kv_blocks(as_tensor(seg_addrs), as_tensor(seg_block_strides), as_tensor(seg_page_sizes),
                            as_tensor(block_ids));
      },
      py::arg("seg_addrs"), py::arg("seg_block_strides"), py::arg("seg_page_sizes"), py::arg("block_ids"),
      "vLLM's _zero_kv_blocks_kernel over a KVBlockZeroer segment table (addresses are trusted).");
}

}  // namespace

KVATTN_PY_BINDER(bind_ops);

}  // namespace kvattn::python
