// Python bindings of kv/: layouts and their resolution, the spec family, the memory plan,
// allocation and per-layer views, kernel blocks (AttentionGroup), KVBlockZeroer, worker
// helpers and the model planner — under vLLM's names and keyword names.
//
// Specs are immutable and shared (std::shared_ptr<const KVCacheSpec> in C++); pybind11 needs a
// non-const holder, so they cross as shared_ptr<KVCacheSpec> (const_pointer_cast) and expose
// only const methods.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "kvattn/kv/allocate.h"
#include "kvattn/kv/attention_group.h"
#include "kvattn/kv/block_size.h"
#include "kvattn/kv/kv_block_zeroer.h"
#include "kvattn/kv/kv_cache_config.h"
#include "kvattn/kv/kv_cache_layout.h"
#include "kvattn/kv/kv_cache_spec.h"
#include "kvattn/kv/model_config.h"
#include "kvattn/kv/worker_utils.h"

namespace py = pybind11;

namespace kvattn::python {
namespace {

using SpecHolder = std::shared_ptr<KVCacheSpec>;
SpecHolder mut(const KVCacheSpecPtr& p) { return std::const_pointer_cast<KVCacheSpec>(p); }

// A layout given as a KVCacheLayout or a name (aliases NHD / HND accepted).
KVCacheLayout layout_from_py(const py::handle& obj) {
  if (py::isinstance<KVCacheLayout>(obj)) return obj.cast<KVCacheLayout>();
  if (py::isinstance<py::str>(obj)) return layout_from_name(obj.cast<std::string>());
  throw InvalidArgument("kv_cache_layout must be a KVCacheLayout or a layout name, got " +
                        std::string(py::str(py::type::of(obj))));
}

Device device_from_py(const py::handle& obj) { return Device::parse(std::string(py::str(obj))); }

KVCacheSpecKind spec_kind_from_name(const std::string& name) {
  for (int k = 0; k <= static_cast<int>(KVCacheSpecKind::Unknown); ++k)
    if (name == kv_cache_spec_kind_name(static_cast<KVCacheSpecKind>(k))) return static_cast<KVCacheSpecKind>(k);
  throw InvalidArgument("unknown KV cache spec kind '" + name + "'");
}

KVQuantMode quant_mode_from_py(const py::handle& obj) {
  if (py::isinstance<KVQuantMode>(obj)) return obj.cast<KVQuantMode>();
  if (py::isinstance<py::int_>(obj)) {
    const int v = obj.cast<int>();
    KVATTN_CHECK(v >= 0 && v <= static_cast<int>(KVQuantMode::NVFP4_DS_MLA), "kv_quant_mode {} is out of range [0, 10]", v);
    return static_cast<KVQuantMode>(v);
  }
  return get_kv_quant_mode(obj.cast<std::string>());  // a cache dtype string ("fp8", "auto")
}

Fraction fraction_from_py(const py::handle& obj) {
  if (py::isinstance<py::int_>(obj)) return Fraction{obj.cast<int64_t>(), 1};
  if (py::hasattr(obj, "numerator") && py::hasattr(obj, "denominator"))  // fractions.Fraction
    return Fraction{obj.attr("numerator").cast<int64_t>(), obj.attr("denominator").cast<int64_t>()};
  auto t = obj.cast<std::pair<int64_t, int64_t>>();
  return Fraction{t.first, t.second};
}

KVCacheLimits limits_from(int64_t max_model_len, int64_t max_num_batched_tokens, int64_t max_num_encoder_input_tokens,
                          int64_t decode_context_parallel_size) {
  return KVCacheLimits{max_model_len, max_num_batched_tokens, max_num_encoder_input_tokens,
                       decode_context_parallel_size};
}

std::vector<LayerKVCacheSpec> layer_specs_from(const py::dict& kv_cache_spec) {
  std::vector<LayerKVCacheSpec> layers;
  for (auto item : kv_cache_spec)
    layers.push_back({item.first.cast<std::string>(), item.second.cast<SpecHolder>()});
  return layers;
}

py::dict views_to_py(const KVCacheViews& v) {
  py::dict d;
  for (const auto& [name, t] : v) d[py::str(name)] = t;
  return d;
}

KVCacheViews views_from_py(const py::handle& obj) {
  KVCacheViews v;
  if (obj.is_none()) return v;
  for (auto item : py::reinterpret_borrow<py::dict>(obj))
    v.emplace(item.first.cast<std::string>(), as_tensor(py::reinterpret_borrow<py::object>(item.second)));
  return v;
}

std::vector<KernelBlockSize> kernel_sizes_from_py(const py::handle& seq) {
  std::vector<KernelBlockSize> out;
  for (auto s : seq) {
    if (py::isinstance<MultipleOf>(s)) out.emplace_back(s.cast<MultipleOf>());
    else if (py::isinstance<py::int_>(s)) out.emplace_back(s.cast<int64_t>());
    else throw InvalidArgument("Unknown supported size: " + std::string(py::repr(s)) + " (expected an int or MultipleOf)");
  }
  return out;
}

py::list kernel_sizes_to_py(const std::vector<KernelBlockSize>& sizes) {
  py::list l;
  for (const auto& s : sizes) {
    if (auto* i = std::get_if<int64_t>(&s)) l.append(*i);
    else if (auto* mo = std::get_if<MultipleOf>(&s)) l.append(py::cast(*mo));
    else l.append(py::none());
  }
  return l;
}

std::vector<const BlockSizeBackend*> backends_from_py(const py::handle& seq) {
  std::vector<const BlockSizeBackend*> out;
  for (auto b : seq) {
    if (py::isinstance<AttentionGroup>(b)) {
      const auto* be = b.cast<const AttentionGroup&>().backend;
      KVATTN_CHECK(be != nullptr, "select_common_block_size: an AttentionGroup has no backend");
      out.push_back(be);
    } else {
      out.push_back(b.cast<const BlockSizeBackend*>());
    }
  }
  return out;
}

// The `backends` of select_common_block_size as vLLM passes them, each one of: a BlockSizeBackend;
// an AttentionGroup (its backend; kvattn's earlier (kv_manager_block_size, attn_groups) form);
// or any object with get_name() and get_supported_kernel_block_sizes([kv_cache_spec]) (vLLM's
// backend classes), read into a BlockSizeBackend for this call with backend i's spec.
struct PyBackends {
  std::vector<std::shared_ptr<BlockSizeBackend>> owned;
  std::vector<const BlockSizeBackend*> ptrs;
};

PyBackends py_backends(const py::handle& seq, const py::list& specs) {
  PyBackends out;
  size_t i = 0;
  for (auto b : seq) {
    if (py::isinstance<AttentionGroup>(b) || py::isinstance<BlockSizeBackend>(b)) {
      out.ptrs.push_back(backends_from_py(py::make_tuple(b)).front());
    } else if (py::hasattr(b, "get_supported_kernel_block_sizes") && py::hasattr(b, "get_name")) {
      py::object spec = i < specs.size() ? py::object(specs[i]) : py::object(py::none());
      py::object sizes;
      try {
        sizes = b.attr("get_supported_kernel_block_sizes")(spec);
      } catch (const py::error_already_set& e) {
        if (!e.matches(PyExc_TypeError)) throw;
        sizes = b.attr("get_supported_kernel_block_sizes")();  // a method taking no spec
      }
      out.owned.push_back(std::make_shared<BlockSizeBackend>(
          BlockSizeBackend::with_sizes(py::str(b.attr("get_name")()).cast<std::string>(), kernel_sizes_from_py(sizes))));
      out.ptrs.push_back(out.owned.back().get());
    } else {
      throw InvalidArgument("select_common_block_size: backend " + std::to_string(i) + " is " +
                            std::string(py::repr(b)) +
                            "; pass BlockSizeBackend objects, AttentionGroups, or backend objects with "
                            "get_name() and get_supported_kernel_block_sizes()");
    }
    ++i;
  }
  return out;
}

std::vector<AttentionGroup*> group_ptrs_from_py(const py::handle& seq) {
  std::vector<AttentionGroup*> out;
  for (auto g : seq) out.push_back(g.cast<AttentionGroup*>());
  return out;
}

AttentionSpecOptions attention_options(std::optional<int64_t> head_size_v, py::object kv_quant_mode,
                                       std::optional<int64_t> page_size_padded, std::optional<int64_t> num_head_slots,
                                       std::optional<int64_t> state_content_bytes, py::object tokens_per_state,
                                       bool dcp_sharded, bool uses_slot_mapping,
                                       std::optional<int64_t> block_stride_alignment,
                                       std::optional<int64_t> sliding_window,
                                       std::optional<int64_t> attention_chunk_size, int64_t extra_retained_tokens,
                                       bool non_causal, std::optional<int64_t> sink_len,
                                       std::optional<int64_t> mla_alignment) {
  AttentionSpecOptions o;
  o.head_size_v = head_size_v;
  o.kv_quant_mode = quant_mode_from_py(kv_quant_mode);
  o.page_size_padded = page_size_padded;
  o.num_head_slots = num_head_slots;
  o.state_content_bytes = state_content_bytes;
  o.tokens_per_state = fraction_from_py(tokens_per_state);
  o.dcp_sharded = dcp_sharded;
  o.uses_slot_mapping = uses_slot_mapping;
  o.block_stride_alignment = block_stride_alignment;
  o.sliding_window = sliding_window;
  o.attention_chunk_size = attention_chunk_size;
  o.extra_retained_tokens = extra_retained_tokens;
  o.non_causal = non_causal;
  o.sink_len = sink_len;
  o.mla_alignment = mla_alignment;
  return o;
}

std::shared_ptr<AttentionSpec> make_attention_spec(const std::string& kind, int64_t block_size, int64_t num_kv_heads,
                                                   int64_t head_size, DType dtype, const AttentionSpecOptions& o) {
  std::shared_ptr<const AttentionSpec> s;
  switch (spec_kind_from_name(kind)) {
    case KVCacheSpecKind::FullAttention: s = FullAttentionSpec(block_size, num_kv_heads, head_size, dtype, o); break;
    case KVCacheSpecKind::MLAAttention: s = MLAAttentionSpec(block_size, num_kv_heads, head_size, dtype, o); break;
    case KVCacheSpecKind::SlidingWindow:
      KVATTN_CHECK(o.sliding_window.has_value(), "SlidingWindowSpec: sliding_window is required");
      s = SlidingWindowSpec(block_size, num_kv_heads, head_size, dtype, *o.sliding_window, o);
      break;
    case KVCacheSpecKind::ChunkedLocalAttention:
      KVATTN_CHECK(o.attention_chunk_size.has_value(), "ChunkedLocalAttentionSpec: attention_chunk_size is required");
      s = ChunkedLocalAttentionSpec(block_size, num_kv_heads, head_size, dtype, *o.attention_chunk_size, o);
      break;
    case KVCacheSpecKind::CrossAttention: s = CrossAttentionSpec(block_size, num_kv_heads, head_size, dtype, o); break;
    case KVCacheSpecKind::EncoderOnlyAttention:
      s = EncoderOnlyAttentionSpec(block_size, num_kv_heads, head_size, dtype, o);
      break;
    default:
      s = std::make_shared<const AttentionSpec>(spec_kind_from_name(kind), block_size, num_kv_heads, head_size, dtype, o);
  }
  return std::const_pointer_cast<AttentionSpec>(s);
}

py::tuple arr_to_tuple(const auto& a) {
  py::tuple t(a.size());
  for (size_t i = 0; i < a.size(); ++i) t[i] = a[i];
  return t;
}

void bind_layouts(py::module_& m) {
  py::enum_<KVCacheLayout> layout(m, "KVCacheLayout",
                                  "Physical order of the KV cache's logical axes [L, B, H, N, C] "
                                  "(vllm/v1/kv_cache_layout.py).");
  for (KVCacheLayout l : kAllKVCacheLayouts) layout.value(layout_name(l), l);
  layout.def_property_readonly("stride_order", [](KVCacheLayout l) { return arr_to_tuple(stride_order(l)); })
      .def_property_readonly("layer_view_order", [](KVCacheLayout l) { return arr_to_tuple(layer_view_order(l)); })
      .def_property_readonly("is_layer_compact", &is_layer_compact)
      .def_property_readonly("is_block_contiguous", &is_block_contiguous)
      .def_property_readonly("is_block_compact", &is_block_compact)
      .def_property_readonly("is_block_outermost", &is_block_outermost);

  m.def("layout_from_name", [](const std::string& n) { return layout_from_name(n); }, py::arg("name"),
        "vLLM's _layout_from_name: a layout name or the legacy alias NHD / HND.");
  m.def("_layout_from_name", [](const std::string& n) { return layout_from_name(n); }, py::arg("layout_name"),
        "vLLM's _layout_from_name(layout_name) under its own name (layout_from_name).");
  m.def("get_flashinfer_layout_string", &get_flashinfer_layout_string, py::arg("layout"),
        "FlashInfer's 'NHD' / 'HND' for a layout's block interior; NotImplementedError for LHBNC.");
  m.def("merge_supported_layouts", &merge_supported_layouts, py::arg("supported_layouts"),
        "vLLM's _merge_supported_layouts: the layouts in every list, ordered by how many lists put them first.");
  m.def("_merge_supported_layouts", &merge_supported_layouts, py::arg("supported_layouts_lists"),
        "vLLM's _merge_supported_layouts(supported_layouts_lists) under its own name (merge_supported_layouts).");
  m.def(
      "get_supported_kv_cache_layouts",
      [](py::iterable backends) {
        std::vector<std::optional<LayoutList>> declarations;
        for (auto b : backends) {
          py::object d = py::reinterpret_borrow<py::object>(b);
          // A backend (vLLM passes the classes) answers supported_kv_cache_layouts(); a list or None
          // is a declaration already.
          if (!d.is_none() && !py::isinstance<py::sequence>(d) && py::hasattr(d, "supported_kv_cache_layouts"))
            d = d.attr("supported_kv_cache_layouts")();
          if (d.is_none()) {
            declarations.emplace_back(std::nullopt);
          } else {
            LayoutList l;
            for (auto x : d) l.push_back(layout_from_py(py::reinterpret_borrow<py::object>(x)));
            declarations.emplace_back(std::move(l));
          }
        }
        return get_supported_kv_cache_layouts(declarations);
      },
      py::arg("backends"),
      "vLLM's get_supported_kv_cache_layouts(backends): the layouts every backend supports, most preferred "
      "first.  Each entry is a backend answering supported_kv_cache_layouts() or that answer itself (a list of "
      "layouts, or None: any layout, no vote).");

  py::class_<CacheConfig>(m, "CacheConfig", "The slice of vLLM's CacheConfig that holds the resolved layout.")
      .def(py::init([](py::object kv_cache_layout) {
             CacheConfig c;
             if (!kv_cache_layout.is_none()) c.kv_cache_layout = layout_from_py(kv_cache_layout);
             return c;
           }),
           py::arg("kv_cache_layout") = py::none())
      .def_property(
          "kv_cache_layout", [](const CacheConfig& c) { return c.kv_cache_layout; },
          [](CacheConfig& c, py::object v) {
            c.kv_cache_layout = v.is_none() ? std::nullopt : std::optional<KVCacheLayout>(layout_from_py(v));
          },
          "The resolved KVCacheLayout (None: not resolved yet); set with a layout or its name.")
      .def("get_resolved_kv_cache_layout", &CacheConfig::get_resolved_kv_cache_layout);

  auto cache_config_of = [](py::object obj) -> CacheConfig& {
    if (py::isinstance<CacheConfig>(obj)) return obj.cast<CacheConfig&>();
    return obj.attr("cache_config").cast<CacheConfig&>();  // a vllm_config-like object
  };
  m.def(
      "record_kv_cache_layout",
      [cache_config_of](py::object cache_config, const std::string& layout_name) {
        record_kv_cache_layout(cache_config_of(cache_config), layout_name);
      },
      py::arg("cache_config"), py::arg("layout_name"),
      "vLLM's record_kv_cache_layout: adopt a layout resolved elsewhere (write-once; aliases normalise).");
  m.def(
      "resolve_kv_cache_layout",
      [cache_config_of](py::object vllm_config, std::vector<std::vector<std::string>> supported_layouts,
                        py::object kv_cache_specs, std::optional<std::string> requested_layout,
                        std::optional<std::string> connector_layout) {
        std::vector<KVCacheSpecPtr> specs;
        if (!kv_cache_specs.is_none())
          for (auto s : kv_cache_specs) specs.push_back(s.cast<SpecHolder>());
        return resolve_kv_cache_layout(cache_config_of(vllm_config), supported_layouts, specs, requested_layout,
                                       connector_layout);
      },
      py::arg("vllm_config"), py::arg("supported_layouts"), py::arg("kv_cache_specs") = py::none(),
      py::arg("requested_layout") = py::none(), py::arg("connector_layout") = py::none(),
      R"doc(vLLM's resolve_kv_cache_layout: one layout for the whole model, recorded in the config.

vllm_config: a CacheConfig or any object with a `cache_config` attribute holding one.
supported_layouts: one list of layout names per worker.  requested_layout plays
VLLM_KV_CACHE_LAYOUT (see resolve_kv_cache_layout_from_env).)doc");
  m.def(
      "resolve_kv_cache_layout_from_env",
      [cache_config_of](py::object vllm_config, std::vector<std::vector<std::string>> supported_layouts,
                        py::object kv_cache_specs, std::optional<std::string> connector_layout) {
        std::vector<KVCacheSpecPtr> specs;
        if (!kv_cache_specs.is_none())
          for (auto s : kv_cache_specs) specs.push_back(s.cast<SpecHolder>());
        return resolve_kv_cache_layout_from_env(cache_config_of(vllm_config), supported_layouts, specs,
                                                connector_layout);
      },
      py::arg("vllm_config"), py::arg("supported_layouts"), py::arg("kv_cache_specs") = py::none(),
      py::arg("connector_layout") = py::none(), "resolve_kv_cache_layout with VLLM_KV_CACHE_LAYOUT from the environment.");
  m.def("kv_cache_layout_from_env", &kv_cache_layout_from_env, "VLLM_KV_CACHE_LAYOUT, validated (None when unset).");
}

void bind_specs(py::module_& m) {
  py::enum_<KVQuantMode> qm(m, "KVQuantMode", "vLLM's KVQuantMode.");
  for (int k = 0; k <= static_cast<int>(KVQuantMode::NVFP4_DS_MLA); ++k)
    qm.value(kv_quant_mode_name(static_cast<KVQuantMode>(k)), static_cast<KVQuantMode>(k));
  m.def("get_kv_quant_mode", py::overload_cast<std::string_view>(&get_kv_quant_mode), py::arg("cache_dtype_str"),
        "vLLM's get_kv_quant_mode: the KVQuantMode of a cache dtype string ('auto' -> NONE, 'fp8' -> FP8_PER_TENSOR, ...).");
  m.def("is_per_token_head", &is_per_token_head, py::arg("kv_quant_mode"),
        "True for the quantisation modes with one scale per token and head.");
  m.def("is_nvfp4", py::overload_cast<KVQuantMode>(&is_nvfp4), py::arg("kv_quant_mode"),
        "True for the NVFP4 KV-cache modes.");
  m.def("iter_layer_specs",
        [](const SpecHolder& spec) {
          std::vector<SpecHolder> out;
          for (const auto& s : iter_layer_specs(spec)) out.push_back(mut(s));
          return out;
        },
        py::arg("kv_cache_spec"), "Per-layer specs of a UniformTypeKVCacheSpecs, else [spec].");
  m.def("is_quantized_kv_cache", py::overload_cast<std::string_view>(&is_quantized_kv_cache), py::arg("kv_cache_dtype"),
        "vLLM's is_quantized_kv_cache: True unless kv_cache_dtype is 'auto' or a 16/32-bit float name.");

  py::class_<KVCacheSpec, SpecHolder>(m, "KVCacheSpec", "Base of vLLM's KV cache spec family (immutable).")
      .def_property_readonly("block_size", &KVCacheSpec::block_size)
      .def_property_readonly("kind", [](const KVCacheSpec& s) { return kv_cache_spec_kind_name(s.kind()); })
      .def_property_readonly("num_heads", &KVCacheSpec::num_heads)
      .def_property_readonly("num_states", &KVCacheSpec::num_states)
      .def_property_readonly("state_content_size_bytes", &KVCacheSpec::state_content_size_bytes)
      .def_property_readonly("page_size_padded", &KVCacheSpec::page_size_padded)
      .def_property_readonly("page_size_bytes", &KVCacheSpec::page_size_bytes)
      .def_property_readonly("real_page_size_bytes", &KVCacheSpec::real_page_size_bytes)
      .def_property_readonly("has_layer_views", &KVCacheSpec::has_layer_views)
      .def("get_num_kernel_states", &KVCacheSpec::get_num_kernel_states, py::arg("kernel_block_size"))
      .def("get_block_stride_alignment", &KVCacheSpec::get_block_stride_alignment)
      .def(
          "max_memory_usage_bytes",
          [](const KVCacheSpec& s, int64_t max_model_len, int64_t max_num_batched_tokens,
             int64_t max_num_encoder_input_tokens, int64_t decode_context_parallel_size) {
            return s.max_memory_usage_bytes(limits_from(max_model_len, max_num_batched_tokens,
                                                        max_num_encoder_input_tokens, decode_context_parallel_size));
          },
          py::kw_only(), py::arg("max_model_len"), py::arg("max_num_batched_tokens") = 0,
          py::arg("max_num_encoder_input_tokens") = 0, py::arg("decode_context_parallel_size") = 1,
          "Bytes one request of max_model_len tokens can hold in this layer (vLLM reads these from vllm_config).")
      .def("copy_with_new_block_size",
           [](const KVCacheSpec& s, int64_t block_size) { return mut(s.copy_with_new_block_size(block_size)); },
           py::arg("block_size"))
      .def_static(
          "merge",
          [](std::vector<SpecHolder> specs) {
            return mut(merge_kv_cache_specs(std::vector<KVCacheSpecPtr>(specs.begin(), specs.end())));
          },
          py::arg("specs"), "vLLM's KVCacheSpec.merge: equal specs (or ones differing only in window/chunk).")
      .def("__repr__", &KVCacheSpec::repr)
      .def("__eq__", [](const KVCacheSpec& a, const KVCacheSpec& b) { return a == b; })
      .def("__hash__", [](const KVCacheSpec& s) { return py::hash(py::str(s.repr())); });

  py::class_<AttentionSpec, KVCacheSpec, std::shared_ptr<AttentionSpec>>(
      m, "AttentionSpec",
      "Every attention spec kind in one class; the vLLM class names (FullAttentionSpec, ...) are "
      "Python subclasses that fix `kind`.")
      .def(py::init([](const std::string& kind, int64_t block_size, int64_t num_kv_heads, int64_t head_size,
                       py::object dtype, std::optional<int64_t> head_size_v, py::object kv_quant_mode,
                       std::optional<int64_t> page_size_padded, std::optional<int64_t> num_head_slots,
                       std::optional<int64_t> state_content_bytes, py::object tokens_per_state, bool dcp_sharded,
                       bool uses_slot_mapping, std::optional<int64_t> block_stride_alignment,
                       std::optional<int64_t> sliding_window, std::optional<int64_t> attention_chunk_size,
                       int64_t extra_retained_tokens, bool non_causal, std::optional<int64_t> sink_len,
                       std::optional<int64_t> mla_alignment) {
             return make_attention_spec(
                 kind, block_size, num_kv_heads, head_size, dtype_from_py(dtype),
                 attention_options(head_size_v, kv_quant_mode, page_size_padded, num_head_slots, state_content_bytes,
                                   tokens_per_state, dcp_sharded, uses_slot_mapping, block_stride_alignment,
                                   sliding_window, attention_chunk_size, extra_retained_tokens, non_causal, sink_len,
                                   mla_alignment));
           }),
           py::arg("kind"), py::kw_only(), py::arg("block_size"), py::arg("num_kv_heads"), py::arg("head_size"),
           py::arg("dtype"), py::arg("head_size_v") = py::none(), py::arg("kv_quant_mode") = py::int_(0),
           py::arg("page_size_padded") = py::none(), py::arg("num_head_slots") = py::none(),
           py::arg("state_content_bytes") = py::none(), py::arg("tokens_per_state") = py::int_(1),
           py::arg("dcp_sharded") = true, py::arg("uses_slot_mapping") = true,
           py::arg("block_stride_alignment") = py::none(), py::arg("sliding_window") = py::none(),
           py::arg("attention_chunk_size") = py::none(), py::arg("extra_retained_tokens") = 0,
           py::arg("non_causal") = false, py::arg("sink_len") = py::none(), py::arg("mla_alignment") = py::none())
      .def_property_readonly("num_kv_heads", &AttentionSpec::num_kv_heads)
      .def_property_readonly("head_size", &AttentionSpec::head_size)
      .def_property_readonly("head_size_v", &AttentionSpec::head_size_v)
      .def_property_readonly("dtype", [](const AttentionSpec& s) { return dtype_name(s.dtype()); })
      .def_property_readonly("kv_quant_mode", &AttentionSpec::kv_quant_mode)
      .def_property_readonly("sliding_window", &AttentionSpec::sliding_window)
      .def_property_readonly("attention_chunk_size", &AttentionSpec::attention_chunk_size)
      .def_property_readonly("dcp_sharded", &AttentionSpec::dcp_sharded)
      .def_property_readonly("uses_slot_mapping", &AttentionSpec::uses_slot_mapping)
      .def_property_readonly("block_stride_alignment", &AttentionSpec::block_stride_alignment)
      .def("max_num_blocks_per_req",
           [](const AttentionSpec& s, int64_t max_len, int64_t decode_context_parallel_size) {
             KVCacheLimits l;
             l.decode_context_parallel_size = decode_context_parallel_size;
             return s.max_num_blocks_per_req(l, max_len);
           },
           py::arg("max_len"), py::arg("decode_context_parallel_size") = 1);

  py::class_<MambaSpec, KVCacheSpec, std::shared_ptr<MambaSpec>>(m, "MambaSpec",
                                                                 "vLLM's MambaSpec: recurrent state, one page per block.")
      .def(py::init([](int64_t block_size, std::vector<std::vector<int64_t>> shapes, py::list dtypes,
                       std::optional<int64_t> page_size_padded, std::string mamba_type, std::string mamba_cache_mode,
                       int64_t num_speculative_blocks, int64_t num_prefill_checkpoint_blocks) {
             std::vector<DType> dts;
             for (auto d : dtypes) dts.push_back(dtype_from_py(d));
             return std::make_shared<MambaSpec>(block_size, std::move(shapes), std::move(dts),
                                                MambaSpecOptions{page_size_padded, std::move(mamba_type),
                                                                 std::move(mamba_cache_mode), num_speculative_blocks,
                                                                 num_prefill_checkpoint_blocks});
           }),
           py::kw_only(), py::arg("block_size"), py::arg("shapes"), py::arg("dtypes"),
           py::arg("page_size_padded") = py::none(), py::arg("mamba_type") = "mamba2",
           py::arg("mamba_cache_mode") = "none", py::arg("num_speculative_blocks") = 0,
           py::arg("num_prefill_checkpoint_blocks") = 0)
      .def_property_readonly("shapes", &MambaSpec::shapes)
      .def_property_readonly("dtypes", [](const MambaSpec& s) {
        std::vector<std::string> v;
        for (DType d : s.dtypes()) v.emplace_back(dtype_name(d));
        return v;
      })
      .def_property_readonly("mamba_type", [](const MambaSpec& s) { return s.options().mamba_type; })
      .def_property_readonly("mamba_cache_mode", [](const MambaSpec& s) { return s.options().mamba_cache_mode; })
      .def_property_readonly("num_speculative_blocks", [](const MambaSpec& s) { return s.options().num_speculative_blocks; });

  py::class_<UniformTypeKVCacheSpecs, KVCacheSpec, std::shared_ptr<UniformTypeKVCacheSpecs>>(
      m, "UniformTypeKVCacheSpecs", "Layers of one type and block size with different per-layer specs.")
      .def(py::init([](int64_t block_size, py::dict kv_cache_specs) {
             std::vector<std::pair<std::string, KVCacheSpecPtr>> v;
             for (auto l : layer_specs_from(kv_cache_specs)) v.emplace_back(l.layer_name, l.spec);
             return std::make_shared<UniformTypeKVCacheSpecs>(block_size, std::move(v));
           }),
           py::kw_only(), py::arg("block_size"), py::arg("kv_cache_specs"))
      .def_static(
          "from_specs",
          [](py::dict kv_cache_specs) -> py::object {
            std::vector<std::pair<std::string, KVCacheSpecPtr>> v;
            for (auto l : layer_specs_from(kv_cache_specs)) v.emplace_back(l.layer_name, l.spec);
            auto u = UniformTypeKVCacheSpecs::from_specs(v);
            if (!u) return py::none();
            return py::cast(std::const_pointer_cast<UniformTypeKVCacheSpecs>(u));
          },
          py::arg("kv_cache_specs"), "A UniformTypeKVCacheSpecs when the specs are uniform-type, else None.")
      .def_property_readonly("kv_cache_specs", [](const UniformTypeKVCacheSpecs& u) {
        py::dict d;
        for (const auto& [n, s] : u.kv_cache_specs()) d[py::str(n)] = mut(s);
        return d;
      });
}

void bind_config(py::module_& m) {
  py::class_<KVCacheTensor>(m, "KVCacheTensor",
                            "vLLM's KVCacheTensor: layers sharing one backing allocation of `size` bytes.")
      .def(py::init([](int64_t size, std::vector<std::string> layers, int64_t layer_stride, int64_t block_stride,
                       int64_t offset) { return KVCacheTensor{size, std::move(layers), layer_stride, block_stride, offset}; }),
           py::kw_only(), py::arg("size"), py::arg("layers") = std::vector<std::string>{}, py::arg("layer_stride") = 0,
           py::arg("block_stride") = 0, py::arg("offset") = 0)
      .def_readwrite("size", &KVCacheTensor::size)
      .def_readwrite("layers", &KVCacheTensor::layers)
      .def_property("shared_by", [](const KVCacheTensor& t) { return t.layers; },
                    [](KVCacheTensor& t, std::vector<std::string> v) { t.layers = std::move(v); },
                    "Older vLLM name of `layers`.")
      .def_readwrite("layer_stride", &KVCacheTensor::layer_stride)
      .def_readwrite("block_stride", &KVCacheTensor::block_stride)
      .def_readwrite("offset", &KVCacheTensor::offset)
      .def("__repr__", [](const KVCacheTensor& t) {
        return "KVCacheTensor(size=" + std::to_string(t.size) + ", layers=" + std::string(py::str(py::cast(t.layers))) +
               ", layer_stride=" + std::to_string(t.layer_stride) + ", block_stride=" + std::to_string(t.block_stride) +
               ", offset=" + std::to_string(t.offset) + ")";
      });

  py::class_<KVCacheGroupSpec>(m, "KVCacheGroupSpec", "vLLM's KVCacheGroupSpec.")
      .def(py::init([](std::vector<std::string> layer_names, SpecHolder kv_cache_spec, bool is_eagle_group,
                       bool enable_kv_transfer) {
             return KVCacheGroupSpec{std::move(layer_names), kv_cache_spec, is_eagle_group, enable_kv_transfer};
           }),
           py::arg("layer_names"), py::arg("kv_cache_spec"), py::arg("is_eagle_group") = false,
           py::arg("enable_kv_transfer") = true)
      .def_readwrite("layer_names", &KVCacheGroupSpec::layer_names)
      .def_property("kv_cache_spec", [](const KVCacheGroupSpec& g) { return mut(g.kv_cache_spec); },
                    [](KVCacheGroupSpec& g, SpecHolder s) { g.kv_cache_spec = s; })
      .def_readwrite("is_eagle_group", &KVCacheGroupSpec::is_eagle_group)
      .def_readwrite("enable_kv_transfer", &KVCacheGroupSpec::enable_kv_transfer)
      .def("__repr__", [](const KVCacheGroupSpec& g) {
        return "KVCacheGroupSpec(layer_names=" + std::string(py::str(py::cast(g.layer_names))) +
               ", kv_cache_spec=" + (g.kv_cache_spec ? g.kv_cache_spec->repr() : "None") + ")";
      });

  py::class_<KVCacheConfig>(m, "KVCacheConfig",
                            "vLLM's KVCacheConfig: the memory plan of the KV cache.\n\n"
                            "num_blocks (per group), kv_cache_tensors (the backing allocations and the layers\n"
                            "sharing each) and kv_cache_groups (layers with one spec).  Made by\n"
                            "get_kv_cache_config(specs, layout, available_memory, max_model_len=...) or\n"
                            "materialize_kv_cache_config(groups, layout, num_blocks); allocate_kv_cache(config,\n"
                            "device, layout) allocates it.  List fields are returned as copies: assign the whole\n"
                            "list to change one.")
      .def(py::init([](int64_t num_blocks, std::vector<KVCacheTensor> kv_cache_tensors,
                       std::vector<KVCacheGroupSpec> kv_cache_groups, py::object kv_cache_layout) {
             KVCacheConfig c;
             c.num_blocks = num_blocks;
             c.kv_cache_tensors = std::move(kv_cache_tensors);
             c.kv_cache_groups = std::move(kv_cache_groups);
             if (!kv_cache_layout.is_none()) c.kv_cache_layout = layout_from_py(kv_cache_layout);
             return c;
           }),
           py::kw_only(), py::arg("num_blocks"), py::arg("kv_cache_tensors"), py::arg("kv_cache_groups"),
           py::arg("kv_cache_layout") = py::none())
      .def_readwrite("num_blocks", &KVCacheConfig::num_blocks)
      .def_readwrite("kv_cache_tensors", &KVCacheConfig::kv_cache_tensors)
      .def_readwrite("kv_cache_groups", &KVCacheConfig::kv_cache_groups)
      .def_property(
          "kv_cache_layout", [](const KVCacheConfig& c) { return c.kv_cache_layout; },
          [](KVCacheConfig& c, py::object v) {
            c.kv_cache_layout = v.is_none() ? std::nullopt : std::optional<KVCacheLayout>(layout_from_py(v));
          },
          "The resolved KVCacheLayout adopted by all workers (None: not recorded); set with a layout or its name.")
      .def("group_index_of", &KVCacheConfig::group_index_of, py::arg("layer_name"))
      .def("layer_spec", [](const KVCacheConfig& c, const std::string& n) { return mut(c.layer_spec(n)); },
           py::arg("layer_name"))
      .def_property_readonly("has_mamba_layers", &KVCacheConfig::has_mamba_layers)
      .def_property_readonly("needs_kv_cache_zeroing", &KVCacheConfig::needs_kv_cache_zeroing);

  m.def("get_kv_cache_groups", [](py::dict kv_cache_spec) { return get_kv_cache_groups(layer_specs_from(kv_cache_spec)); },
        py::arg("kv_cache_spec"),
        "vLLM's get_kv_cache_groups over {layer_name: spec} in model order (hybrid allocator grouping).");
  m.def("validate_kv_cache_config",
        [](py::object layout, const std::vector<KVCacheGroupSpec>& groups) {
          validate_kv_cache_config(layout_from_py(layout), groups);
        },
        py::arg("kv_cache_layout"), py::arg("kv_cache_groups"),
        "Checks that the groups can share one allocation in this layout (ValueError naming the conflict).");
  m.def("get_kv_cache_bytes_per_block",
        [](const std::vector<KVCacheGroupSpec>& groups, py::object layout) {
          return get_kv_cache_bytes_per_block(groups, layout_from_py(layout));
        },
        py::arg("kv_cache_groups"), py::arg("kv_cache_layout"),
        "Bytes one KV block costs across every group's layers in this layout (the planner's unit).");
  m.def("materialize_kv_cache_config",
        [](const std::vector<KVCacheGroupSpec>& groups, py::object layout, int64_t num_blocks) {
          return materialize_kv_cache_config(groups, layout_from_py(layout), num_blocks);
        },
        py::arg("kv_cache_groups"), py::arg("kv_cache_layout"), py::arg("num_blocks"),
        "A KVCacheConfig of exactly num_blocks blocks for these groups (no memory budget involved).");
  m.def(
      "get_kv_cache_config",
      [](py::dict kv_cache_spec, py::object layout, int64_t available_memory, int64_t max_model_len,
         int64_t max_num_batched_tokens, int64_t max_num_encoder_input_tokens, int64_t decode_context_parallel_size,
         std::optional<int64_t> num_gpu_blocks_override) {
        KVCachePlanOptions o{limits_from(max_model_len, max_num_batched_tokens, max_num_encoder_input_tokens,
                                         decode_context_parallel_size),
                             num_gpu_blocks_override};
        return get_kv_cache_config(layer_specs_from(kv_cache_spec), layout_from_py(layout), available_memory, o).value();
      },
      py::arg("kv_cache_spec"), py::arg("kv_cache_layout"), py::arg("available_memory"), py::kw_only(),
      py::arg("max_model_len"), py::arg("max_num_batched_tokens") = 0, py::arg("max_num_encoder_input_tokens") = 0,
      py::arg("decode_context_parallel_size") = 1, py::arg("num_gpu_blocks_override") = py::none(),
      "The whole memory plan (groups, validation, num_blocks, tensors).  ValueError when one "
      "max_model_len request does not fit, with the memory needed and the estimated max length.");
  m.def(
      "get_kv_cache_config_from_groups",
      [](const std::vector<KVCacheGroupSpec>& groups, py::object layout, int64_t available_memory,
         int64_t max_model_len, int64_t max_num_batched_tokens, int64_t max_num_encoder_input_tokens,
         int64_t decode_context_parallel_size, std::optional<int64_t> num_gpu_blocks_override) {
        KVCachePlanOptions o{limits_from(max_model_len, max_num_batched_tokens, max_num_encoder_input_tokens,
                                         decode_context_parallel_size),
                             num_gpu_blocks_override};
        return get_kv_cache_config_from_groups(groups, layout_from_py(layout), available_memory, o).value();
      },
      py::arg("kv_cache_groups"), py::arg("kv_cache_layout"), py::arg("available_memory"), py::kw_only(),
      py::arg("max_model_len"), py::arg("max_num_batched_tokens") = 0, py::arg("max_num_encoder_input_tokens") = 0,
      py::arg("decode_context_parallel_size") = 1, py::arg("num_gpu_blocks_override") = py::none(),
      "get_kv_cache_config for KV cache groups already formed (get_kv_cache_groups); MemoryError when one "
      "max_model_len request does not fit available_memory.");
  m.def(
      "kv_cache_memory_needed",
      [](const std::vector<KVCacheGroupSpec>& groups, py::object layout, int64_t max_model_len,
         int64_t max_num_batched_tokens) {
        return kv_cache_memory_needed(groups, layout_from_py(layout), limits_from(max_model_len, max_num_batched_tokens, 0, 1));
      },
      py::arg("kv_cache_groups"), py::arg("kv_cache_layout"), py::kw_only(), py::arg("max_model_len"),
      py::arg("max_num_batched_tokens") = 0,
      "Bytes of KV cache one request of max_model_len tokens needs across the groups (vLLM's "
      "check_enough_kv_cache_memory figure).");
  m.def(
      "estimate_max_model_len",
      [](const std::vector<KVCacheGroupSpec>& groups, py::object layout, int64_t available_memory,
         int64_t max_model_len, int64_t max_num_batched_tokens) {
        return estimate_max_model_len(groups, layout_from_py(layout),
                                      limits_from(max_model_len, max_num_batched_tokens, 0, 1), available_memory);
      },
      py::arg("kv_cache_groups"), py::arg("kv_cache_layout"), py::arg("available_memory"), py::kw_only(),
      py::arg("max_model_len"), py::arg("max_num_batched_tokens") = 0,
      "Largest max_model_len (<= the given one) whose KV cache fits in available_memory; 0 when none.");
  m.def(
      "compute_layer_kv_cache_shape_bytes",
      [](const SpecHolder& spec, int64_t num_blocks, std::optional<int64_t> kernel_block_size) {
        return arr_to_tuple(compute_layer_kv_cache_shape_bytes(*spec, num_blocks, kernel_block_size));
      },
      py::arg("kv_cache_spec"), py::arg("num_blocks"), py::arg("kernel_block_size") = py::none(),
      "(B, H, N, C) of one layer's view, C in bytes.");
  m.def(
      "compute_layout_strides",
      [](const SpecHolder& spec, int64_t num_blocks, int64_t num_layers, py::object layout,
         std::optional<int64_t> kernel_block_size, std::optional<std::vector<std::optional<int64_t>>> fixed_strides) {
        FixedStrides f{};
        if (fixed_strides) {
          KVATTN_CHECK(fixed_strides->size() == 5, "fixed_strides must have 5 entries [L, B, H, N, C], got {}",
                       fixed_strides->size());
          for (size_t i = 0; i < 5; ++i) f[i] = (*fixed_strides)[i];
        }
        return arr_to_tuple(
            compute_layout_strides(*spec, num_blocks, num_layers, layout_from_py(layout), kernel_block_size, f));
      },
      py::arg("kv_cache_spec"), py::arg("num_blocks"), py::arg("num_layers"), py::arg("kv_cache_layout"),
      py::arg("kernel_block_size") = py::none(), py::arg("fixed_strides") = py::none(),
      "Byte strides of the logical [L, B, H, N, C] grid for a layout.");
  m.def(
      "create_kv_cache_views",
      [](py::object raw, const SpecHolder& spec, int64_t num_blocks, py::object layout,
         const KVCacheTensor& kv_cache_tensor, std::optional<int64_t> kernel_block_size) {
        return create_kv_cache_views(as_tensor(raw), *spec, num_blocks, layout_from_py(layout), kv_cache_tensor,
                                     kernel_block_size);
      },
      py::arg("raw"), py::arg("kv_cache_spec"), py::arg("num_blocks"), py::arg("kv_cache_layout"),
      py::arg("kv_cache_tensor"), py::arg("kernel_block_size") = py::none(),
      "One [B, H, N, C] view per layer of kv_cache_tensor over `raw` (1-D uint8 backing bytes).");
  m.def(
      "allocate_kv_cache",
      [](const KVCacheConfig& kv_cache_config, py::object device, py::object layout,
         std::optional<std::vector<int64_t>> kernel_block_sizes) {
        return views_to_py(allocate_kv_cache(kv_cache_config, device_from_py(device), layout_from_py(layout),
                                             kernel_block_sizes));
      },
      py::arg("kv_cache_config"), py::arg("device"), py::arg("kv_cache_layout"),
      py::arg("kernel_block_sizes") = py::none(),
      "vLLM's allocate_kv_cache: ONE zero-filled allocation, {layer_name: [B, H, N, C] view} "
      "(kvattn Tensors sharing storage; torch.from_dlpack / np.asarray view them).");
}

void bind_kernel_blocks(py::module_& m) {
  py::class_<MultipleOf>(m, "MultipleOf", "A kernel accepts any block size that is a multiple of `base`.")
      .def(py::init([](int64_t base) { return MultipleOf{base}; }), py::arg("base"))
      .def_readonly("base", &MultipleOf::base)
      .def("__eq__", [](const MultipleOf& a, const MultipleOf& b) { return a == b; })
      .def("__repr__", [](const MultipleOf& a) { return "MultipleOf(" + std::to_string(a.base) + ")"; });

  py::class_<BlockSizeBackend, std::shared_ptr<BlockSizeBackend>>(
      m, "BlockSizeBackend",
      "The slice of an attention backend that kernel-block sizing reads: a name and its "
      "supported kernel block sizes (ints and MultipleOf).")
      .def(py::init([](std::string name, py::object supported_kernel_block_sizes) {
             auto sizes = supported_kernel_block_sizes.is_none()
                              ? std::vector<KernelBlockSize>{MultipleOf{1}}
                              : kernel_sizes_from_py(supported_kernel_block_sizes);
             return std::make_shared<BlockSizeBackend>(BlockSizeBackend::with_sizes(std::move(name), std::move(sizes)));
           }),
           py::arg("name"), py::arg("supported_kernel_block_sizes") = py::none())
      .def("get_name", &BlockSizeBackend::get_name)
      .def("get_supported_kernel_block_sizes",
           [](const BlockSizeBackend& b) { return kernel_sizes_to_py(b.get_supported_kernel_block_sizes(nullptr)); });

  m.def("block_size_is_supported",
        [](py::list backends, int64_t block_size) { return block_size_is_supported(backends_from_py(backends), block_size); },
        py::arg("backends"), py::arg("block_size"),
        "Whether every backend accepts block_size (an exact size equal to it, or a MultipleOf dividing it).");
  m.def("_block_size_is_supported",
        [](py::object backends, int64_t block_size, py::object specs) {
          py::list spec_list(specs);
          PyBackends be = py_backends(backends, spec_list);
          KVATTN_CHECK(spec_list.size() == be.ptrs.size(),
                       "_block_size_is_supported: {} specs for {} backends; pass one spec (or None) per backend",
                       spec_list.size(), be.ptrs.size());
          std::vector<SpecHolder> keep;
          std::vector<const KVCacheSpec*> ptrs;
          for (auto s : spec_list) {
            keep.push_back(s.is_none() ? SpecHolder() : s.cast<SpecHolder>());
            ptrs.push_back(keep.back().get());
          }
          return block_size_is_supported(be.ptrs, block_size, ptrs);
        },
        py::arg("backends"), py::arg("block_size"), py::arg("specs"),
        "vLLM's _block_size_is_supported(backends, block_size, specs): backends as select_common_block_size "
        "takes them, one spec (or None) per backend.");
  m.def("select_common_block_size",
        [](int64_t kv_manager_block_size, py::object backends, py::object kv_cache_specs) {
          py::list spec_list = kv_cache_specs.is_none() ? py::list() : py::list(kv_cache_specs);
          PyBackends be = py_backends(backends, spec_list);
          std::vector<SpecHolder> keep;
          std::vector<const KVCacheSpec*> specs;
          if (!kv_cache_specs.is_none()) {
            KVATTN_CHECK(spec_list.size() == be.ptrs.size(),
                         "select_common_block_size: {} kv_cache_specs for {} backends; pass one spec (or None) "
                         "per backend", spec_list.size(), be.ptrs.size());
            for (auto s : spec_list) {
              keep.push_back(s.is_none() ? SpecHolder() : s.cast<SpecHolder>());
              specs.push_back(keep.back().get());
            }
          }
          return select_common_block_size(kv_manager_block_size, be.ptrs, specs);
        },
        py::arg("kv_manager_block_size"), py::arg("backends"), py::arg("kv_cache_specs") = py::none(),
        R"doc(vLLM's select_common_block_size(kv_manager_block_size, backends, kv_cache_specs=None).

kv_manager_block_size itself when every backend accepts it, else the largest exact size a backend
declares that divides it and every backend accepts; ValueError "No common block size ..." otherwise.
backends: BlockSizeBackend objects, AttentionGroups (their backends), or any backend objects with
get_name() and get_supported_kernel_block_sizes([kv_cache_spec]) as vLLM's classes have.
kv_cache_specs: one spec (or None) per backend, passed to each backend's size query.)doc");
  m.def("customize_attention_spec",
        [](const BlockSizeBackend& backend, const std::shared_ptr<AttentionSpec>& spec) {
          return std::const_pointer_cast<AttentionSpec>(customize_attention_spec(backend, spec));
        },
        py::arg("backend"), py::arg("spec"),
        "vLLM's customize_attention_spec: the backend's spec customisation, then a block-stride alignment of "
        "the largest exact kernel block size when the backend declares exact sizes only.");

  py::class_<AttentionGroup>(m, "AttentionGroup",
                             "The KV-cache part of vLLM's AttentionGroup: layers of one KV cache group served "
                             "by one backend, and the manager-block -> kernel-block mapping.\n\n"
                             "AttentionGroup(backend, layer_names, kv_cache_spec, kv_cache_group_id=0,\n"
                             "kernel_block_size=None); configure_kernel_blocks(...) sizes its kernel block table;\n"
                             "map_to_kernel_block_table(block_table) splits each manager block into\n"
                             "blocks_per_kv_block() kernel blocks; map_kv_cache_to_kernel_blocks(view) re-views a\n"
                             "layer's cache in kernel blocks.")
      .def(py::init([](std::shared_ptr<BlockSizeBackend> backend, std::vector<std::string> layer_names,
                       SpecHolder kv_cache_spec, int64_t kv_cache_group_id, std::optional<int64_t> kernel_block_size) {
             AttentionGroup g;
             g.backend = backend.get();
             g.layer_names = std::move(layer_names);
             g.kv_cache_spec = kv_cache_spec;
             g.kv_cache_group_id = kv_cache_group_id;
             g.kernel_block_size = kernel_block_size;
             return g;
           }),
           py::keep_alive<1, 2>(), py::arg("backend"), py::arg("layer_names"), py::arg("kv_cache_spec"),
           py::arg("kv_cache_group_id") = 0, py::arg("kernel_block_size") = py::none())
      .def_readonly("layer_names", &AttentionGroup::layer_names)
      .def_property_readonly("kv_cache_spec", [](const AttentionGroup& g) { return mut(g.kv_cache_spec); })
      .def_readonly("kv_cache_group_id", &AttentionGroup::kv_cache_group_id)
      .def_readwrite("kernel_block_size", &AttentionGroup::kernel_block_size)
      .def_readonly("kernel_block_stride", &AttentionGroup::kernel_block_stride)
      .def_readonly("kernel_block_table", &AttentionGroup::kernel_block_table)
      .def("configure_kernel_blocks", &AttentionGroup::configure_kernel_blocks, py::arg("kernel_block_size"),
           py::arg("num_ubatches"), py::arg("max_num_reqs"), py::arg("block_table_width"))
      .def("blocks_per_kv_block", &AttentionGroup::blocks_per_kv_block)
      .def("map_to_kernel_block_table",
           [](AttentionGroup& g, py::object block_table, int64_t ubatch_idx) {
             return g.map_to_kernel_block_table(as_tensor(block_table), ubatch_idx);
           },
           py::arg("block_table"), py::arg("ubatch_idx") = 0,
           "Manager block ids [rows, cols] -> a view of kernel_block_table [rows, cols * ratio] with "
           "out[r, c*ratio + j] = block_table[r, c] * ratio + j.")
      .def("map_kv_cache_to_kernel_blocks",
           [](AttentionGroup& g, py::object kv_cache) { return g.map_kv_cache_to_kernel_blocks(as_tensor(kv_cache)); },
           py::arg("kv_cache"))
      .def("map_kv_cache_to_manager_blocks",
           [](const AttentionGroup& g, py::object kv_cache, int64_t num_blocks) {
             return g.map_kv_cache_to_manager_blocks(as_tensor(kv_cache), num_blocks);
           },
           py::arg("kv_cache"), py::arg("num_blocks"));

  m.def("map_kv_caches_to_kernel_blocks",
        [](py::dict kv_caches, py::list attn_groups) {
          return views_to_py(map_kv_caches_to_kernel_blocks(views_from_py(kv_caches), group_ptrs_from_py(attn_groups)));
        },
        py::arg("kv_caches"), py::arg("attn_groups"),
        "vLLM's map_kv_caches_to_kernel_blocks: {layer: view} with every group's views re-viewed in its kernel "
        "block size (AttentionGroup.map_kv_cache_to_kernel_blocks per layer).");
  m.def("prepare_kernel_block_sizes",
        [](const KVCacheConfig& kv_cache_config, py::list attn_groups) {
          std::vector<std::vector<AttentionGroup>> groups;
          for (auto per_group : attn_groups) {
            std::vector<AttentionGroup> v;
            for (auto g : per_group) v.push_back(g.cast<const AttentionGroup&>());
            groups.push_back(std::move(v));
          }
          return prepare_kernel_block_sizes(kv_cache_config, groups);
        },
        py::arg("kv_cache_config"), py::arg("attn_groups"),
        "vLLM's prepare_kernel_block_sizes; attn_groups[gid] = the AttentionGroups of KV cache group gid.");

  py::class_<KVBlockZeroer>(m, "KVBlockZeroer",
                            "vLLM's KVBlockZeroer: zeroes newly allocated KV blocks.\n\n"
                            "KVBlockZeroer(device, attn_groups, kernel_block_sizes, ...) over the groups' cache\n"
                            "views; zero_block_ids(block_ids) zeroes those manager blocks in every layer (so stale\n"
                            "K/V never leaks into a new request); warmup(num_kv_blocks) runs it once ahead.")
      .def(py::init([](py::object device, py::list attn_groups, std::vector<int64_t> kernel_block_sizes,
                       py::dict layer_kv_caches, int64_t num_blocks, py::object runner_only_attn_layers) {
             std::vector<AttentionGroup> groups;
             for (auto g : attn_groups) {
               if (py::isinstance<py::list>(g) || py::isinstance<py::tuple>(g)) {
                 for (auto gg : g) groups.push_back(gg.cast<const AttentionGroup&>());
               } else {
                 groups.push_back(g.cast<const AttentionGroup&>());
               }
             }
             std::set<std::string> runner_only;
             if (!runner_only_attn_layers.is_none())
               for (auto n : runner_only_attn_layers) runner_only.insert(n.cast<std::string>());
             return std::make_unique<KVBlockZeroer>(device_from_py(device), groups, kernel_block_sizes,
                                                    views_from_py(layer_kv_caches), num_blocks,
                                                    runner_only_attn_layers.is_none() ? nullptr : &runner_only);
           }),
           py::arg("device"), py::arg("attn_groups"), py::arg("kernel_block_sizes"), py::arg("layer_kv_caches"),
           py::arg("num_blocks"), py::arg("runner_only_attn_layers") = py::none())
      .def(
          "zero_block_ids",
          [](KVBlockZeroer& z, py::object block_ids) {
            if (py::hasattr(block_ids, "__dlpack__") || py::isinstance<Tensor>(block_ids)) {
              Tensor t = as_tensor(block_ids).contiguous();
              KVATTN_CHECK(t.device().is_cpu() && t.dim() == 1, "zero_block_ids: block_ids must be a 1-D CPU array");
              if (t.dtype() == DType::i32)
                z.zero_block_ids(std::span<const int32_t>(t.data_ptr<int32_t>(), static_cast<size_t>(t.numel())));
              else
                z.zero_block_ids(std::span<const int64_t>(t.data_ptr<int64_t>(), static_cast<size_t>(t.numel())));
              return;
            }
            auto v = block_ids.cast<std::vector<int64_t>>();
            z.zero_block_ids(std::span<const int64_t>(v));
          },
          py::arg("block_ids"), "Zeroes every segment of each listed manager block id (list or int32/int64 array).")
      .def("warmup", &KVBlockZeroer::warmup, py::arg("num_kv_blocks"))
      .def_property_readonly("num_blocks", &KVBlockZeroer::num_blocks)
      .def_property_readonly("segments", [](const KVBlockZeroer& z) {
        py::dict d;
        d["addrs"] = z.segments().addrs;
        d["block_strides"] = z.segments().block_strides;
        d["page_sizes"] = z.segments().page_sizes;
        return d;
      }, "The segment table: absolute byte addresses, block strides and page sizes in 4-byte words.");
}

void bind_worker(py::module_& m) {
  m.def(
      "add_kv_sharing_layers_to_kv_cache_groups",
      [](py::dict shared_kv_cache_layers, py::list kv_cache_groups, py::object runner_only_attn_layers) {
        std::vector<std::pair<std::string, std::string>> shared;
        for (auto item : shared_kv_cache_layers)
          shared.emplace_back(item.first.cast<std::string>(), item.second.cast<std::string>());
        std::vector<KVCacheGroupSpec> groups;
        for (auto g : kv_cache_groups) groups.push_back(g.cast<KVCacheGroupSpec>());
        std::set<std::string> runner_only;
        add_kv_sharing_layers_to_kv_cache_groups(shared, groups,
                                                 runner_only_attn_layers.is_none() ? nullptr : &runner_only);
        for (size_t i = 0; i < groups.size(); ++i) kv_cache_groups[i].cast<KVCacheGroupSpec&>() = groups[i];
        if (!runner_only_attn_layers.is_none())
          for (const auto& n : runner_only) runner_only_attn_layers.attr("add")(n);
      },
      py::arg("shared_kv_cache_layers"), py::arg("kv_cache_groups"), py::arg("runner_only_attn_layers") = py::none(),
      "vLLM's add_kv_sharing_layers_to_kv_cache_groups: {layer: target}; groups (list) and the set are updated in place.");
  m.def("extract_layer_index", &extract_layer_index, py::arg("layer_name"), py::arg("num_attn_module") = 1,
        "vLLM's extract_layer_index: the layer number in a name such as 'model.layers.3.self_attn.attn' (3).");
  m.def(
      "_bind_kv_cache_order",
      [](std::vector<std::string> names, int64_t num_attn_module) {
        // Runs the C++ bind_kv_cache on placeholder tensors tagged by index and returns the
        // runner order as indices into `names` (the Python wrapper binds the caller's objects).
        std::vector<std::pair<std::string, Tensor>> caches;
        KVCacheViews forward_context;
        std::vector<Tensor> owners;
        for (size_t i = 0; i < names.size(); ++i) {
          Tensor t = Tensor::from_vector<int64_t>({static_cast<int64_t>(i)});
          caches.emplace_back(names[i], t);
          forward_context.emplace(names[i], Tensor());
        }
        std::vector<Tensor> runner;
        bind_kv_cache(caches, forward_context, runner, num_attn_module);
        std::vector<int64_t> order;
        for (const Tensor& t : runner) order.push_back(t.to_vector<int64_t>()[0]);
        return order;
      },
      py::arg("names"), py::arg("num_attn_module") = 1);

  py::class_<MemorySnapshot>(m, "MemorySnapshot", "Device memory as seen at startup (the fields request_memory reads).")
      .def(py::init([](int64_t total_memory, int64_t free_memory, std::string device) {
             return MemorySnapshot{total_memory, free_memory, std::move(device)};
           }),
           py::kw_only(), py::arg("total_memory"), py::arg("free_memory"), py::arg("device") = "cuda:0")
      .def_readwrite("total_memory", &MemorySnapshot::total_memory)
      .def_readwrite("free_memory", &MemorySnapshot::free_memory);
  m.def(
      "request_memory",
      [](const MemorySnapshot& init_snapshot, py::object cache_config, int64_t external_weight_memory) {
        // vLLM passes its CacheConfig and reads gpu_memory_utilization from it; a number is that fraction.
        const double utilization = py::hasattr(cache_config, "gpu_memory_utilization")
                                       ? cache_config.attr("gpu_memory_utilization").cast<double>()
                                       : cache_config.cast<double>();
        return request_memory(init_snapshot, utilization, external_weight_memory);
      },
      py::arg("init_snapshot"), py::arg("cache_config"), py::arg("external_weight_memory") = 0,
      "vLLM's request_memory(init_snapshot, cache_config, external_weight_memory=0): bytes to request, "
      "ValueError when free memory does not cover it.  cache_config: an object with gpu_memory_utilization "
      "(vLLM's CacheConfig) or that fraction itself.");
  m.def("restride_blocks_first_kv_cache_to_kv_first_storage",
        [](py::object kv_cache) { return restride_blocks_first_kv_cache_to_kv_first_storage(as_tensor(kv_cache)); },
        py::arg("kv_cache"),
        "A blocks-first layer view re-strided so K and V each occupy one contiguous half of its storage "
        "(the K/V-first layout some backends read); same memory, no copy.");
}

void bind_kv_plans(py::module_& m) {
  m.def("model_preset_names", &model_preset_names, "Names of the model presets plan_kv_cache and `kvattn plan` know.");
  m.def("parse_memory_size", &parse_memory_size, py::arg("text"),
        "Bytes in a size such as '8GiB', '512MiB', '80GB' or '1048576' (ValueError naming the accepted units).");

  py::class_<KVPlan>(m, "KVPlan", "A full KV cache memory plan (what `kvattn plan` prints).")
      .def_readonly("block_size", &KVPlan::block_size)
      .def_readonly("kv_cache_dtype", &KVPlan::kv_cache_dtype)  // a KVCacheDType
      .def_property_readonly("kv_dtype", [](const KVPlan& p) { return dtype_name(p.kv_dtype); })
      .def_readonly("layout", &KVPlan::layout)
      .def_readonly("layout_reason", &KVPlan::layout_reason)
      .def_readonly("layout_candidates", &KVPlan::layout_candidates)
      .def_readonly("config", &KVPlan::config)
      .def_readonly("bytes_per_block", &KVPlan::bytes_per_block)
      .def_readonly("total_bytes", &KVPlan::total_bytes)
      .def_readonly("blocks_per_request", &KVPlan::blocks_per_request)
      .def_readonly("max_concurrency", &KVPlan::max_concurrency)
      .def_property_readonly("num_blocks", [](const KVPlan& p) { return p.config.num_blocks; })
      .def_property_readonly("kv_cache_spec", [](const KVPlan& p) {
        py::dict d;
        for (const auto& l : p.layer_specs) d[py::str(l.layer_name)] = mut(l.spec);
        return d;
      });
  m.def(
      "plan_kv_cache",
      [](const std::string& model, py::object gpu_memory, std::optional<int64_t> block_size,
         py::object kv_cache_dtype, const std::string& layout, std::optional<int64_t> max_model_len,
         int64_t max_num_batched_tokens) {
        PlanOptions o;
        o.block_size = block_size;
        o.kv_cache_dtype = kv_cache_dtype_from_py(kv_cache_dtype);
        o.layout = parse_layout_option(layout);
        o.gpu_memory = py::isinstance<py::str>(gpu_memory) ? parse_memory_size(gpu_memory.cast<std::string>())
                                                           : gpu_memory.cast<int64_t>();
        o.max_model_len = max_model_len;
        o.max_num_batched_tokens = max_num_batched_tokens;
        return plan_kv_cache(load_model_config(model), o);
      },
      py::arg("model"), py::kw_only(), py::arg("gpu_memory"), py::arg("block_size") = py::none(),
      py::arg("kv_cache_dtype") = "auto", py::arg("layout") = "auto", py::arg("max_model_len") = py::none(),
      py::arg("max_num_batched_tokens") = 2048,
      "Plans the KV cache of a preset (model_preset_names()) or a config.json path; gpu_memory in bytes or '80GiB'.");
}

void bind_kv(py::module_& m) {
  bind_layouts(m);
  bind_specs(m);
  bind_config(m);
  bind_kernel_blocks(m);
  bind_worker(m);
  bind_kv_plans(m);
}

}  // namespace

KVATTN_PY_BINDER(bind_kv);

}  // namespace kvattn::python
