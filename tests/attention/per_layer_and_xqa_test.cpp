// Per-layer parameters, head counts, LSE conversion, backend traits lookup and XQA draft masks.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kvattn/attention/per_layer_parameters.h"
#include "kvattn/attention/xqa_mask.h"

namespace kvattn {
namespace {

std::vector<AttentionLayerInfo> layers() {
  std::vector<AttentionLayerInfo> v(3);
  v[0] = {"model.layers.0.attn", 32, 8, 0.125, std::nullopt, std::nullopt, false};
  v[1] = {"model.layers.1.attn", 32, 8, 0.125, std::make_pair<int64_t, int64_t>(1023, 0), std::nullopt, false};
  v[2] = {"model.layers.2.attn", 16, 8, 0.125, std::nullopt, 30.0, true};
  return v;
}

TEST(PerLayerParameters, CollectAndInfer) {
  const auto ls = layers();
  const std::vector<std::string> names = {"model.layers.0.attn", "model.layers.1.attn"};
  auto params = get_per_layer_parameters(ls, names);
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params[0].first, "model.layers.0.attn");
  EXPECT_EQ(params[0].second.window_left, -1);
  EXPECT_EQ(params[1].second.window_left, 1023);
  auto global = infer_global_hyperparameters(params);
  EXPECT_EQ(global.window_left, -1);
  EXPECT_EQ(global.has_same_window_lefts, false);
  EXPECT_EQ(global.has_same_all_params, false);

  const std::vector<std::string> same = {"model.layers.0.attn", "model.layers.0.attn"};
  auto p2 = get_per_layer_parameters(ls, same);
  auto g2 = infer_global_hyperparameters(p2);
  EXPECT_EQ(g2.has_same_window_lefts, true);
  EXPECT_EQ(g2.has_same_all_params, true);

  // Same window, different soft cap / sinks: windows agree, parameters do not.
  const std::vector<std::string> mixed = {"model.layers.0.attn", "model.layers.2.attn"};
  auto p3 = get_per_layer_parameters(ls, mixed);
  EXPECT_EQ(p3[1].second.logits_soft_cap, std::optional<double>(30.0));
  EXPECT_TRUE(p3[1].second.has_sinks);
  auto g3 = infer_global_hyperparameters(p3);
  EXPECT_EQ(g3.has_same_window_lefts, true);
  EXPECT_EQ(g3.has_same_all_params, false);

  PerLayerParameterMap empty;
  EXPECT_THROW(infer_global_hyperparameters(empty), InvalidArgument);
  const std::vector<std::string> unknown = {"nope"};
  try {
    get_per_layer_parameters(ls, unknown);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'nope'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("model.layers.2.attn"), std::string::npos);
  }
}

TEST(PerLayerParameters, NumHeadsSharedOrClearError) {
  const auto ls = layers();
  const std::vector<std::string> ok = {"model.layers.0.attn", "model.layers.1.attn", "other"};
  EXPECT_EQ(get_num_attention_heads_from_layers(ls, ok), std::optional<int64_t>(32));
  const std::vector<std::string> none = {"x", "y"};
  EXPECT_EQ(get_num_attention_heads_from_layers(ls, none), std::nullopt);
  const std::vector<std::string> bad = {"model.layers.0.attn", "model.layers.2.attn"};
  try {
    get_num_attention_heads_from_layers(ls, bad);
    FAIL();
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("model.layers.0.attn=32"), std::string::npos) << m;
    EXPECT_NE(m.find("model.layers.2.attn=16"), std::string::npos) << m;
  }
}

