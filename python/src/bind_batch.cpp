// Python bindings of batch/: per-step batch preparation under vLLM's names.
//
// CommonAttentionMetadata is a Python dataclass (python/kvattn/metadata.py) holding the
// caller's own arrays; functions here read it by attribute (cm_from_py) into a C++ aggregate of
// zero-copy views.  Functions that produce a tensor return a kvattn Tensor; the Python layer
// hands it back in the caller's framework (python/kvattn/_convert.py).
#include <pybind11/stl.h>

#include "batch_py.h"
#include "bindings.h"
#include "kvattn/batch/batch.h"

namespace py = pybind11;

namespace kvattn::python {

MMPrefixRanges mm_ranges_from_py(const py::handle& obj) {
  MMPrefixRanges r;
  if (obj.is_none()) return r;
  auto d = py::reinterpret_borrow<py::dict>(obj);
  for (auto item : d) {
    const auto row = item.first.cast<int64_t>();
    KVATTN_CHECK(row >= 0, "mm_req_doc_ranges: request row {} is negative", row);
    if (static_cast<int64_t>(r.per_req.size()) <= row) r.per_req.resize(static_cast<size_t>(row + 1));
    for (auto range : item.second) {
      auto t = range.cast<std::pair<int64_t, int64_t>>();
      r.per_req[static_cast<size_t>(row)].push_back(t);
    }
  }
  return r;
}

py::dict mm_ranges_to_py(const MMPrefixRanges& r) {
  py::dict d;
  for (size_t i = 0; i < r.per_req.size(); ++i) {
    if (r.per_req[i].empty()) continue;
    py::list l;
    for (const auto& [s, e] : r.per_req[i]) l.append(py::make_tuple(s, e));
    d[py::int_(i)] = l;
  }
  return d;
}

namespace {
Tensor attr_tensor(const py::handle& obj, const char* name) {
  if (!py::hasattr(obj, name)) return Tensor();
  return optional_tensor(py::reinterpret_borrow<py::object>(obj.attr(name)));
}
}  // namespace

CommonAttentionMetadata cm_from_py(const py::handle& obj, MMPrefixRanges& ranges_storage) {
  CommonAttentionMetadata cm;
  cm.query_start_loc = attr_tensor(obj, "query_start_loc");
  cm.query_start_loc_cpu = attr_tensor(obj, "query_start_loc_cpu");
  cm.seq_lens = attr_tensor(obj, "seq_lens");
  cm.num_reqs = obj.attr("num_reqs").cast<int64_t>();
  cm.num_actual_tokens = obj.attr("num_actual_tokens").cast<int64_t>();
  cm.max_query_len = obj.attr("max_query_len").cast<int64_t>();
  cm.max_seq_len = obj.attr("max_seq_len").cast<int64_t>();
  cm.block_table_tensor = attr_tensor(obj, "block_table_tensor");
  cm.slot_mapping = attr_tensor(obj, "slot_mapping");
  if (py::hasattr(obj, "causal")) {
    py::object c = obj.attr("causal");
    if (!py::isinstance<py::bool_>(c))
      throw Unsupported("CommonAttentionMetadata.causal: kvattn supports a scalar bool only, not a per-request tensor");
    cm.causal = c.cast<bool>();
  }
  cm.seq_lens_cpu_upper_bound = attr_tensor(obj, "seq_lens_cpu_upper_bound");
  cm.is_prefilling = attr_tensor(obj, "is_prefilling");
  cm.dcp_local_seq_lens = attr_tensor(obj, "dcp_local_seq_lens");
  cm.dcp_local_seq_lens_cpu = attr_tensor(obj, "dcp_local_seq_lens_cpu");
  cm.positions = attr_tensor(obj, "positions");
  cm.encoder_seq_lens = attr_tensor(obj, "encoder_seq_lens");
  cm.encoder_seq_lens_cpu = attr_tensor(obj, "encoder_seq_lens_cpu");
  if (py::hasattr(obj, "mm_req_doc_ranges") && !obj.attr("mm_req_doc_ranges").is_none()) {
    ranges_storage = mm_ranges_from_py(obj.attr("mm_req_doc_ranges"));
    cm.mm_req_doc_ranges = &ranges_storage;
  }
  return cm;
}

py::dict cm_to_fields(const CommonAttentionMetadata& cm) {
  py::dict d;
  auto put = [&](const char* name, const Tensor& t) { d[name] = t.defined() ? py::cast(t) : py::none(); };
  put("query_start_loc", cm.query_start_loc);
  put("query_start_loc_cpu", cm.query_start_loc_cpu);
  put("seq_lens", cm.seq_lens);
  d["num_reqs"] = cm.num_reqs;
  d["num_actual_tokens"] = cm.num_actual_tokens;
  d["max_query_len"] = cm.max_query_len;
  d["max_seq_len"] = cm.max_seq_len;
  put("block_table_tensor", cm.block_table_tensor);
  put("slot_mapping", cm.slot_mapping);
  d["causal"] = cm.causal;
  put("seq_lens_cpu_upper_bound", cm.seq_lens_cpu_upper_bound);
  put("is_prefilling", cm.is_prefilling);
  put("dcp_local_seq_lens", cm.dcp_local_seq_lens);
  put("dcp_local_seq_lens_cpu", cm.dcp_local_seq_lens_cpu);
  put("positions", cm.positions);
  put("encoder_seq_lens", cm.encoder_seq_lens);
  put("encoder_seq_lens_cpu", cm.encoder_seq_lens_cpu);
  d["mm_req_doc_ranges"] = cm.mm_req_doc_ranges ? py::object(mm_ranges_to_py(*cm.mm_req_doc_ranges)) : py::none();
  return d;
}

namespace {

std::vector<MultiModalFeature> features_from_py(const py::handle& seq) {
  std::vector<MultiModalFeature> out;
  for (auto f : seq) out.push_back(f.cast<MultiModalFeature>());
  return out;
}

void bind_batch(py::module_& m) {
  m.attr("PAD_SLOT_ID") = PAD_SLOT_ID;
  m.attr("NULL_BLOCK_ID") = NULL_BLOCK_ID;

  // ---- CommonAttentionMetadata helpers (the dataclass is Python) -------------------------
  m.def(
      "_validate_common_attn_metadata",
      [](py::object cm) {
        MMPrefixRanges r;
        cm_from_py(cm, r).validate();
      },
      py::arg("common_attn_metadata"));

  // ---- splits -------------------------------------------------------------------------------
  m.def(
      "split_decodes_and_prefills",
      [](py::object common_attn_metadata, int64_t decode_threshold, bool require_uniform,
         bool treat_short_extends_as_decodes) {
        MMPrefixRanges r;
        auto s = split_decodes_and_prefills(cm_from_py(common_attn_metadata, r), decode_threshold,
                                            require_uniform, treat_short_extends_as_decodes);
        return py::make_tuple(s.num_decodes, s.num_prefills, s.num_decode_tokens, s.num_prefill_tokens);
      },
      py::arg("common_attn_metadata"), py::arg("decode_threshold") = 1, py::arg("require_uniform") = false,
      py::arg("treat_short_extends_as_decodes") = true,
      R"doc(vLLM's split_decodes_and_prefills on a batch ordered decode -> extend -> prefill.

Returns (num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens).  Reads
query_start_loc_cpu (and is_prefilling when treat_short_extends_as_decodes is False).)doc");
  m.def(
      "split_decodes_prefills_and_extends",
      [](py::object common_attn_metadata, int64_t decode_threshold) {
        MMPrefixRanges r;
        auto s = split_decodes_prefills_and_extends(cm_from_py(common_attn_metadata, r), decode_threshold);
        return py::make_tuple(s.num_decodes, s.num_extends, s.num_prefills, s.num_decode_tokens,
                              s.num_extend_tokens, s.num_prefill_tokens);
      },
      py::arg("common_attn_metadata"), py::arg("decode_threshold") = 1,
      "vLLM's split_decodes_prefills_and_extends -> (num_decodes, num_extends, num_prefills, "
      "num_decode_tokens, num_extend_tokens, num_prefill_tokens); reads seq_lens_cpu_upper_bound.");
  m.def(
      "split_prefill_chunks",
      [](py::object seq_lens_cpu, int64_t workspace_size, int64_t request_offset) {
        return split_prefill_chunks(as_int32_tensor(seq_lens_cpu, "seq_lens_cpu"), workspace_size, request_offset);
      },
      py::arg("seq_lens_cpu"), py::arg("workspace_size"), py::arg("request_offset") = 0,
      "vLLM's split_prefill_chunks: greedy [(start, end)) request chunks whose seq_lens sum to at most "
      "workspace_size, shifted by request_offset.  seq_lens_cpu: a CPU integer tensor (int32 read in "
      "place; int64, e.g. torch.tensor([...]), converted).");
  m.def("is_uniform_query_len", &is_uniform_query_len, py::arg("num_reqs"), py::arg("num_tokens"),
        py::arg("max_query_len"), "num_reqs > 0 and every request has max_query_len tokens.");
  m.def("get_uniform_decode_token_count", &get_uniform_decode_token_count, py::arg("num_reqs"),
        py::arg("num_tokens"), py::arg("max_query_len"), py::arg("decode_graph_eligible"),
        "max_query_len when decode_graph_eligible and the batch is uniform, else None.");
  m.def(
      "reshape_query_for_spec_decode",
      [](py::object query, int64_t batch_size) { return reshape_query_for_spec_decode(as_tensor(query), batch_size); },
      py::arg("query"), py::arg("batch_size"),
      "vLLM's reshape_query_for_spec_decode: [T, H, D] -> [batch_size, T / batch_size, H, D] view.");
  m.def(
      "reshape_attn_output_for_spec_decode",
      [](py::object attn_output) { return reshape_attn_output_for_spec_decode(as_tensor(attn_output)); },
      py::arg("attn_output"),
      "vLLM's reshape_attn_output_for_spec_decode: [B, S, H, D] -> [B * S, H, D] view; 3-D unchanged.");

  // ---- slot mapping, DCP ----------------------------------------------------------------------
  m.def(
      "compute_slot_mapping",
      [](py::object query_start_loc_cpu, py::object positions, py::object block_table, int64_t block_size,
         int64_t blocks_per_kv_block, int64_t dcp_world_size, int64_t dcp_rank,
         int64_t cp_kv_cache_interleave_size, int64_t num_blocks, int64_t pad_to) {
        SlotMappingParams p;
        p.block_size = block_size;
        p.blocks_per_kv_block = blocks_per_kv_block;
        p.dcp_world_size = dcp_world_size;
        p.dcp_rank = dcp_rank;
        p.cp_kv_cache_interleave_size = cp_kv_cache_interleave_size;
        p.num_blocks = num_blocks;
        return compute_slot_mapping(as_tensor(query_start_loc_cpu), as_tensor(positions), as_tensor(block_table), p,
                                    pad_to);
      },
      py::arg("query_start_loc_cpu"), py::arg("positions"), py::arg("block_table"), py::kw_only(),
      py::arg("block_size"), py::arg("blocks_per_kv_block") = 1, py::arg("dcp_world_size") = 1,
      py::arg("dcp_rank") = 0, py::arg("cp_kv_cache_interleave_size") = 1, py::arg("num_blocks") = 0,
      py::arg("pad_to") = -1,
      R"doc(Slot of each scheduled token (vLLM's _compute_slot_mapping_kernel), int64 [num_tokens or pad_to].

query_start_loc_cpu [num_reqs + 1] int32, positions [num_tokens] int64, block_table
[num_reqs, max_blocks] int32 (kernel-block ids).  Tokens stored on another DCP rank and padding
get PAD_SLOT_ID (-1).)doc");
  m.def(
      "get_dcp_local_seq_lens",
      [](py::object seq_lens, int64_t dcp_size, py::object dcp_rank, int64_t cp_kv_cache_interleave_size) {
        Tensor s = as_tensor(seq_lens);
        if (dcp_rank.is_none()) return get_dcp_local_seq_lens(s, dcp_size, std::nullopt, cp_kv_cache_interleave_size);
        if (py::isinstance<py::int_>(dcp_rank))
          return get_dcp_local_seq_lens(s, dcp_size, dcp_rank.cast<int64_t>(), cp_kv_cache_interleave_size);
        return get_dcp_local_seq_lens(s, dcp_size, as_tensor(dcp_rank), cp_kv_cache_interleave_size);
      },
      py::arg("seq_lens"), py::arg("dcp_size") = 1, py::arg("dcp_rank") = py::none(),
      py::arg("cp_kv_cache_interleave_size") = 1,
      R"doc(vLLM's get_dcp_local_seq_lens: tokens of each sequence stored on a DCP rank (int32).

dcp_rank None -> shape [..., dcp_size] (every rank); an int -> same shape as seq_lens; a
one-element tensor -> same shape as seq_lens.)doc");

  // ---- Mamba --------------------------------------------------------------------------------
  m.def(
      "_mamba_get_block_table_tensor",
      [](py::object block_table, py::object seq_lens, int64_t block_size, int64_t num_speculative_blocks,
         const std::string& mamba_cache_mode) {
        // seq_lens: any integer dtype, as the seed's CPU path computes on it directly.
        return mamba_get_block_table_tensor(as_tensor(block_table), as_int32_tensor(seq_lens, "seq_lens"),
                                            MambaBlockTableSpec{block_size, num_speculative_blocks},
                                            mamba_cache_mode);
      },
      py::arg("block_table"), py::arg("seq_lens"), py::arg("block_size"), py::arg("num_speculative_blocks"),
      py::arg("mamba_cache_mode"));

  // ---- multimodal PrefixLM ranges -----------------------------------------------------------
  py::class_<PlaceholderRange>(m, "PlaceholderRange",
                               "vLLM's PlaceholderRange: `length` placeholder tokens from prompt position "
                               "`offset`; is_embed marks the ones carrying embeddings.")
      .def(py::init([](int64_t offset, int64_t length, py::object is_embed) {
             PlaceholderRange p{offset, length, std::nullopt};
             if (!is_embed.is_none()) {
               std::vector<uint8_t> v;
               for (auto b : is_embed) v.push_back(py::bool_(py::reinterpret_borrow<py::object>(b)) ? 1 : 0);
               p.is_embed = std::move(v);
             }
             return p;
           }),
           py::arg("offset"), py::arg("length"), py::arg("is_embed") = py::none())
      .def_readwrite("offset", &PlaceholderRange::offset)
      .def_readwrite("length", &PlaceholderRange::length)
      .def("extract_embeds_range", &PlaceholderRange::extract_embeds_range)
      .def("__repr__", [](const PlaceholderRange& p) {
        return "PlaceholderRange(offset=" + std::to_string(p.offset) + ", length=" + std::to_string(p.length) + ")";
      });
  py::class_<MultiModalFeature>(m, "MultiModalFeatureSpec",
                                "vLLM's MultiModalFeatureSpec reduced to what the range helpers read.")
      .def(py::init([](std::string modality, PlaceholderRange mm_position) {
             return MultiModalFeature{std::move(modality), std::move(mm_position)};
           }),
           py::arg("modality"), py::arg("mm_position"))
      .def_readwrite("modality", &MultiModalFeature::modality)
      .def_readwrite("mm_position", &MultiModalFeature::mm_position);

  m.def(
      "compute_mm_prefix_ranges",
      [](py::object mm_features_per_req, std::optional<int64_t> sliding_window, bool clamp_sliding_window,
         int64_t span_pad) {
        std::vector<std::vector<MultiModalFeature>> per_req;
        for (auto req : mm_features_per_req) per_req.push_back(features_from_py(req));
        return mm_ranges_to_py(compute_mm_prefix_ranges(per_req, sliding_window, clamp_sliding_window, span_pad));
      },
      py::arg("mm_features_per_req"), py::arg("sliding_window") = py::none(),
      py::arg("clamp_sliding_window") = false, py::arg("span_pad") = 0,
      "vLLM's compute_mm_prefix_ranges -> {row: [(start, end), ...]} inclusive PrefixLM ranges of "
      "image/video features.");
  m.def(
      "compute_mm_prefix_ranges_by_req_id",
      [](std::vector<std::string> req_ids, py::dict mm_features, std::optional<int64_t> sliding_window) {
        std::unordered_map<std::string, std::vector<MultiModalFeature>> by_id;
        for (auto item : mm_features) by_id[item.first.cast<std::string>()] = features_from_py(item.second);
        return mm_ranges_to_py(compute_mm_prefix_ranges(req_ids, by_id, sliding_window));
      },
      py::arg("req_ids"), py::arg("mm_features"), py::arg("sliding_window") = py::none(),
      "vllm.v1.worker.gpu.attn_utils' compute_mm_prefix_ranges(req_ids, mm_features, sliding_window).");
  m.def(
      "compute_mm_prefix_range_tensor",
      [](py::object mm_prefix_range, int64_t num_seqs) -> py::object {
        if (mm_prefix_range.is_none()) return py::none();
        MMPrefixRanges r = mm_ranges_from_py(mm_prefix_range);
        auto t = compute_mm_prefix_range_tensor(&r, num_seqs);
        return t ? py::cast(*t) : py::none();
      },
      py::arg("mm_prefix_range"), py::arg("num_seqs"),
      "vLLM's compute_mm_prefix_range_tensor: [num_seqs, max_ranges, 2] int32 padded with (0, 0), or None.");
  m.def(
      "fill_mm_prefix_query_ranges",
      [](py::object out, py::object mm_prefix_range, py::object query_start_loc_cpu, py::object seq_lens_cpu) {
        MMPrefixRanges r = mm_ranges_from_py(mm_prefix_range);
        return fill_mm_prefix_query_ranges(as_tensor(out), mm_prefix_range.is_none() ? nullptr : &r,
                                           as_int32_tensor(query_start_loc_cpu, "query_start_loc_cpu"),
                                           as_int32_tensor(seq_lens_cpu, "seq_lens_cpu"));
      },
      py::arg("out"), py::arg("mm_prefix_range"), py::arg("query_start_loc_cpu"), py::arg("seq_lens_cpu"),
      "vLLM's fill_mm_prefix_query_ranges: writes the range holding each scheduled query token into "
      "out [max_num_batched_tokens, 2] int32 ((-1, -1) = none); returns rows written (0: out untouched).  "
      "query_start_loc_cpu / seq_lens_cpu: CPU integer tensors (int32 read in place; int64 converted).");

  // ---- InputBatch and the reorder -------------------------------------------------------------
  py::class_<InputBatch>(m, "InputBatch",
                         R"doc(vLLM's InputBatch reduced to what attention metadata needs: persistent per-request rows.

InputBatch(max_num_reqs, max_num_blocks_per_req).  add_request(req_id, num_prompt_tokens,
num_computed_tokens, num_scheduled_tokens=0, block_ids=[]) appends a row (ids must be unique,
counts >= 0); remove_request(row) moves the last row into its place; swap_states(i1, i2);
append_block_ids(row, ids).  Per step: set num_scheduled_tokens (or pass the scheduler's dict to
reorder_batch_to_split_decodes_and_prefills), reorder, then BatchPreparer.prepare(batch).)doc")
      .def(py::init<int64_t, int64_t>(), py::arg("max_num_reqs"), py::arg("max_num_blocks_per_req"))
      .def(
          "add_request",
          [](InputBatch& b, std::string req_id, int32_t num_prompt_tokens, int32_t num_computed_tokens,
             int32_t num_scheduled_tokens, std::vector<int32_t> block_ids, py::object mm_features) {
            RequestState r{std::move(req_id), num_prompt_tokens, num_computed_tokens, num_scheduled_tokens,
                           std::move(block_ids), {}};
            if (!mm_features.is_none()) r.mm_features = features_from_py(mm_features);
            return b.add_request(r);
          },
          py::arg("req_id"), py::arg("num_prompt_tokens"), py::arg("num_computed_tokens"),
          py::arg("num_scheduled_tokens") = 0, py::arg("block_ids") = std::vector<int32_t>{},
          py::arg("mm_features") = py::none(), "Appends a row; returns its index.")
      .def("remove_request", &InputBatch::remove_request, py::arg("row"))
      .def("swap_states", &InputBatch::swap_states, py::arg("i1"), py::arg("i2"))
      .def("append_block_ids",
           [](InputBatch& b, int64_t row, std::vector<int32_t> ids) { b.append_block_ids(row, ids); },
           py::arg("row"), py::arg("ids"))
      .def_property_readonly("num_reqs", &InputBatch::num_reqs)
      .def_property_readonly("max_num_reqs", &InputBatch::max_num_reqs)
      .def_property_readonly("num_swaps", &InputBatch::num_swaps)
      .def_property_readonly("req_ids", &InputBatch::req_ids)
      .def_property(
          "num_scheduled_tokens",
          [](const InputBatch& b) { auto s = b.num_scheduled_tokens(); return std::vector<int32_t>(s.begin(), s.end()); },
          [](InputBatch& b, const std::vector<int32_t>& v) {
            auto s = b.num_scheduled_tokens();
            KVATTN_CHECK(v.size() == s.size(), "num_scheduled_tokens: {} values for {} requests", v.size(), s.size());
            for (size_t i = 0; i < v.size(); ++i)
              KVATTN_CHECK(v[i] >= 0, "num_scheduled_tokens[{}] = {} (request {}) must be >= 0", i, v[i],
                           b.req_id(static_cast<int64_t>(i)));
            std::copy(v.begin(), v.end(), s.begin());
          })
      .def_property_readonly("num_computed_tokens_cpu", [](const InputBatch& b) {
        auto s = b.num_computed_tokens_cpu(); return std::vector<int32_t>(s.begin(), s.end()); })
      .def_property_readonly("num_prompt_tokens", [](const InputBatch& b) {
        auto s = b.num_prompt_tokens(); return std::vector<int32_t>(s.begin(), s.end()); })
      .def_property_readonly("block_table", [](const InputBatch& b) { return b.block_table(); },
                             "[max_num_reqs, max_num_blocks_per_req] int32 (a view of the batch's buffer).")
      .def("block_row", [](const InputBatch& b, int64_t row) {
        auto s = b.block_row(row); return std::vector<int32_t>(s.begin(), s.end()); }, py::arg("row"));

  m.def(
      "classify_request",
      [](int32_t num_scheduled, int32_t num_computed, int32_t num_prompt, int32_t decode_threshold) {
        static const char* names[] = {"decode", "short_extend", "long_extend", "prefill"};
        KVATTN_CHECK(num_scheduled >= 0 && num_computed >= 0 && num_prompt >= 0,
                     "classify_request: counts must be >= 0, got num_scheduled = {}, num_computed = {}, "
                     "num_prompt = {}", num_scheduled, num_computed, num_prompt);
        return names[static_cast<int>(classify_request(num_scheduled, num_computed, num_prompt, decode_threshold))];
      },
      py::arg("num_scheduled"), py::arg("num_computed"), py::arg("num_prompt"), py::arg("decode_threshold") = 1,
      "The reorder region of one request: 'decode', 'short_extend', 'long_extend' or 'prefill'.");
  m.def(
      "reorder_batch_to_split_decodes_and_prefills",
      [](InputBatch& input_batch, py::object scheduler_output, int32_t decode_threshold) {
        if (!scheduler_output.is_none()) {
          // vLLM reads scheduler_output.num_scheduled_tokens[req_id]; copy it into the rows.
          py::object sched = py::hasattr(scheduler_output, "num_scheduled_tokens")
                                 ? py::object(scheduler_output.attr("num_scheduled_tokens"))
                                 : scheduler_output;
          auto ids = input_batch.req_ids();
          auto rows = input_batch.num_scheduled_tokens();
          std::vector<int32_t> values(ids.size());
          for (size_t i = 0; i < ids.size(); ++i) {
            const py::str id(ids[i]);
            KVATTN_CHECK(sched.contains(id),
                         "reorder_batch_to_split_decodes_and_prefills: scheduler_output has no num_scheduled_tokens "
                         "entry for request '{}' (row {}); every row of the batch needs one", ids[i], i);
            values[i] = sched[id].cast<int32_t>();
            KVATTN_CHECK(values[i] >= 0,
                         "reorder_batch_to_split_decodes_and_prefills: num_scheduled_tokens['{}'] = {} must be >= 0",
                         ids[i], values[i]);
          }
          std::copy(values.begin(), values.end(), rows.begin());
        }
        return reorder_batch_to_split_decodes_and_prefills(input_batch, decode_threshold);
      },
      py::arg("input_batch"), py::arg("scheduler_output") = py::none(), py::arg("decode_threshold") = 1,
      R"doc(vLLM's reorder_batch_to_split_decodes_and_prefills: decode -> short extend -> long extend -> prefill.

scheduler_output: None (use the rows' num_scheduled_tokens), a {req_id: tokens} dict, or an
object with such a num_scheduled_tokens dict.  Returns whether any row moved.)doc");

  // ---- BatchPreparer --------------------------------------------------------------------------
  py::class_<BatchPreparer>(m, "BatchPreparer",
                            R"doc(Builds each step's CommonAttentionMetadata from an InputBatch into persistent buffers.

BatchPreparer(max_num_reqs=, max_num_batched_tokens=, max_model_len=, block_size=, ...,
device="cpu"); prepare(input_batch, num_reqs_padded=-1, num_tokens_padded=-1,
framework="numpy") -> CommonAttentionMetadata (query_start_loc, seq_lens, positions,
slot_mapping, block_table_tensor, ...), views of the preparer's buffers valid until its next
prepare.  Nothing is allocated per step.)doc")
      .def(py::init([](int64_t max_num_reqs, int64_t max_num_batched_tokens, int64_t max_model_len,
                       int64_t block_size, int64_t blocks_per_kv_block, int64_t dcp_world_size, int64_t dcp_rank,
                       int64_t cp_kv_cache_interleave_size, int64_t num_blocks, bool causal,
                       const std::string& device) {
             BatchPreparerConfig c;
             c.max_num_reqs = max_num_reqs;
             c.max_num_batched_tokens = max_num_batched_tokens;
             c.max_model_len = max_model_len;
             c.block_size = block_size;
             c.blocks_per_kv_block = blocks_per_kv_block;
             c.dcp_world_size = dcp_world_size;
             c.dcp_rank = dcp_rank;
             c.cp_kv_cache_interleave_size = cp_kv_cache_interleave_size;
             c.num_blocks = num_blocks;
             c.causal = causal;
             c.device = Device::parse(device);
             return std::make_unique<BatchPreparer>(c);
           }),
           py::kw_only(), py::arg("max_num_reqs") = 256, py::arg("max_num_batched_tokens") = 8192,
           py::arg("max_model_len") = 8192, py::arg("block_size") = 16, py::arg("blocks_per_kv_block") = 1,
           py::arg("dcp_world_size") = 1, py::arg("dcp_rank") = 0, py::arg("cp_kv_cache_interleave_size") = 1,
           py::arg("num_blocks") = 0, py::arg("causal") = true, py::arg("device") = "cpu")
      .def(
          "_prepare_fields",
          [](BatchPreparer& p, const InputBatch& batch, int64_t num_reqs_padded, int64_t num_tokens_padded) {
            return cm_to_fields(p.prepare(batch, num_reqs_padded, num_tokens_padded));
          },
          py::arg("input_batch"), py::arg("num_reqs_padded") = -1, py::arg("num_tokens_padded") = -1);
}

}  // namespace

KVATTN_PY_BINDER(bind_batch);

}  // namespace kvattn::python
