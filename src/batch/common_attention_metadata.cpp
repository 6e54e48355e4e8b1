#include "kvattn/batch/common_attention_metadata.h"

#include "kvattn/batch/tensor_access.h"

namespace kvattn {
namespace {

Tensor slice_rows(const Tensor& t, int64_t n) { return t.defined() ? t.slice(0, 0, n) : t; }

}  // namespace

int64_t CommonAttentionMetadata::naive_query_lens(std::span<int32_t> out) const {
  const auto qsl = host_i32_span(query_start_loc_cpu, "query_start_loc_cpu");
  KVATTN_CHECK(num_reqs >= 0 && static_cast<int64_t>(qsl.size()) >= num_reqs + 1,
               "query_start_loc_cpu has {} entries, num_reqs + 1 = {} needed", qsl.size(),
               num_reqs + 1);
  KVATTN_CHECK(static_cast<int64_t>(out.size()) >= num_reqs,
               "naive_query_lens: output holds {} entries, num_reqs = {}", out.size(), num_reqs);
  // In int64: no signed overflow on arbitrary offsets (a decreasing pair gives a negative length).
  for (int64_t r = 0; r < num_reqs; ++r) out[r] = static_cast<int32_t>(static_cast<int64_t>(qsl[r + 1]) - qsl[r]);
  return num_reqs;
}

Tensor CommonAttentionMetadata::naive_query_lens() const {
  KVATTN_CHECK(num_reqs >= 0, "num_reqs is {}, must be >= 0", num_reqs);
  Tensor out = Tensor::empty({num_reqs}, DType::i32);
  naive_query_lens(std::span<int32_t>(out.data_ptr<int32_t>(), static_cast<size_t>(num_reqs)));
  return out;
}

CommonAttentionMetadata CommonAttentionMetadata::unpadded(int64_t n_tokens, int64_t n_reqs) const {
  KVATTN_CHECK(n_reqs >= 0 && n_reqs <= num_reqs,
               "unpadded: num_actual_reqs = {} is outside [0, {}] (num_reqs)", n_reqs, num_reqs);
  KVATTN_CHECK(n_tokens >= 0 && n_tokens <= num_actual_tokens,
               "unpadded: num_actual_tokens = {} is outside [0, {}]", n_tokens, num_actual_tokens);
  CommonAttentionMetadata m = *this;
  m.num_reqs = n_reqs;
  m.num_actual_tokens = n_tokens;
  m.query_start_loc = slice_rows(query_start_loc, n_reqs + 1);
  m.query_start_loc_cpu = slice_rows(query_start_loc_cpu, n_reqs + 1);
  m.seq_lens = slice_rows(seq_lens, n_reqs);
  m.block_table_tensor = slice_rows(block_table_tensor, n_reqs);
  m.slot_mapping = slice_rows(slot_mapping, n_tokens);
  m.seq_lens_cpu_upper_bound = slice_rows(seq_lens_cpu_upper_bound, n_reqs);
  m.is_prefilling = slice_rows(is_prefilling, n_reqs);
  m.dcp_local_seq_lens = slice_rows(dcp_local_seq_lens, n_reqs);
  m.dcp_local_seq_lens_cpu = slice_rows(dcp_local_seq_lens_cpu, n_reqs);
  m.positions = slice_rows(positions, n_tokens);
  m.encoder_seq_lens = slice_rows(encoder_seq_lens, n_reqs);
  m.encoder_seq_lens_cpu = slice_rows(encoder_seq_lens_cpu, n_reqs);
  return m;
}

void CommonAttentionMetadata::validate() const {
  KVATTN_CHECK(num_reqs >= 0, "num_reqs = {} is negative", num_reqs);
  KVATTN_CHECK(num_actual_tokens >= 0, "num_actual_tokens = {} is negative", num_actual_tokens);
  const auto qsl = host_i32_span(query_start_loc_cpu, "query_start_loc_cpu");
  KVATTN_CHECK(static_cast<int64_t>(qsl.size()) >= num_reqs + 1,
               "query_start_loc_cpu has {} entries, num_reqs + 1 = {} needed", qsl.size(),
               num_reqs + 1);
  KVATTN_CHECK(qsl[0] == 0, "query_start_loc_cpu[0] = {}, must be 0", qsl[0]);
  // num_actual_tokens may include CUDA-graph padding past the last request's tokens.
  KVATTN_CHECK(qsl[num_reqs] <= num_actual_tokens,
               "query_start_loc_cpu[num_reqs={}] = {} exceeds num_actual_tokens = {}; the "
               "scheduled tokens must fit the token count", num_reqs, qsl[num_reqs],
               num_actual_tokens);
  // Host sequence lengths: the upper bound if present, else seq_lens when it lives on the CPU.
  std::span<const int32_t> seq;
  const char* seq_name = "seq_lens";
  if (seq_lens_cpu_upper_bound.defined()) {
    seq = host_i32_span(seq_lens_cpu_upper_bound, "seq_lens_cpu_upper_bound");
    seq_name = "seq_lens_cpu_upper_bound";
  } else if (seq_lens.defined() && seq_lens.device().is_cpu()) {
    seq = host_i32_span(seq_lens, "seq_lens");
  }
  KVATTN_CHECK(seq_lens.defined() && seq_lens.dim() == 1 && seq_lens.size(0) >= num_reqs &&
                   seq_lens.dtype() == DType::i32,
               "seq_lens must be a [num_reqs={}] int32 tensor, got {}", num_reqs,
               seq_lens.defined() ? seq_lens.str() : std::string("undefined"));
  if (!seq.empty() || num_reqs == 0) {
    KVATTN_CHECK(static_cast<int64_t>(seq.size()) >= num_reqs, "{} has {} entries, num_reqs = {}",
                 seq_name, seq.size(), num_reqs);
  }
  for (int64_t r = 0; r < num_reqs; ++r) {
    const int64_t q = static_cast<int64_t>(qsl[r + 1]) - qsl[r];
    KVATTN_CHECK(q >= 0,
                 "request row {}: query_start_loc_cpu decreases ({} -> {}), query length {} is "
                 "negative; query_start_loc must be a cumulative sum of lengths >= 0",
                 r, qsl[r], qsl[r + 1], q);
    KVATTN_CHECK(q <= max_query_len,
                 "request row {}: query length {} exceeds max_query_len = {}; max_query_len must "
                 "bound every query length", r, q, max_query_len);
    if (!seq.empty()) {
      KVATTN_CHECK(seq[r] >= q,
                   "request row {}: {} = {} is shorter than its query length {}; a sequence "
                   "includes this step's query tokens (seq_len = computed + scheduled)",
                   r, seq_name, seq[r], q);
      KVATTN_CHECK(seq[r] <= max_seq_len,
                   "request row {}: {} = {} exceeds max_seq_len = {}; max_seq_len must bound "
                   "every sequence length", r, seq_name, seq[r], max_seq_len);
    }
  }
  KVATTN_CHECK(block_table_tensor.defined() && block_table_tensor.dim() == 2 &&
                   block_table_tensor.size(0) >= num_reqs &&
                   block_table_tensor.dtype() == DType::i32,
               "block_table_tensor must be [num_reqs={}, max_blocks] int32, got {}", num_reqs,
               block_table_tensor.defined() ? block_table_tensor.str() : std::string("undefined"));
  if (slot_mapping.defined()) {
    KVATTN_CHECK(slot_mapping.dim() == 1 && slot_mapping.size(0) >= num_actual_tokens &&
                     slot_mapping.dtype() == DType::i64,
                 "slot_mapping must be [num_actual_tokens={}] int64, got {}", num_actual_tokens,
                 slot_mapping.str());
  }
  if (positions.defined()) {
    KVATTN_CHECK(positions.dim() == 1 && positions.size(0) >= num_actual_tokens,
                 "positions must have num_actual_tokens = {} entries, got {}", num_actual_tokens,
                 positions.str());
  }
  if (is_prefilling.defined()) {
    KVATTN_CHECK(is_prefilling.dim() == 1 && is_prefilling.size(0) >= num_reqs &&
                     is_prefilling.dtype() == DType::u8,
                 "is_prefilling must be [num_reqs={}] uint8 (bool), got {}", num_reqs,
                 is_prefilling.str());
  }
}

}  // namespace kvattn