TEST(PerLayerParameters, Log2LseToLn) {
  EXPECT_FLOAT_EQ(log2_lse_to_ln(1.0f), 0.6931472f);
  Tensor lse = Tensor::from_vector(std::vector<float>{0.0f, 2.0f, -INFINITY, 10.0f}, {2, 2});
  Tensor ln = log2_lse_to_ln(lse);
  EXPECT_EQ(ln.shape(), (Dims{2, 2}));
  EXPECT_FLOAT_EQ(static_cast<float>(ln.get({0, 1})), static_cast<float>(2.0 * std::log(2.0)));
  EXPECT_TRUE(std::isinf(ln.get({1, 0})) && ln.get({1, 0}) < 0);
  EXPECT_FLOAT_EQ(static_cast<float>(ln.get({1, 1})), static_cast<float>(10.0 * std::log(2.0)));
  EXPECT_EQ(lse.get({0, 1}), 2.0);  // input untouched
  EXPECT_THROW(log2_lse_to_ln(Tensor::zeros({2}, DType::i32)), InvalidArgument);
}

TEST(BackendTraits, QueryLensMismatchUnsupported) {
  std::vector<std::vector<AttentionBackendTraits>> groups = {
      {{"FLASHINFER", true}, {"FLASHINFER", true}}, {{"TRITON_ATTN", false}, {"FLEX", false}}};
  EXPECT_EQ(get_query_lens_mismatch_unsupported_backend(groups), std::optional<std::string>("TRITON_ATTN"));
  groups[1][0].supports_device_cpu_query_lens_mismatch = true;
  EXPECT_EQ(get_query_lens_mismatch_unsupported_backend(groups), std::optional<std::string>("FLEX"));
  groups[1][1].supports_device_cpu_query_lens_mismatch = true;
  EXPECT_EQ(get_query_lens_mismatch_unsupported_backend(groups), std::nullopt);
  EXPECT_EQ(get_query_lens_mismatch_unsupported_backend({}), std::nullopt);
}

// Oracle: the seed's packing spelled out — build the bool row, weight bit j of word w by 2^j,
// split each uint32 into (low, high) uint16.
std::vector<uint16_t> oracle_row(const std::vector<bool>& row, int64_t P) {
  std::vector<uint16_t> out;
  for (int64_t w = 0; w < P; ++w) {
    uint64_t sum = 0;
    for (int j = 0; j < 32; ++j) sum += static_cast<uint64_t>(row[w * 32 + j]) << j;
    out.push_back(static_cast<uint16_t>(sum & 0xffff));
    out.push_back(static_cast<uint16_t>(sum >> 16));
  }
  return out;
}

TEST(XqaMask, UniformMasksBitExact) {
  for (int64_t q_len : {1, 2, 3, 5, 31, 32, 33, 64, 65, 100}) {
    for (bool causal : {true, false}) {
      Tensor m = make_xqa_draft_block_mask(q_len, causal);
      const int64_t P = (q_len + 31) / 32;
      ASSERT_EQ(m.shape(), (Dims{q_len, P}));
      const auto halves = xqa_mask_u16(m);
      for (int64_t qi = 0; qi < q_len; ++qi) {
        std::vector<bool> row(P * 32);
        for (int64_t kj = 0; kj < P * 32; ++kj) row[kj] = causal ? kj <= qi : kj < q_len;
        const auto expect = oracle_row(row, P);
        for (int64_t k = 0; k < 2 * P; ++k)
          ASSERT_EQ(halves[qi * 2 * P + k], expect[k]) << q_len << " " << causal << " " << qi;
      }
    }
  }
  // q_len 3 causal, by hand: rows 0b1, 0b11, 0b111 -> halves (1,0), (3,0), (7,0).
  const Tensor m3 = make_xqa_draft_block_mask(3, true);
  const auto h = xqa_mask_u16(m3);
  EXPECT_EQ(std::vector<uint16_t>(h.begin(), h.end()), (std::vector<uint16_t>{1, 0, 3, 0, 7, 0}));
  EXPECT_THROW(make_xqa_draft_block_mask(0, true), InvalidArgument);
}

