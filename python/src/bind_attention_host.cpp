// Python bindings of the host helpers of attention/ that the batch-preparation layer uses:
// per-layer hyperparameters (per_layer_parameters.h), XQA draft masks (xqa_mask.h), and the
// paged-KV helpers get_seq_lens / use_cascade_attention (paged_kv_metadata.h), under vLLM's
// names.  Layers and backends are described by small Python objects or dicts (read by field
// name), as the full vLLM layer / backend classes have no Python form here.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <sstream>

#include "bindings.h"
#include "kvattn/attention/paged_kv_metadata.h"
#include "kvattn/attention/per_layer_parameters.h"
#include "kvattn/attention/xqa_mask.h"

namespace py = pybind11;

namespace kvattn::python {
namespace {

// A field of a dict (by key) or of any object (by attribute); `fallback` when absent.
py::object field(const py::handle& obj, const char* name, py::object fallback = py::none()) {
  if (py::isinstance<py::dict>(obj)) {
    auto d = py::reinterpret_borrow<py::dict>(obj);
    return d.contains(name) ? py::reinterpret_borrow<py::object>(d[name]) : fallback;
  }
  return py::hasattr(obj, name) ? py::reinterpret_borrow<py::object>(obj.attr(name)) : fallback;
}

AttentionLayerInfo layer_from_py(const py::handle& obj) {
  AttentionLayerInfo l;
  l.name = field(obj, "name").cast<std::string>();
  l.num_heads = field(obj, "num_heads", py::int_(0)).cast<int64_t>();
  l.num_kv_heads = field(obj, "num_kv_heads", py::int_(0)).cast<int64_t>();
  // vLLM's impl.scale; "sm_scale" accepted too.
  py::object scale = field(obj, "sm_scale");
  if (scale.is_none()) scale = field(obj, "scale", py::float_(1.0));
  l.sm_scale = scale.cast<double>();
  py::object sw = field(obj, "sliding_window");
  if (!sw.is_none()) l.sliding_window = sw.cast<std::pair<int64_t, int64_t>>();
  py::object cap = field(obj, "logits_soft_cap");
  if (!cap.is_none()) l.logits_soft_cap = cap.cast<double>();
  l.has_sinks = field(obj, "has_sinks", py::bool_(false)).cast<bool>();
  return l;
}

std::vector<AttentionLayerInfo> layers_from_py(const py::iterable& layers) {
  std::vector<AttentionLayerInfo> out;
  for (auto l : layers) out.push_back(layer_from_py(l));
  return out;
}

std::vector<std::string> names_or_all(const std::vector<AttentionLayerInfo>& layers,
                                      const std::optional<std::vector<std::string>>& names) {
  if (names) return *names;
  std::vector<std::string> all;
  for (const auto& l : layers) all.push_back(l.name);
  return all;
}

// A mask's words as a fresh uint16 NumPy array [rows, 2P] (vLLM's .view(torch.uint16) layout).
py::array_t<uint16_t> mask_u16_array(const Tensor& mask) {
  const auto halves = xqa_mask_u16(mask);
  const int64_t rows = mask.shape()[0];
  const int64_t cols = rows > 0 ? static_cast<int64_t>(halves.size()) / rows : 2 * mask.shape()[1];
  py::array_t<uint16_t> a({static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(cols)});
  std::copy(halves.begin(), halves.end(), a.mutable_data());
  return a;
}

void bind_attention_host(py::module_& m) {
  // ---- per_layer_parameters.h ---------------------------------------------------------
  py::class_<PerLayerParameters>(m, "PerLayerParameters",
                                 "vLLM's PerLayerParameters: the values FlashInfer's plan needs equal "
                                 "across a group's layers (read-only).")
      .def_readonly("window_left", &PerLayerParameters::window_left)
      .def_readonly("logits_soft_cap", &PerLayerParameters::logits_soft_cap)
      .def_readonly("sm_scale", &PerLayerParameters::sm_scale)
      .def_readonly("has_sinks", &PerLayerParameters::has_sinks)
      .def_readonly("has_same_window_lefts", &PerLayerParameters::has_same_window_lefts)
      .def_readonly("has_same_all_params", &PerLayerParameters::has_same_all_params)
      .def("__eq__", [](const PerLayerParameters& a, const PerLayerParameters& b) { return a == b; })
      .def("__repr__", [](const PerLayerParameters& p) {
        std::ostringstream s;
        s << "PerLayerParameters(window_left=" << p.window_left << ", logits_soft_cap=";
        if (p.logits_soft_cap) s << *p.logits_soft_cap; else s << "None";
        s << ", sm_scale=" << p.sm_scale << ", has_sinks=" << (p.has_sinks ? "True" : "False") << ")";
        return s.str();
      });

  m.def(
      "get_per_layer_parameters",
      [](const py::iterable& layers, std::optional<std::vector<std::string>> layer_names) {
        const auto infos = layers_from_py(layers);
        const auto names = names_or_all(infos, layer_names);
        py::dict d;
        for (auto& [name, p] : get_per_layer_parameters(infos, names)) d[py::str(name)] = py::cast(p);
        return d;
      },
      py::arg("layers"), py::arg("layer_names") = py::none(),
      "vLLM's get_per_layer_parameters: {layer name: PerLayerParameters} in layer_names order "
      "(default: every layer).  layers: dicts or objects with name, num_heads, num_kv_heads, "
      "sm_scale (or scale), sliding_window ((left, right) or None), logits_soft_cap, has_sinks.  "
      "An unknown name is a ValueError listing the known ones.");

  m.def(
      "infer_global_hyperparameters",
      [](const py::dict& per_layer_params) {
        PerLayerParameterMap map;
        for (auto item : per_layer_params)
          map.emplace_back(item.first.cast<std::string>(), item.second.cast<PerLayerParameters>());
        return infer_global_hyperparameters(map);
      },
      py::arg("per_layer_params"),
      "vLLM's infer_global_hyperparameters: the first layer's PerLayerParameters with "
      "has_same_window_lefts / has_same_all_params set; an empty dict is a ValueError.");

  m.def(
      "get_num_attention_heads_from_layers",
      [](const py::iterable& layers, std::optional<std::vector<std::string>> layer_names) {
        const auto infos = layers_from_py(layers);
        return get_num_attention_heads_from_layers(infos, names_or_all(infos, layer_names));
      },
      py::arg("layers"), py::arg("layer_names") = py::none(),
      "The num_heads shared by the named layers (None when none is known); layers that disagree "
      "are a ValueError naming each layer's count.");

  m.def(
      "get_query_lens_mismatch_unsupported_backend",
      [](const py::iterable& attn_groups) {
        std::vector<std::vector<AttentionBackendTraits>> groups;
        for (auto per_spec : attn_groups) {
          auto& g = groups.emplace_back();
          for (auto item : per_spec) {
            // An AttentionGroup-like object (with .backend) or the backend itself.
            py::object b = field(item, "backend");
            if (b.is_none()) b = py::reinterpret_borrow<py::object>(item);
            AttentionBackendTraits t;
            py::object name = field(b, "get_name");
            if (name.is_none()) name = field(b, "name", py::str(""));
            if (PyCallable_Check(name.ptr())) name = name();
            t.name = py::str(name).cast<std::string>();
            py::object sup = field(b, "supports_device_cpu_query_lens_mismatch", py::bool_(false));
            if (PyCallable_Check(sup.ptr())) sup = sup();
            t.supports_device_cpu_query_lens_mismatch = sup.cast<bool>();
            g.push_back(std::move(t));
          }
        }
        return get_query_lens_mismatch_unsupported_backend(groups);
      },
      py::arg("attn_groups"),
      "vLLM's get_query_lens_mismatch_unsupported_backend: name of the first backend (over "
      "attn_groups[kv_cache_group][i], each an object with .backend or a backend; a backend "
      "gives name / get_name() and supports_device_cpu_query_lens_mismatch (bool or method), "
      "dicts accepted) that needs exact CPU query lengths, or None.");

  // ---- xqa_mask.h ------------------------------------------------------------------------
  m.def(
      "_make_xqa_draft_block_mask",
      [](int64_t q_len, bool causal) { return mask_u16_array(make_xqa_draft_block_mask(q_len, causal)); },
      py::arg("q_len"), py::arg("causal"),
      "vLLM's _make_xqa_draft_block_mask: uint16 NumPy [q_len, 2 * ceil(q_len / 32)]; row qi has "
      "bit kj (of 32-bit word kj // 32, low half first) set iff kj <= qi (causal) or kj < q_len.");
  m.def(
      "_make_xqa_ragged_draft_block_mask",
      [](std::vector<int32_t> q_lens, int64_t max_q_len, bool causal) {
        return mask_u16_array(make_xqa_ragged_draft_block_mask(q_lens, max_q_len, causal));
      },
      py::arg("q_lens"), py::arg("max_q_len"), py::arg("causal"),
      "vLLM's _make_xqa_ragged_draft_block_mask: uint16 NumPy [sum(q_lens), 2 * ceil(max_q_len / "
      "32)], one row per draft token; bit kj set iff kj < L and (kj <= qi if causal).");
  m.def(
      "_compute_decode_query_lens",
      [](std::vector<int32_t> qo_indptr_cpu, int64_t num_decodes, int64_t num_decode_tokens, bool use_xqa) {
        auto r = compute_decode_query_lens(qo_indptr_cpu, num_decodes, num_decode_tokens, use_xqa);
        return py::make_tuple(r.q_len_per_req, r.use_qo_indptr, r.ragged_q_lens);
      },
      py::arg("qo_indptr_cpu"), py::arg("num_decodes"), py::arg("num_decode_tokens"), py::arg("use_xqa"),
      "vLLM's _compute_decode_query_lens -> (q_len_per_req, use_qo_indptr, ragged_q_lens or None).");

  // ---- paged_kv_metadata.h ------------------------------------------------------------
  m.def(
      "get_seq_lens",
      [](py::object kv_indptr, py::object kv_last_page_len, int64_t page_size) {
        return get_seq_lens(as_tensor(kv_indptr), as_tensor(kv_last_page_len), page_size);
      },
      py::arg("kv_indptr"), py::arg("kv_last_page_len"), py::arg("page_size"),
      "FlashInfer's get_seq_lens: clamp(indptr[r+1] - indptr[r] - 1, min=0) * page_size + "
      "last_page_len[r], a fresh int32 array.");
  m.def(
      "use_cascade_attention",
      [](int64_t common_prefix_len, std::vector<int32_t> query_lens, int64_t num_query_heads,
         int64_t num_kv_heads, bool use_alibi, bool use_sliding_window, bool use_local_attention,
         int64_t num_sms, int64_t dcp_world_size) {
        CascadeAttentionQuery q;
        q.common_prefix_len = common_prefix_len;
        q.query_lens = query_lens;
        q.num_query_heads = num_query_heads;
        q.num_kv_heads = num_kv_heads;
        q.use_alibi = use_alibi;
        q.use_sliding_window = use_sliding_window;
        q.use_local_attention = use_local_attention;
        q.num_sms = num_sms;
        q.dcp_world_size = dcp_world_size;
        return use_cascade_attention(q);
      },
      py::arg("common_prefix_len"), py::arg("query_lens"), py::arg("num_query_heads"), py::arg("num_kv_heads"),
      py::arg("use_alibi"), py::arg("use_sliding_window"), py::arg("use_local_attention"), py::arg("num_sms"),
      py::arg("dcp_world_size") = 1,
      "vLLM's (FlashAttention) use_cascade_attention heuristic; query_lens: a sequence / 1-D array.");
}

}  // namespace

KVATTN_PY_BINDER(bind_attention_host);

}  // namespace kvattn::python
