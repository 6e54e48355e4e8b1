// Helpers shared by the batch-layer tests: build CommonAttentionMetadata from plain lists.
#pragma once

#include <cstdint>
#include <numeric>
#include <vector>

#include "kvattn/batch/common_attention_metadata.h"

namespace kvattn::testing {

// Owns the tensors the metadata views.
struct MetadataFixture {
  Tensor qsl, seq, bt, slots, prefilling;
  CommonAttentionMetadata cm;
};

inline MetadataFixture make_metadata(const std::vector<int32_t>& query_lens,
                                     const std::vector<int32_t>& seq_lens,
                                     int64_t num_tokens_override = -1,
                                     const std::vector<uint8_t>& is_prefilling = {}) {
  MetadataFixture f;
  std::vector<int32_t> qsl(query_lens.size() + 1, 0);
  for (size_t i = 0; i < query_lens.size(); ++i) qsl[i + 1] = qsl[i] + query_lens[i];
  f.qsl = Tensor::from_vector(qsl);
  f.seq = Tensor::from_vector(seq_lens);
  f.bt = Tensor::zeros({static_cast<int64_t>(query_lens.size()), 1}, DType::i32);
  f.cm.query_start_loc = f.qsl;
  f.cm.query_start_loc_cpu = f.qsl;
  f.cm.seq_lens = f.seq;
  f.cm.seq_lens_cpu_upper_bound = f.seq;
  f.cm.num_reqs = static_cast<int64_t>(query_lens.size());
  f.cm.num_actual_tokens = num_tokens_override >= 0 ? num_tokens_override : qsl.back();
  f.cm.max_query_len =
      query_lens.empty() ? 0 : *std::max_element(query_lens.begin(), query_lens.end());
  f.cm.max_seq_len = seq_lens.empty() ? 0 : *std::max_element(seq_lens.begin(), seq_lens.end());
  f.cm.block_table_tensor = f.bt;
  if (!is_prefilling.empty()) {
    f.prefilling = Tensor::from_vector(is_prefilling);
    f.cm.is_prefilling = f.prefilling;
  }
  return f;
}

}  // namespace kvattn::testing