TEST(XqaMask, PackMatchesOracleOnRandomMasks) {
  std::mt19937 rng(3);
  for (int iter = 0; iter < 200; ++iter) {
    const int64_t rows = rng() % 5, P = 1 + rng() % 3;
    std::vector<uint8_t> bits(rows * P * 32);
    for (auto& b : bits) b = static_cast<uint8_t>(rng() % 2);
    const Tensor packed = pack_draft_block_bool_mask(bits, rows, P);  // keeps the halves alive
    const auto halves = xqa_mask_u16(packed);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<bool> row(bits.begin() + r * P * 32, bits.begin() + (r + 1) * P * 32);
      const auto expect = oracle_row(row, P);
      for (int64_t k = 0; k < 2 * P; ++k) ASSERT_EQ(halves[r * 2 * P + k], expect[k]);
    }
  }
  EXPECT_THROW(pack_draft_block_bool_mask(std::vector<uint8_t>(10), 1, 1), InvalidArgument);
}

TEST(XqaMask, RaggedMasksBitExact) {
  std::mt19937 rng(8);
  for (int iter = 0; iter < 300; ++iter) {
    std::vector<int32_t> q_lens(1 + rng() % 6);
    int32_t max_q = 1;
    for (auto& q : q_lens) {
      q = static_cast<int32_t>(rng() % 70);
      max_q = std::max(max_q, q);
    }
    const bool causal = rng() % 2;
    Tensor m = make_xqa_ragged_draft_block_mask(q_lens, max_q, causal);
    const int64_t P = (max_q + 31) / 32;
    const auto halves = xqa_mask_u16(m);
    int64_t row = 0;
    for (int32_t len : q_lens)
      for (int32_t qi = 0; qi < len; ++qi, ++row) {
        std::vector<bool> bits(P * 32);
        for (int64_t kj = 0; kj < P * 32; ++kj) bits[kj] = kj < len && (!causal || kj <= qi);
        const auto expect = oracle_row(bits, P);
        for (int64_t k = 0; k < 2 * P; ++k) ASSERT_EQ(halves[row * 2 * P + k], expect[k]);
      }
    ASSERT_EQ(m.size(0), row);
  }
  EXPECT_THROW(make_xqa_ragged_draft_block_mask(std::vector<int32_t>{3, 9}, 8, true), InvalidArgument);
}

TEST(XqaMask, SharedRowWriterWithWiderRowsAndWidthRule) {
  // The backend keeps masks ceil(threshold / 32) words wide for every q_len: the extra words are 0.
  for (int64_t len : {1, 2, 31, 33}) {
    for (bool causal : {true, false}) {
      const int64_t words = 3;
      std::vector<uint32_t> out(len * words, 0xdeadbeefu);
      fill_xqa_draft_mask_rows(out.data(), words, len, causal);
      for (int64_t qi = 0; qi < len; ++qi)
        for (int64_t kj = 0; kj < words * 32; ++kj) {
          const bool bit = (out[qi * words + kj / 32] >> (kj % 32)) & 1u;
          ASSERT_EQ(bit, kj < len && (!causal || kj <= qi)) << len << " " << qi << " " << kj;
        }
    }
  }
  // decode_query_width is compute_decode_query_lens without the ragged list.
  std::mt19937 rng(12);
  for (int iter = 0; iter < 500; ++iter) {
    std::vector<int32_t> qsl{0};
    const int nd = 1 + static_cast<int>(rng() % 6);
    for (int r = 0; r < nd; ++r) qsl.push_back(qsl.back() + static_cast<int32_t>(rng() % 4));
    for (bool xqa : {false, true}) {
      const auto full = compute_decode_query_lens(qsl, nd, qsl.back(), xqa);
      const auto w = decode_query_width(qsl, nd, qsl.back(), xqa);
      ASSERT_EQ(w.q_len_per_req, full.q_len_per_req);
      ASSERT_EQ(w.use_qo_indptr, full.use_qo_indptr);
      ASSERT_EQ(full.ragged_q_lens.has_value(), xqa && full.use_qo_indptr);
    }
  }
}

