// Paged-KV metadata (vllm-facts §7.5), cascade adjustment, DCP adjustment, get_seq_lens and the
// FlashAttention cascade decision (§7.4).
#include <gtest/gtest.h>

#include <random>

#include "kvattn/attention/paged_kv_metadata.h"
#include "kvattn/batch/slot_mapping.h"

namespace kvattn {
namespace {

struct MetadataInputs {
  Tensor qsl, seq, bt;
  CommonAttentionMetadata cm;
};

MetadataInputs make(const std::vector<int32_t>& q, const std::vector<int32_t>& seq,
             const std::vector<std::vector<int32_t>>& table, int64_t width) {
  MetadataInputs f;
  std::vector<int32_t> qsl{0};
  for (int32_t x : q) qsl.push_back(qsl.back() + x);
  std::vector<int32_t> flat;
  for (const auto& row : table) {
    auto r = row;
    r.resize(static_cast<size_t>(width), -7);  // poison past the used columns
    flat.insert(flat.end(), r.begin(), r.end());
  }
  f.qsl = Tensor::from_vector(qsl);
  f.seq = Tensor::from_vector(seq);
  f.bt = Tensor::from_vector(flat, {static_cast<int64_t>(table.size()), width});
  f.cm.query_start_loc = f.cm.query_start_loc_cpu = f.qsl;
  f.cm.seq_lens = f.cm.seq_lens_cpu_upper_bound = f.seq;
  f.cm.num_reqs = static_cast<int64_t>(q.size());
  f.cm.num_actual_tokens = qsl.back();
  f.cm.block_table_tensor = f.bt;
  return f;
}

PagedKVMetadataConfig config(int64_t page, int64_t max_reqs = 8, int64_t max_len = 256) {
  PagedKVMetadataConfig c;
  c.page_size = page;
  c.max_num_reqs = max_reqs;
  c.max_model_len = max_len;
  return c;
}

TEST(PagedKV, HandComputed) {
  // page 4: seq 9 -> 3 pages (last 1), seq 8 -> 2 pages (last 4), seq 0 -> 0 pages (last 0),
  // seq 1 -> 1 page (last 1).
  auto f = make({1, 1, 0, 1}, {9, 8, 0, 1}, {{5, 6, 7}, {8, 9}, {}, {3}}, 4);
  PagedKVMetadataBuilder b(config(4));
  const auto& md = b.build(f.cm, 4);
  EXPECT_EQ(md.paged_kv_indptr_cpu.to_vector<int32_t>(), (std::vector<int32_t>{0, 3, 5, 5, 6}));
  EXPECT_EQ(md.paged_kv_indices.to_vector<int32_t>(), (std::vector<int32_t>{5, 6, 7, 8, 9, 3}));
  EXPECT_EQ(md.paged_kv_last_page_len_cpu.to_vector<int32_t>(), (std::vector<int32_t>{1, 4, 0, 1}));
  EXPECT_EQ(get_seq_lens(md.paged_kv_indptr_cpu, md.paged_kv_last_page_len_cpu, 4).to_vector<int32_t>(),
            (std::vector<int32_t>{9, 8, 0, 1}));
  EXPECT_FALSE(md.use_cascade);
  EXPECT_EQ(md.num_actual_pages, 6);
}

TEST(PagedKV, CascadeDropsSharedPrefixBlocks) {
  // Shared prefix of 8 tokens = 2 pages of 4, held by every request in columns 0..1.
  auto f = make({1, 2, 3}, {11, 9, 8}, {{1, 2, 10, 11}, {1, 2, 20, 21}, {1, 2}}, 4);
  PagedKVMetadataBuilder b(config(4));
  const auto& md = b.build(f.cm, 1, 8);
  EXPECT_TRUE(md.use_cascade);
  EXPECT_EQ(md.num_common_kv_blocks, 2);
  EXPECT_EQ(md.paged_kv_indptr_cpu.to_vector<int32_t>(), (std::vector<int32_t>{0, 1, 2, 2}));
  EXPECT_EQ(md.paged_kv_indices.to_vector<int32_t>(), (std::vector<int32_t>{10, 20}));
  EXPECT_EQ(md.paged_kv_last_page_len_cpu.to_vector<int32_t>(), (std::vector<int32_t>{3, 1, 4}));
  EXPECT_EQ(md.shared_qo_indptr, (std::array<int32_t, 2>{0, 6}));
  EXPECT_EQ(md.shared_kv_page_indptr, (std::array<int32_t, 2>{0, 2}));
  EXPECT_EQ(md.shared_kv_page_indices.to_vector<int32_t>(), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(md.shared_kv_last_page_len, 4);
  EXPECT_THROW(b.build(f.cm, 1, 6), InvalidArgument);   // not a page multiple
  EXPECT_THROW(b.build(f.cm, 1, 12), InvalidArgument);  // longer than request 2 (2 pages)
}

TEST(PagedKV, DcpDropsPrefillQueriesThenTakesLocalShare) {
  // W = 2, rank 0, I = 1, page 2.  Row 0 is a decode (seq 7 -> local 4 -> 2 pages, last 2);
  // row 1 is a prefill (seq 10, query 4 -> context 6 -> local 3 -> 2 pages, last 1).
  auto f = make({1, 4}, {7, 10}, {{4, 5}, {6, 7}}, 4);
  auto c = config(2);
  c.dcp_world_size = 2;
  PagedKVMetadataBuilder b(c);
  const auto& md = b.build(f.cm, 1);
  EXPECT_EQ(md.seq_lens_cpu.to_vector<int32_t>(), (std::vector<int32_t>{4, 3}));
  EXPECT_EQ(md.paged_kv_indptr_cpu.to_vector<int32_t>(), (std::vector<int32_t>{0, 2, 4}));
  EXPECT_EQ(md.paged_kv_last_page_len_cpu.to_vector<int32_t>(), (std::vector<int32_t>{2, 1}));
  // The caller's sequence lengths are not modified.
  EXPECT_EQ(f.seq.to_vector<int32_t>(), (std::vector<int32_t>{7, 10}));
  // A prefill row whose query is longer than its sequence is rejected, naming the row.
  auto g = make({1, 12}, {7, 10}, {{4, 5}, {6, 7}}, 4);
  try {
    b.build(g.cm, 1);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("request row 1: query length 12"), std::string::npos) << e.what();
  }
}

TEST(PagedKV, RandomBatchesMatchBruteForce) {
  std::mt19937 rng(4242);
  for (int iter = 0; iter < 3000; ++iter) {
    const int64_t page = int64_t{1} << (rng() % 5);
    const int n = 1 + static_cast<int>(rng() % 10);
    const int64_t W = (rng() % 3 == 0) ? 1 + rng() % 3 : 1;
    const int64_t rank = rng() % W, I = 1 + rng() % 3;
    const int num_decodes = static_cast<int>(rng() % (n + 1));
    const int64_t ncb = (W == 1 && rng() % 3 == 0) ? rng() % 3 : 0;
    std::vector<int32_t> q(n), seq(n);
    std::vector<std::vector<int32_t>> table(n);
    const int64_t width = 40;
    for (int r = 0; r < n; ++r) {
      seq[r] = static_cast<int32_t>(ncb * page + rng() % (30 * page));
      q[r] = static_cast<int32_t>(r < num_decodes ? 1 : rng() % (seq[r] + 1));
      if (q[r] > seq[r]) q[r] = seq[r];
      for (int k = 0; k < width; ++k) table[r].push_back(static_cast<int32_t>(rng() % 1000));
    }
    auto f = make(q, seq, table, width);
    auto c = config(page, 16, 40 * page);
    c.dcp_world_size = W;
    c.dcp_rank = rank;
    c.cp_kv_cache_interleave_size = I;
    PagedKVMetadataBuilder b(c);
    const auto& md = b.build(f.cm, num_decodes, ncb * page);
    // Oracle.
    std::vector<int32_t> indptr{0}, indices, last;
    for (int r = 0; r < n; ++r) {
      int64_t s = seq[r];
      if (W > 1) {
        if (r >= num_decodes) s -= q[r];
        int64_t count = 0;
        for (int64_t p = 0; p < s; ++p) count += ((p / I) % W == rank);
        s = count;
      }
      const int64_t pages = (s + page - 1) / page - ncb;
      for (int64_t i = 0; i < pages; ++i) indices.push_back(table[r][ncb + i]);
      indptr.push_back(indptr.back() + static_cast<int32_t>(pages));
      last.push_back(static_cast<int32_t>(s == 0 ? 0 : (s % page == 0 ? page : s % page)));
    }
    ASSERT_EQ(md.paged_kv_indptr_cpu.to_vector<int32_t>(), indptr) << "iter " << iter;
    ASSERT_EQ(md.paged_kv_indices.to_vector<int32_t>(), indices) << "iter " << iter;
    ASSERT_EQ(md.paged_kv_last_page_len.to_vector<int32_t>(), last) << "iter " << iter;
    if (ncb == 0) {
      // get_seq_lens inverts the page description.
      ASSERT_EQ(get_seq_lens(md.paged_kv_indptr_cpu, md.paged_kv_last_page_len_cpu, page).to_vector<int32_t>(),
                md.seq_lens_cpu.to_vector<int32_t>());
    }
  }
}

TEST(PagedKV, InvalidInputs) {
  PagedKVMetadataBuilder b(config(4, 4, 32));
  auto narrow = make({1}, {13}, {{1, 2, 3}}, 3);  // 13 tokens need 4 pages, row holds 3
  try {
    b.build(narrow.cm, 1);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("request row 0: needs block-table columns [0, 4)"),
              std::string::npos) << e.what();
  }
  auto c = config(4, 4, 32);
  c.num_blocks = 10;
  PagedKVMetadataBuilder pool(c);
  auto bad_id = make({1, 1}, {4, 8}, {{1}, {2, 12}}, 2);
  try {
    pool.build(bad_id.cm, 2);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("request row 1: block id 12 at block-table column 1"),
              std::string::npos) << e.what();
  }
  auto neg = make({1}, {-3}, {{1}}, 1);
  EXPECT_THROW(b.build(neg.cm, 1), InvalidArgument);
  auto many = make({1, 1, 1, 1, 1}, {1, 1, 1, 1, 1}, {{1}, {1}, {1}, {1}, {1}}, 1);
  EXPECT_THROW(b.build(many.cm, 5), InvalidArgument);  // 5 requests > max_num_reqs 4
  auto ok = make({1}, {4}, {{1}}, 1);
  EXPECT_THROW(b.build(ok.cm, 2), InvalidArgument);  // num_decodes > num_reqs
  EXPECT_THROW(PagedKVMetadataBuilder(config(0)), InvalidArgument);
}

