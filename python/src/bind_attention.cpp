// Python bindings of attention/: the native backend with the contract of vLLM's FlashInfer
// backend — traits (FlashInferBackend), the per-step planner (FlashInferMetadataBuilder.build)
// and the per-layer forward (FlashInferImpl.forward / do_kv_cache_update) — plus the
// per-layer state they read (AttentionLayer) and the configuration (BackendConfig).
//
// Lifetimes: a BackendConfig owns the registry of layers (vLLM's static forward context) that
// builders read; register_layer keeps the layer alive as long as the config, and a builder
// keeps its config alive.  Metadata returned by build() belongs to the builder and is valid
// until its next build() (as in vLLM); it keeps the builder alive.
#include <pybind11/stl.h>

#include "batch_py.h"
#include "bindings.h"
#include "kvattn/attention/attention_impl.h"
#include "kvattn/attention/native_backend.h"

namespace py = pybind11;

namespace kvattn::python {
namespace {

struct PyBackendConfig {
  BackendConfig cfg;
  std::unique_ptr<LayerRegistry> registry = std::make_unique<LayerRegistry>();
  PyBackendConfig() { cfg.layers = registry.get(); }
};

AttentionType attn_type_from(const std::string& s) {
  for (AttentionType t : {AttentionType::DECODER, AttentionType::ENCODER, AttentionType::ENCODER_ONLY,
                          AttentionType::ENCODER_DECODER})
    if (s == attention_type_name(t)) return t;
  throw InvalidArgument("attn_type must be one of 'decoder', 'encoder', 'encoder_only', 'encoder_decoder', got '" +
                        s + "'");
}

const char* prefill_kind(const FlashInferMetadata& m) {
  if (std::holds_alternative<FIPrefill>(m.prefill)) return std::get<FIPrefill>(m.prefill).dcp ? "dcp" : "native";
  if (std::holds_alternative<TRTLLMPrefill>(m.prefill)) return "trtllm";
  return nullptr;
}

const char* decode_kind(const FlashInferMetadata& m) {
  if (std::holds_alternative<FIDecode>(m.decode)) return "native";
  if (auto* d = std::get_if<FlashInferTrtllmAPIDecode>(&m.decode)) return decode_kernel_name(d->kernel);
  return nullptr;
}

void bind_attention(py::module_& m) {
  py::class_<PyBackendConfig>(m, "BackendConfig",
                              "The slice of vLLM's VllmConfig the attention backend reads (flattened), and the "
                              "registry of attention layers (vLLM's static forward context).\n\n"
                              "BackendConfig(num_attention_heads=, num_kv_heads=, head_size=, max_model_len=,\n"
                              "max_num_seqs=, max_num_batched_tokens=, model_dtype=, kv_cache_layout=, device=,\n"
                              "capability=, ...) (keywords only; see __init__).\n"
                              "register_layer(layer) adds an AttentionLayer before make_builder reads the layers.")
      .def(py::init([](py::object device, std::optional<std::pair<int, int>> capability, py::object model_dtype,
                       int64_t num_attention_heads, int64_t num_kv_heads, int64_t head_size, int64_t max_model_len,
                       int64_t max_num_seqs, int64_t max_num_batched_tokens, py::object cache_dtype,
                       std::optional<std::string> kv_cache_layout, std::optional<int64_t> num_speculative_tokens,
                       bool parallel_drafting, int64_t decode_context_parallel_size, int64_t dcp_rank,
                       int64_t cp_kv_cache_interleave_size, bool cudagraph_decode_full,
                       std::optional<bool> use_trtllm_attention, bool disable_flashinfer_q_quantization,
                       int64_t flashinfer_workspace_buffer_size, int64_t num_sms) {
             auto p = std::make_unique<PyBackendConfig>();
             BackendConfig& c = p->cfg;
             c.platform.device = Device::parse(std::string(py::str(device)));
             if (capability) c.platform.capability = DeviceCapability{capability->first, capability->second};
             c.model_dtype = dtype_from_py(model_dtype);
             c.num_attention_heads = num_attention_heads;
             c.num_kv_heads = num_kv_heads;
             c.head_size = head_size;
             c.max_model_len = max_model_len;
             c.max_num_seqs = max_num_seqs;
             c.max_num_batched_tokens = max_num_batched_tokens;
             c.cache_dtype = kv_cache_dtype_from_py(cache_dtype);
             if (kv_cache_layout) c.cache_config.kv_cache_layout = layout_from_name(*kv_cache_layout);
             c.num_speculative_tokens = num_speculative_tokens;
             c.parallel_drafting = parallel_drafting;
             c.decode_context_parallel_size = decode_context_parallel_size;
             c.dcp_rank = dcp_rank;
             c.cp_kv_cache_interleave_size = cp_kv_cache_interleave_size;
             c.cudagraph_decode_full = cudagraph_decode_full;
             c.attention_config.use_trtllm_attention = use_trtllm_attention;
             c.attention_config.disable_flashinfer_q_quantization = disable_flashinfer_q_quantization;
             c.flashinfer_workspace_buffer_size = flashinfer_workspace_buffer_size;
             c.num_sms = num_sms;
             c.validate();
             return p;
           }),
           py::kw_only(), py::arg("device") = "cpu", py::arg("capability") = py::none(),
           py::arg("model_dtype") = "bfloat16", py::arg("num_attention_heads"), py::arg("num_kv_heads"),
           py::arg("head_size"), py::arg("max_model_len"), py::arg("max_num_seqs"),
           py::arg("max_num_batched_tokens"), py::arg("cache_dtype") = "auto", py::arg("kv_cache_layout") = "NHD",
           py::arg("num_speculative_tokens") = py::none(), py::arg("parallel_drafting") = false,
           py::arg("decode_context_parallel_size") = 1, py::arg("dcp_rank") = 0,
           py::arg("cp_kv_cache_interleave_size") = 1, py::arg("cudagraph_decode_full") = false,
           py::arg("use_trtllm_attention") = py::none(), py::arg("disable_flashinfer_q_quantization") = false,
           py::arg("flashinfer_workspace_buffer_size") = 0, py::arg("num_sms") = 132,
           R"doc(Backend configuration.  device: "cpu" or "cuda:N"; capability: the CUDA compute
capability as (major, minor) — (9, 0) on H200 selects the XQA decode path as vLLM does; None
on CPU.  kv_cache_layout: the resolved layout name (NHD = LBNHC, HND = LBHNC).)doc")
      .def(
          "register_layer", [](PyBackendConfig& c, AttentionLayer& layer) { c.registry->add(&layer); },
          py::keep_alive<1, 2>(), py::arg("layer"),
          "Adds an AttentionLayer to the forward context builders read (before make_builder).")
      .def_property_readonly("layer_names", [](const PyBackendConfig& c) { return c.registry->names(); })
      .def_property_readonly("device", [](const PyBackendConfig& c) { return c.cfg.platform.device.str(); })
      .def_property_readonly("platform", [](const PyBackendConfig& c) { return c.cfg.platform.str(); });

  py::class_<AttentionMetadata>(m, "AttentionMetadata", "Base of the per-step metadata a builder returns.")
      .def_property_readonly("backend_name", &AttentionMetadata::backend_name);
  py::class_<FlashInferMetadata, AttentionMetadata>(m, "FlashInferMetadata",
                                                    R"doc(What FlashInferMetadataBuilder.build planned for this step.

Counts (num_decodes, num_decode_tokens, num_prefills, num_prefill_tokens, num_actual_tokens),
the chosen paths (decode_path, prefill_path, use_cascade), causal, kv_cache_layout and the
slot_mapping.  Pass it unchanged to FlashInferImpl.forward for every layer of the step.)doc")
      .def_readonly("num_actual_tokens", &FlashInferMetadata::num_actual_tokens)
      .def_readonly("num_decodes", &FlashInferMetadata::num_decodes)
      .def_readonly("num_decode_tokens", &FlashInferMetadata::num_decode_tokens)
      .def_readonly("num_prefills", &FlashInferMetadata::num_prefills)
      .def_readonly("num_prefill_tokens", &FlashInferMetadata::num_prefill_tokens)
      .def_readonly("causal", &FlashInferMetadata::causal)
      .def_readonly("use_cascade", &FlashInferMetadata::use_cascade)
      .def_readonly("kv_cache_layout", &FlashInferMetadata::kv_cache_layout)
      .def_readonly("slot_mapping", &FlashInferMetadata::slot_mapping)
      .def_property_readonly("prefill_path", &prefill_kind,
                             "'native', 'dcp', 'trtllm' or None (no prefill tokens / cascade).")
      .def_property_readonly("decode_path", &decode_kind,
                             "'native', 'xqa', 'trtllm-gen' or None (no decode tokens / cascade).");

  py::class_<AttentionMetadataBuilder>(m, "AttentionMetadataBuilder", R"doc(vLLM's AttentionMetadataBuilder: plans each step for a KV cache group's layers.

build(common_prefix_len, common_attn_metadata, fast_build=False) -> the step's metadata, passed
to every layer's forward.  reorder_batch_threshold: the query length up to which a request
counts as a decode (reorder the batch with reorder_batch_to_split_decodes_and_prefills first).)doc")
      .def_property_readonly("reorder_batch_threshold", &AttentionMetadataBuilder::reorder_batch_threshold)
      .def_property_readonly("layer_names", &AttentionMetadataBuilder::layer_names)
      .def(
          "build",
          [](AttentionMetadataBuilder& b, int64_t common_prefix_len, py::object common_attn_metadata,
             bool fast_build) -> const AttentionMetadata& {
            MMPrefixRanges ranges;
            CommonAttentionMetadata cm = cm_from_py(common_attn_metadata, ranges);
            return b.build(common_prefix_len, cm, fast_build);
          },
          py::return_value_policy::reference_internal, py::arg("common_prefix_len"),
          py::arg("common_attn_metadata"), py::arg("fast_build") = false,
          "Plans this step from a CommonAttentionMetadata; the result belongs to the builder and is "
          "valid until its next build().");
  py::class_<FlashInferMetadataBuilder, AttentionMetadataBuilder>(m, "FlashInferMetadataBuilder",
                                                                   R"doc(vLLM's FlashInferMetadataBuilder on kvattn's kernels (see AttentionMetadataBuilder).

build() splits the batch into decodes and prefills, computes the paged-KV description
(paged_kv_indptr / indices / last_page_len, as PagedKVMetadataBuilder does), decides cascade and
the decode kernel (decode_kernel: None for the native path, 'xqa' or 'trtllm-gen'), and plans the
kernels once for all the group's layers.  Its buffers are sized at construction from the config
(max_num_seqs, max_model_len, max_num_batched_tokens); build() allocates nothing.  The metadata
it returns is valid until its next build().)doc")
      .def_property_readonly("kv_cache_layout", &FlashInferMetadataBuilder::kv_cache_layout)
      .def_property_readonly("decode_kernel", [](const FlashInferMetadataBuilder& b) -> py::object {
        auto k = b.decode_kernel();
        return k ? py::str(decode_kernel_name(*k)) : py::object(py::none());
      })
      .def_property_readonly("use_trtllm_decode_attention", &FlashInferMetadataBuilder::use_trtllm_decode_attention)
      .def_property_readonly("q_data_type_prefill",
                             [](const FlashInferMetadataBuilder& b) { return dtype_name(b.q_data_type_prefill()); })
      .def_property_readonly("q_data_type_decode",
                             [](const FlashInferMetadataBuilder& b) { return dtype_name(b.q_data_type_decode()); });

  py::class_<AttentionImpl, std::shared_ptr<AttentionImpl>>(m, "AttentionImpl", R"doc(vLLM's AttentionImpl: one layer's attention computation.

Made by FlashInferBackend.make_impl(config, num_heads=, head_size=, scale=, num_kv_heads=, ...).
Per step: do_kv_cache_update(layer, key, value, kv_cache, slot_mapping) writes this step's K/V
into the paged cache, then forward(layer, query, key, value, kv_cache, attn_metadata, output)
computes attention into output, using the metadata the builder planned for the step.
process_weights_after_loading(act_dtype) fixes the query dtype once the model dtype is known.)doc")
      .def_property_readonly("num_heads", &AttentionImpl::num_heads)
      .def_property_readonly("num_kv_heads", &AttentionImpl::num_kv_heads)
      .def_property_readonly("head_size", &AttentionImpl::head_size)
      .def_property_readonly("scale", &AttentionImpl::scale)
      .def_property_readonly("window_left", &AttentionImpl::window_left)
      .def_property_readonly("logits_soft_cap", &AttentionImpl::logits_soft_cap)
      .def_property_readonly("has_sinks", &AttentionImpl::has_sinks)
      .def("process_weights_after_loading",
           [](AttentionImpl& i, py::object act_dtype) { i.process_weights_after_loading(dtype_from_py(act_dtype)); },
           py::arg("act_dtype"))
      .def(
          "forward",
          [](AttentionImpl& impl, const AttentionLayer& layer, py::object query, py::object key, py::object value,
             py::object kv_cache, const AttentionMetadata* attn_metadata, py::object output, py::object output_scale,
             py::object output_block_scale) {
            Tensor q = as_tensor(query), k = optional_tensor(key), v = optional_tensor(value);
            Tensor cache = as_tensor(kv_cache), out = as_tensor(output);
            Tensor os = optional_tensor(output_scale), obs = optional_tensor(output_block_scale);
            py::gil_scoped_release release;
            impl.forward(layer, q, k, v, cache, attn_metadata, out, os, obs);
          },
          py::arg("layer"), py::arg("query"), py::arg("key"), py::arg("value"), py::arg("kv_cache"),
          py::arg("attn_metadata"), py::arg("output"), py::arg("output_scale") = py::none(),
          py::arg("output_block_scale") = py::none(),
          R"doc(vLLM's AttentionImpl.forward: attention of this step's tokens, written into output.

query [T, num_heads, head_size]; key/value [T, num_kv_heads, head_size] (None for a KV-sharing
layer); kv_cache the layer's [num_blocks, num_kv_heads, block_size, 2 * head_size] view;
attn_metadata from build() (None = profiling run: nothing computed); output [T, num_heads,
head_size].  The KV-cache write is separate (do_kv_cache_update), as in vLLM's FlashInfer.)doc")
      .def(
          "do_kv_cache_update",
          [](AttentionImpl& impl, const AttentionLayer& layer, py::object key, py::object value, py::object kv_cache,
             py::object slot_mapping) {
            Tensor k = as_tensor(key), v = as_tensor(value), cache = as_tensor(kv_cache), s = as_tensor(slot_mapping);
            py::gil_scoped_release release;
            impl.do_kv_cache_update(layer, k, v, cache, s);
          },
          py::arg("layer"), py::arg("key"), py::arg("value"), py::arg("kv_cache"), py::arg("slot_mapping"),
          "vLLM's do_kv_cache_update: reshape_and_cache_flash of key/value into the layer's cache.");
  py::class_<FlashInferImpl, AttentionImpl, std::shared_ptr<FlashInferImpl>>(m, "FlashInferImpl",
                                                                             R"doc(vLLM's FlashInferImpl on kvattn's kernels (see AttentionImpl).

It runs the paths FlashInferMetadataBuilder.build chose per step: native paged prefill and
decode, the trtllm-style block-table paths (XQA / trtllm-gen decode on capability (9, 0) /
(10, x) configurations), cascade over a shared prefix, and DCP (one rank's shard, combined by
LSE).  Paths kvattn has no kernel for (NVFP4 KV, fused output quantisation) raise
NotImplementedError with the reason.)doc");

  py::class_<AttentionLayer>(m, "AttentionLayer",
                             R"doc(vLLM's Attention layer state the impl reads: name, impl and q/k/v scales.

AttentionLayer(name, impl, device="cpu"); register it with BackendConfig.register_layer(layer)
before FlashInferBackend.make_builder reads the layers' parameters.  set_scales(q_scale,
k_scale, v_scale) sets the fp8 scales (floats) the KV write and forward use.)doc")
      .def(py::init([](std::string name, std::shared_ptr<AttentionImpl> impl, py::object device) {
             return AttentionLayer::make(std::move(name), std::move(impl), Device::parse(std::string(py::str(device))));
           }),
           py::arg("name"), py::arg("impl"), py::arg("device") = "cpu")
      .def_readonly("name", &AttentionLayer::name)
      .def_readonly("impl", &AttentionLayer::impl)
      .def_readonly("_q_scale_float", &AttentionLayer::q_scale_float)
      .def_readonly("_k_scale_float", &AttentionLayer::k_scale_float)
      .def_readonly("_v_scale_float", &AttentionLayer::v_scale_float)
      .def("set_scales", &AttentionLayer::set_scales, py::arg("q_scale"), py::arg("k_scale"), py::arg("v_scale"));

  py::class_<FlashInferBackend, std::shared_ptr<FlashInferBackend>>(
      m, "FlashInferBackend", R"doc(vLLM's FlashInferBackend traits and factories, running on kvattn's kernels.

Traits: get_name() ("FLASHINFER"), supported_kv_cache_dtypes(), get_supported_head_sizes(),
get_supported_kernel_block_sizes(config), supported_kv_cache_layouts(config),
forward_includes_kv_cache_update() (False: the KV write is a separate call), and
validate_configuration(config, head_size=, dtype=, ...) -> the list of reasons a configuration
cannot run (empty: supported).  Factories: make_impl(config, num_heads=, head_size=, scale=,
num_kv_heads=, ...) -> FlashInferImpl; make_builder(kv_cache_spec, layer_names, config) ->
FlashInferMetadataBuilder (register the AttentionLayers with the config first).)doc")
      .def(py::init([] { return std::make_shared<FlashInferBackend>(); }))
      .def("get_name", &FlashInferBackend::get_name)
      .def("supported_kv_cache_dtypes",
           [](const FlashInferBackend& b) {
             std::vector<std::string> names;  // vLLM's list of CacheDType names
             for (KVCacheDType t : b.supported_kv_cache_dtypes()) names.emplace_back(kv_cache_dtype_name(t));
             return names;
           })
      .def("get_supported_head_sizes", &FlashInferBackend::get_supported_head_sizes)
      .def("get_supported_kernel_block_sizes",
           [](const FlashInferBackend& b, const PyBackendConfig& c) {
             py::list l;
             for (const auto& s : b.get_supported_kernel_block_sizes(nullptr, c.cfg)) {
               if (auto* i = std::get_if<int64_t>(&s)) l.append(*i);
               else if (auto* mo = std::get_if<MultipleOf>(&s)) l.append(py::cast(*mo));
             }
             return l;
           },
           py::arg("config"))
      .def("supported_kv_cache_layouts",
           [](const FlashInferBackend& b, const PyBackendConfig& c) { return b.supported_kv_cache_layouts(c.cfg); },
           py::arg("config"))
      .def("forward_includes_kv_cache_update", &FlashInferBackend::forward_includes_kv_cache_update)
      .def(
          "validate_configuration",
          [](const FlashInferBackend& b, const PyBackendConfig& c, int64_t head_size, py::object dtype,
             py::object kv_cache_dtype, std::optional<int64_t> block_size, bool has_sink, bool has_sliding_window,
             bool use_mm_prefix, std::string attn_type) {
            AttentionSelectorConfig s;
            s.head_size = head_size;
            s.dtype = dtype_from_py(dtype);
            s.kv_cache_dtype = kv_cache_dtype_from_py(kv_cache_dtype);
            s.block_size = block_size;
            s.has_sink = has_sink;
            s.has_sliding_window = has_sliding_window;
            s.use_mm_prefix = use_mm_prefix;
            s.attn_type = attn_type_from(attn_type);
            s.use_dcp = c.cfg.decode_context_parallel_size > 1;
            return b.validate_configuration(s, c.cfg);
          },
          py::arg("config"), py::kw_only(), py::arg("head_size"), py::arg("dtype"),
          py::arg("kv_cache_dtype") = "auto", py::arg("block_size") = py::none(), py::arg("has_sink") = false,
          py::arg("has_sliding_window") = false, py::arg("use_mm_prefix") = false, py::arg("attn_type") = "decoder",
          "Every reason this configuration cannot run on the backend (empty list = supported).")
      .def(
          "make_builder",
          [](const FlashInferBackend& b, std::shared_ptr<AttentionSpec> kv_cache_spec,
             std::vector<std::string> layer_names, const PyBackendConfig& config) {
            return b.make_builder(kv_cache_spec, std::move(layer_names), config.cfg);
          },
          py::keep_alive<0, 4>(), py::arg("kv_cache_spec"), py::arg("layer_names"), py::arg("vllm_config"),
          "vLLM's get_builder_cls()(kv_cache_spec, layer_names, vllm_config): register the layers first.")
      .def(
          "make_impl",
          [](const FlashInferBackend& b, const PyBackendConfig& config, int64_t num_heads, int64_t head_size,
             double scale, int64_t num_kv_heads, std::optional<std::vector<float>> alibi_slopes,
             std::optional<int64_t> sliding_window, py::object kv_cache_dtype,
             std::optional<double> logits_soft_cap, std::string attn_type,
             std::optional<std::string> kv_sharing_target_layer_name, py::object sinks) {
            AttentionImplParams p;
            p.num_heads = num_heads;
            p.head_size = head_size;
            p.scale = scale;
            p.num_kv_heads = num_kv_heads;
            p.alibi_slopes = std::move(alibi_slopes);
            p.sliding_window = sliding_window;
            p.kv_cache_dtype = kv_cache_dtype_from_py(kv_cache_dtype);
            p.logits_soft_cap = logits_soft_cap;
            p.attn_type = attn_type_from(attn_type);
            p.kv_sharing_target_layer_name = std::move(kv_sharing_target_layer_name);
            p.sinks = optional_tensor(sinks);
            return b.make_impl(p, config.cfg);
          },
          py::arg("vllm_config"), py::kw_only(), py::arg("num_heads"), py::arg("head_size"), py::arg("scale"),
          py::arg("num_kv_heads"), py::arg("alibi_slopes") = py::none(), py::arg("sliding_window") = py::none(),
          py::arg("kv_cache_dtype") = "auto", py::arg("logits_soft_cap") = py::none(),
          py::arg("attn_type") = "decoder", py::arg("kv_sharing_target_layer_name") = py::none(),
          py::arg("sinks") = py::none(),
          "vLLM's FlashInferImpl(num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window, "
          "kv_cache_dtype, logits_soft_cap, attn_type, kv_sharing_target_layer_name, sinks).");
}

}  // namespace

KVATTN_PY_BINDER(bind_attention);

}  // namespace kvattn::python