TEST(XqaMask, DecodeQueryLensAndCache) {
  // Non-XQA: uniform; padded after a uniform spec batch (varlen); plain decodes.
  auto a = compute_decode_query_lens(std::vector<int32_t>{0, 3, 6, 9}, 3, 9, false);
  EXPECT_EQ(a.q_len_per_req, 3);
  EXPECT_FALSE(a.use_qo_indptr);
  auto b = compute_decode_query_lens(std::vector<int32_t>{0, 3, 6, 6}, 3, 6, false);
  EXPECT_EQ(b.q_len_per_req, 3);
  EXPECT_TRUE(b.use_qo_indptr);
  auto c = compute_decode_query_lens(std::vector<int32_t>{0, 1, 1}, 2, 1, false);
  EXPECT_EQ(c.q_len_per_req, 1);
  EXPECT_FALSE(c.use_qo_indptr);
  // XQA: zero-length padding is uniform when the token count matches; ragged lists lengths.
  auto d = compute_decode_query_lens(std::vector<int32_t>{0, 2, 4, 4}, 3, 4, true);
  EXPECT_EQ(d.q_len_per_req, 2);
  EXPECT_TRUE(d.use_qo_indptr);  // 4 tokens != 3 * 2 -> ragged
  ASSERT_TRUE(d.ragged_q_lens.has_value());
  EXPECT_EQ(*d.ragged_q_lens, (std::vector<int32_t>{2, 2, 0}));
  auto e = compute_decode_query_lens(std::vector<int32_t>{0, 2, 4}, 2, 4, true);
  EXPECT_EQ(e.q_len_per_req, 2);
  EXPECT_FALSE(e.ragged_q_lens.has_value());
  auto f = compute_decode_query_lens(std::vector<int32_t>{0, 1, 3}, 2, 3, true);
  EXPECT_EQ(*f.ragged_q_lens, (std::vector<int32_t>{1, 2}));

  XqaDecodeMaskCache cache(4);
  EXPECT_EQ(cache.get_decode_mask(1, std::nullopt, 3, true), std::nullopt);
  auto m1 = cache.get_decode_mask(3, std::nullopt, 2, true);
  auto m2 = cache.get_decode_mask(3, std::nullopt, 4, true);
  ASSERT_TRUE(m1 && m2);
  EXPECT_EQ(m1->data(), m2->data());  // stable address
  EXPECT_EQ(m1->shape(), (Dims{2, 3, 1}));
  EXPECT_EQ(cache.num_cached(), 1u);
  const auto per_req = make_xqa_draft_block_mask(3, true).to_vector<int32_t>();
  const auto all = m2->to_vector<int32_t>();
  for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], per_req[i % per_req.size()]);
  cache.get_decode_mask(3, std::nullopt, 1, false);
  EXPECT_EQ(cache.num_cached(), 2u);
  auto ragged = cache.get_decode_mask(2, std::vector<int32_t>{1, 2}, 2, true);
  EXPECT_EQ(ragged->shape(), (Dims{3, 1}));
  EXPECT_THROW(cache.get_decode_mask(3, std::nullopt, 5, true), InvalidArgument);

  // A fixed row width (the native builder's planned maximum): rows of 2 words for q_len 3, the
  // same bits in word 0, zeros past it; uniform_rows views the same memory as mask rows.
  XqaDecodeMaskCache wide(4, 2);
  auto w3 = wide.get_decode_mask(3, std::nullopt, 4, true);
  ASSERT_TRUE(w3);
  EXPECT_EQ(w3->shape(), (Dims{4, 3, 2}));
  const auto wv = w3->to_vector<int32_t>();
  for (size_t i = 0; i < wv.size(); ++i)
    ASSERT_EQ(wv[i], i % 2 == 0 ? per_req[(i / 2) % per_req.size()] : 0) << i;
  const Tensor rows = wide.uniform_rows(3, 2, true);
  EXPECT_EQ(rows.shape(), (Dims{6, 2}));
  EXPECT_EQ(rows.data(), w3->data());
  EXPECT_EQ(wide.num_cached(), 1u);
  EXPECT_THROW(wide.uniform_rows(65, 1, true), InvalidArgument);  // 65 rows > 2 words of 32 bits
}

}  // namespace
}  // namespace kvattn