TEST(PagedKV, CopyPageIndicesStridedTable) {
  // A column-strided view (every other column) must be gathered element by element.
  Tensor full = Tensor::from_vector(std::vector<int32_t>{1, 100, 2, 100, 3, 100, 4, 100}, {2, 4});
  Tensor view = full.slice(1, 0, 4, 2);  // [[1, 2], [3, 4]]
  std::vector<int32_t> out(3, -1);
  copy_page_indices(out, host_block_table(view), std::vector<int32_t>{0, 2, 3});
  EXPECT_EQ(out, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_THROW(copy_page_indices(out, host_block_table(view), std::vector<int32_t>{0, 3, 3}),
               InvalidArgument);  // row 0 needs 3 columns of 2
  EXPECT_THROW(copy_page_indices(out, host_block_table(view), std::vector<int32_t>{0, 2, 5}),
               InvalidArgument);  // beyond the output
}

TEST(PagedKV, GatherBlockRowsMatchesOracleAndFindsTheFirstBadRow) {
  // Row lengths 0..40 (the vector form's full steps, overlapping last step and short rows), ids
  // checked against a pool bound, one bad id planted anywhere (negative ids included).
  std::mt19937 rng(17);
  for (int iter = 0; iter < 2000; ++iter) {
    const int64_t rows = 1 + rng() % 9, width = 48, col0 = rng() % 4;
    std::vector<int32_t> table(rows * width);
    for (auto& x : table) x = static_cast<int32_t>(rng() % 1000);
    std::vector<int32_t> indptr{0};
    for (int64_t r = 0; r < rows; ++r) indptr.push_back(indptr.back() + static_cast<int32_t>(rng() % 41));
    int64_t bad_row = -1;
    const uint32_t limit = rng() % 2 ? 1000u : block_id_limit(0);
    if (rng() % 3 == 0) {
      const int64_t r = rng() % rows;
      const int64_t n = indptr[r + 1] - indptr[r];
      if (n > 0) {
        table[r * width + col0 + rng() % n] = limit == 1000u && rng() % 2 ? 1000 + static_cast<int32_t>(rng() % 9) : -3;
        bad_row = r;
      }
    }
    int64_t expect_bad = -1;
    std::vector<int32_t> expect;
    for (int64_t r = 0; r < rows && expect_bad < 0; ++r)
      for (int64_t i = 0; i < indptr[r + 1] - indptr[r]; ++i) {
        const int32_t v = table[r * width + col0 + i];
        expect.push_back(v);
        if (static_cast<uint32_t>(v) >= limit) expect_bad = r;
      }
    ASSERT_EQ(expect_bad, bad_row);
    std::vector<int32_t> out(indptr.back() + 8, -99);
    const int64_t got = gather_block_rows(out.data(), table.data(), width, col0, indptr.data(), rows, limit);
    ASSERT_EQ(got, bad_row) << iter;
    if (got < 0) {
      ASSERT_EQ(std::vector<int32_t>(out.begin(), out.begin() + indptr.back()), expect) << iter;
      for (size_t i = indptr.back(); i < out.size(); ++i) ASSERT_EQ(out[i], -99);  // no overrun
    }
  }
}

TEST(PagedKV, SharedStepsNameTheRow) {
  // compute_paged_kv_indptr: negative length, shorter than the shared prefix, narrower than the
  // table, more pages than the capacity; the valid case writes the seed's last-page lengths.
  std::vector<int32_t> indptr(5), last(4);
  const std::vector<int32_t> seq{9, 8, 0, 17};
  EXPECT_EQ(compute_paged_kv_indptr(seq.data(), 4, 4, 0, 5, 100, indptr.data(), last.data()), 10);
  EXPECT_EQ(indptr, (std::vector<int32_t>{0, 3, 5, 5, 10}));
  EXPECT_EQ(last, (std::vector<int32_t>{1, 4, 0, 1}));
  auto expect_msg = [](auto&& fn, const char* needle) {
    try {
      fn();
      FAIL() << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const std::vector<int32_t> neg{4, -2};
  expect_msg([&] { compute_paged_kv_indptr(neg.data(), 2, 4, 0, 5, 100, indptr.data(), last.data()); },
             "request row 1: sequence length -2 is negative");
  expect_msg([&] { compute_paged_kv_indptr(seq.data(), 4, 4, 1, 5, 100, indptr.data(), last.data()); },
             "request row 2: 0 pages, fewer than the 1 shared prefix pages");
  expect_msg([&] { compute_paged_kv_indptr(seq.data(), 4, 4, 0, 4, 100, indptr.data(), last.data()); },
             "request row 3: needs block-table columns [0, 5) but the row holds 4");
  expect_msg([&] { compute_paged_kv_indptr(seq.data(), 4, 4, 0, 5, 9, indptr.data(), last.data()); },
             "the batch needs 10 pages but the builder holds 9");
  // paged_kv_host_seq_lens: query longer than the sequence, negative query.
  auto f = make({1, 5}, {7, 4}, {{1, 2}, {3}}, 2);
  expect_msg([&] { paged_kv_host_seq_lens(f.cm, host_i32_span(f.qsl, "qsl"), 2, true, Tensor()); },
             "request row 1: query length 5 exceeds its sequence length 4");
  // Speculative tokens in flight: seq_lens is read instead of the upper bound.
  auto g = make({1, 1}, {7, 4}, {{1, 2}, {3}}, 2);
  g.cm.seq_lens_cpu_upper_bound = Tensor::from_vector(std::vector<int32_t>{9, 9});
  const int32_t* exact = paged_kv_host_seq_lens(g.cm, host_i32_span(g.qsl, "qsl"), 2, false, Tensor());
  EXPECT_EQ(exact[0], 7);
  EXPECT_EQ(paged_kv_host_seq_lens(g.cm, host_i32_span(g.qsl, "qsl"), 2, true, Tensor())[0], 9);
  // dcp_paged_kv_seq_lens: decodes keep their query, prefills drop it; in place.
  std::vector<int32_t> s2{7, 10};
  const std::vector<int32_t> q2{0, 1, 5};
  dcp_paged_kv_seq_lens(s2.data(), q2, 2, 1, 2, 0, 1, s2.data());
  EXPECT_EQ(s2, (std::vector<int32_t>{4, 3}));  // 7 -> 4 on rank 0; 10 - 4 = 6 -> 3
}

TEST(CascadeDecision, FlashAttentionRule) {
  std::vector<int32_t> decodes(16, 1), mixed(16, 1);
  mixed[3] = 7;
  CascadeAttentionQuery q;
  q.common_prefix_len = 1024;
  q.query_lens = decodes;
  q.num_query_heads = 32;
  q.num_kv_heads = 8;
  q.num_sms = 132;
  // Flash decoding applies (GQA, all decodes): cascade = cdiv(32 * 1, 132) * 8 = 8,
  // flash decoding = cdiv(16 * 8 * 1 * 8, 132) = 8 -> not faster.
  EXPECT_FALSE(use_cascade_attention(q));
  std::vector<int32_t> many(512, 1);
  q.query_lens = many;  // cascade = cdiv(32*4,132)*8 = 8, fd = cdiv(512*8*8,132) = 249
  EXPECT_TRUE(use_cascade_attention(q));
  q.query_lens = mixed;  // not all decodes -> cascade
  EXPECT_TRUE(use_cascade_attention(q));
  q.common_prefix_len = 255;
  EXPECT_FALSE(use_cascade_attention(q));
  q.common_prefix_len = 1024;
  q.use_sliding_window = true;
  EXPECT_FALSE(use_cascade_attention(q));
  q.use_sliding_window = false;
  q.dcp_world_size = 2;
  EXPECT_FALSE(use_cascade_attention(q));
  q.dcp_world_size = 1;
  std::vector<int32_t> few(7, 3);
  q.query_lens = few;
  EXPECT_FALSE(use_cascade_attention(q));
  q.query_lens = decodes;
  q.num_kv_heads = 32;  // MHA: no flash decoding -> cascade
  EXPECT_TRUE(use_cascade_attention(q));
}

}  // namespace
}  // namespace kvattn
