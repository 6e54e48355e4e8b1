#include "kvattn/attention/xqa_mask.h"

#include <algorithm>
#include <bit>

#include "kvattn/batch/tensor_access.h"

namespace kvattn {
static_assert(std::endian::native == std::endian::little,
              "XQA masks are defined as little-endian uint16 halves of uint32 words");

namespace {
constexpr int64_t kMaxDraftLen = int64_t{1} << 16;

uint32_t pack_word(const uint8_t* bits32) {
  uint32_t w = 0;
  for (int j = 0; j < 32; ++j) w |= static_cast<uint32_t>(bits32[j] != 0) << j;
  return w;
}
}  // namespace

Tensor pack_draft_block_bool_mask(std::span<const uint8_t> bool_mask, int64_t num_rows,
                                  int64_t num_packed) {
  KVATTN_CHECK(num_rows >= 0 && num_packed >= 0,
               "pack_draft_block_bool_mask: num_rows = {} and num_packed = {} must be >= 0",
               num_rows, num_packed);
  KVATTN_CHECK(static_cast<int64_t>(bool_mask.size()) == num_rows * num_packed * 32,
               "pack_draft_block_bool_mask: mask has {} entries, [{} rows, 32 * {}] = {} expected",
               bool_mask.size(), num_rows, num_packed, num_rows * num_packed * 32);
  Tensor out = Tensor::empty({num_rows, num_packed}, DType::i32);
  auto* o = reinterpret_cast<uint32_t*>(out.data_ptr<int32_t>());
  for (int64_t i = 0; i < num_rows * num_packed; ++i) o[i] = pack_word(bool_mask.data() + i * 32);
  return out;
}

void fill_xqa_draft_mask_rows(uint32_t* out, int64_t num_words, int64_t len, bool causal) noexcept {
  for (int64_t qi = 0; qi < len; ++qi) {
    const int64_t limit = causal ? qi + 1 : len;  // keys [0, limit) are visible
    for (int64_t w = 0; w < num_words; ++w) {
      const int64_t nbits = std::clamp<int64_t>(limit - w * 32, 0, 32);
      out[qi * num_words + w] = nbits == 32 ? 0xffffffffu : ((uint32_t{1} << nbits) - 1u);
    }
  }
}

Tensor make_xqa_draft_block_mask(int64_t q_len, bool causal) {
  KVATTN_CHECK(q_len >= 1 && q_len <= kMaxDraftLen,
               "make_xqa_draft_block_mask: q_len = {} must be in [1, {}]", q_len, kMaxDraftLen);
  const int64_t P = (q_len + 31) / 32;
  Tensor out = Tensor::empty({q_len, P}, DType::i32);
  fill_xqa_draft_mask_rows(reinterpret_cast<uint32_t*>(out.data_ptr<int32_t>()), P, q_len, causal);
  return out;
}

Tensor make_xqa_ragged_draft_block_mask(std::span<const int32_t> q_lens, int64_t max_q_len,
                                        bool causal) {
  KVATTN_CHECK(max_q_len >= 1 && max_q_len <= kMaxDraftLen,
               "make_xqa_ragged_draft_block_mask: max_q_len = {} must be in [1, {}]", max_q_len,
               kMaxDraftLen);
  int64_t rows = 0;
  for (size_t r = 0; r < q_lens.size(); ++r) {
    KVATTN_CHECK(q_lens[r] >= 0 && q_lens[r] <= max_q_len,
                 "request row {}: draft query length {} is outside [0, {}] (max_q_len)", r,
                 q_lens[r], max_q_len);
    rows += q_lens[r];
  }
  const int64_t P = (max_q_len + 31) / 32;
  Tensor out = Tensor::empty({rows, P}, DType::i32);
  auto* o = reinterpret_cast<uint32_t*>(out.data_ptr<int32_t>());
  for (int32_t len : q_lens) {
    fill_xqa_draft_mask_rows(o, P, len, causal);
    o += static_cast<int64_t>(len) * P;
  }
  return out;
}

std::span<const uint16_t> xqa_mask_u16(const Tensor& mask) {
  KVATTN_CHECK(mask.defined() && mask.dtype() == DType::i32 && mask.device().is_cpu() &&
                   mask.dim() >= 1 && mask.is_contiguous(),
               "xqa_mask_u16: expected a contiguous [..., P] int32 host mask, got {}",
               mask.defined() ? mask.str() : std::string("undefined"));
  return {reinterpret_cast<const uint16_t*>(mask.data()), static_cast<size_t>(mask.numel() * 2)};
}

DecodeQueryWidth decode_query_width(std::span<const int32_t> qsl, int64_t num_decodes,
                                    int64_t num_decode_tokens, bool use_xqa) {
  DecodeQueryWidth out;
  if (num_decodes == 0 || num_decode_tokens == 0) return out;
  KVATTN_CHECK(num_decodes > 0 && static_cast<int64_t>(qsl.size()) >= num_decodes + 1,
               "compute_decode_query_lens: num_decodes = {} needs {} query_start_loc entries, got {}",
               num_decodes, num_decodes + 1, qsl.size());
  auto qlen = [&](int64_t r) { return static_cast<int64_t>(qsl[r + 1]) - qsl[r]; };
  if (!use_xqa) {
    const int64_t per_req = num_decode_tokens / num_decodes;
    bool uniform = num_decode_tokens % num_decodes == 0;
    int64_t max_q = 0;
    for (int64_t r = 0; r < num_decodes; ++r) {
      uniform = uniform && qlen(r) == per_req;
      max_q = std::max(max_q, qlen(r));
    }
    if (uniform) {
      out.q_len_per_req = per_req;
      return out;
    }
    // CUDA-graph padding after a uniform spec-decode batch: describe it through varlen.
    if (max_q > 1) {
      out.q_len_per_req = max_q;
      out.use_qo_indptr = true;
    }
    return out;
  }
  int64_t max_nonzero = 0, first_nonzero = -1;
  bool uniform = true;
  for (int64_t r = 0; r < num_decodes; ++r) {
    const int64_t q = qlen(r);
    if (q <= 0) continue;
    if (first_nonzero < 0) first_nonzero = q;
    uniform = uniform && q == first_nonzero;
    max_nonzero = std::max(max_nonzero, q);
  }
  const int64_t per_req = max_nonzero > 0 ? max_nonzero : 1;
  if (uniform && num_decode_tokens == num_decodes * per_req) {
    out.q_len_per_req = per_req;
    return out;
  }
  if (per_req <= 1) return out;
  out.q_len_per_req = per_req;
  out.use_qo_indptr = true;
  return out;
}

DecodeQueryLens compute_decode_query_lens(std::span<const int32_t> qsl, int64_t num_decodes,
                                          int64_t num_decode_tokens, bool use_xqa) {
  const DecodeQueryWidth w = decode_query_width(qsl, num_decodes, num_decode_tokens, use_xqa);
  DecodeQueryLens out;
  out.q_len_per_req = w.q_len_per_req;
  out.use_qo_indptr = w.use_qo_indptr;
  if (use_xqa && w.use_qo_indptr) {  // XQA ragged: the per-request lengths
    std::vector<int32_t> lens(static_cast<size_t>(num_decodes));
    for (int64_t r = 0; r < num_decodes; ++r) lens[r] = qsl[r + 1] - qsl[r];
    out.ragged_q_lens = std::move(lens);
  }
  return out;
}

XqaDecodeMaskCache::XqaDecodeMaskCache(int64_t max_num_reqs, int64_t num_words, Device device)
    : max_num_reqs_(max_num_reqs), num_words_(num_words), device_(device) {
  KVATTN_CHECK(max_num_reqs >= 1, "XqaDecodeMaskCache: max_num_reqs = {} must be >= 1", max_num_reqs);
  KVATTN_CHECK(num_words >= 0 && num_words <= (kMaxDraftLen + 31) / 32,
               "XqaDecodeMaskCache: num_words = {} must be in [0, {}]", num_words,
               (kMaxDraftLen + 31) / 32);
}

const Tensor& XqaDecodeMaskCache::uniform(int64_t q_len_per_req, int64_t num_decodes, bool causal) {
  KVATTN_CHECK(num_decodes >= 0 && num_decodes <= max_num_reqs_,
               "get_decode_mask: num_decodes = {} is outside [0, {}] (max_num_reqs)", num_decodes,
               max_num_reqs_);
  const auto key = std::make_pair(q_len_per_req, causal);
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    KVATTN_CHECK(q_len_per_req >= 1 && q_len_per_req <= kMaxDraftLen,
                 "get_decode_mask: q_len_per_req = {} must be in [1, {}]", q_len_per_req, kMaxDraftLen);
    const int64_t rows = q_len_per_req, P = num_words_ > 0 ? num_words_ : (q_len_per_req + 31) / 32;
    KVATTN_CHECK(rows <= P * 32, "get_decode_mask: q_len_per_req = {} does not fit mask rows of {} words",
                 rows, P);
    Tensor buf = Tensor::empty({max_num_reqs_, rows, P}, DType::i32);
    auto* o = reinterpret_cast<uint32_t*>(buf.data_ptr<int32_t>());
    for (int64_t r = 0; r < max_num_reqs_; ++r) fill_xqa_draft_mask_rows(o + r * rows * P, P, rows, causal);
    it = cache_.emplace(key, device_.is_cpu() ? std::move(buf) : buf.to(device_)).first;
  }
  return it->second;
}

std::optional<Tensor> XqaDecodeMaskCache::get_decode_mask(
    int64_t q_len_per_req, const std::optional<std::vector<int32_t>>& ragged_q_lens,
    int64_t num_decodes, bool causal) {
  if (q_len_per_req <= 1) return std::nullopt;
  if (!ragged_q_lens.has_value()) return uniform(q_len_per_req, num_decodes, causal).slice(0, 0, num_decodes);
  KVATTN_CHECK(device_.is_cpu(), "XqaDecodeMaskCache: ragged masks are built on the host; their upload "
               "to {} is not implemented", device_.str());
  return make_xqa_ragged_draft_block_mask(*ragged_q_lens, q_len_per_req, causal);
}

Tensor XqaDecodeMaskCache::uniform_rows(int64_t q_len_per_req, int64_t num_decodes, bool causal) {
  const Tensor& m = uniform(q_len_per_req, num_decodes, causal);
  return m.view({max_num_reqs_ * q_len_per_req, m.size(2)}).narrow(0, 0, num_decodes * q_len_per_req);
}

}  // namespace kvattn
