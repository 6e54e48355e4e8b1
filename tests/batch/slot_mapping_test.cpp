// Slot mapping (vllm-facts §7.1), DCP local lengths, Mamba block tables and the step preparer.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <random>

#include "kvattn/batch/batch_preparer.h"
#include "kvattn/batch/slot_mapping.h"
#include "kvattn/batch/split.h"

namespace kvattn {
namespace {

// Brute-force oracle: walk the (kernel) block table token by token, rank by rank.  A rank owns
// the runs of I tokens dealt round-robin inside each virtual block of M * W tokens, and packs
// its tokens into kernel blocks in order.
int64_t oracle_slot(const std::vector<std::vector<int32_t>>& bt, int64_t row, int64_t pos,
                    int64_t bs, int64_t per_kv, int64_t W, int64_t rank, int64_t I) {
  const int64_t M = bs * per_kv;
  // Count this rank's tokens before `pos` (its local index) by enumeration.
  int64_t local_index = 0;
  bool mine = false;
  for (int64_t p = 0; p <= pos; ++p) {
    const int64_t vo = p % (M * W);
    const bool local = (vo / I) % W == rank;
    if (p == pos) mine = local;
    else if (local) ++local_index;
  }
  if (!mine) return PAD_SLOT_ID;
  return static_cast<int64_t>(bt[row][local_index / bs]) * bs + local_index % bs;
}

TEST(SlotMapping, HandComputedNoDcp) {
  // Two requests, block size 4.  Request 0: positions 5..7 -> block table [3, 9] column 1.
  // Request 1: positions 0..4 -> columns 0 and 1 of [2, 6].
  const std::vector<int32_t> qsl = {0, 3, 8};
  const std::vector<int64_t> pos = {5, 6, 7, 0, 1, 2, 3, 4};
  Tensor bt = Tensor::from_vector(std::vector<int32_t>{3, 9, 2, 6}, {2, 2});
  std::vector<int64_t> out(10, 77);
  SlotMappingParams p;
  p.block_size = 4;
  compute_slot_mapping(qsl, pos, host_block_table(bt), p, out);
  EXPECT_EQ(out, (std::vector<int64_t>{37, 38, 39, 8, 9, 10, 11, 24, -1, -1}));
}

TEST(SlotMapping, HandComputedDcpInterleave) {
  // W = 2, I = 2, block size 4: rank 0 owns positions 0,1, 4,5, 8,9 ...; its local tokens fill
  // its blocks in order: local index 0..3 -> block column 0, 4..7 -> column 1.
  const std::vector<int32_t> qsl = {0, 10};
  std::vector<int64_t> pos(10);
  for (int i = 0; i < 10; ++i) pos[i] = i;
  Tensor bt = Tensor::from_vector(std::vector<int32_t>{5, 7, 11}, {1, 3});
  SlotMappingParams p;
  p.block_size = 4;
  p.dcp_world_size = 2;
  p.cp_kv_cache_interleave_size = 2;
  std::vector<int64_t> out(10);
  p.dcp_rank = 0;
  compute_slot_mapping(qsl, pos, host_block_table(bt), p, out);
  EXPECT_EQ(out, (std::vector<int64_t>{20, 21, -1, -1, 22, 23, -1, -1, 28, 29}));
  p.dcp_rank = 1;
  compute_slot_mapping(qsl, pos, host_block_table(bt), p, out);
  EXPECT_EQ(out, (std::vector<int64_t>{-1, -1, 20, 21, -1, -1, 22, 23, -1, -1}));
}

TEST(SlotMapping, KernelBlockSplitting) {
  // Manager block 8 split into kernel blocks of 4: kernel table [[0,1, 8,9]] (ids of manager
  // blocks 0 and 4).  Position 10 -> kernel column 2 (id 8), offset 2 -> slot 34.
  const std::vector<int32_t> qsl = {0, 2};
  const std::vector<int64_t> pos = {3, 10};
  Tensor bt = Tensor::from_vector(std::vector<int32_t>{0, 1, 8, 9}, {1, 4});
  SlotMappingParams p;
  p.block_size = 4;
  p.blocks_per_kv_block = 2;
  std::vector<int64_t> out(2);
  compute_slot_mapping(qsl, pos, host_block_table(bt), p, out);
  EXPECT_EQ(out, (std::vector<int64_t>{3, 34}));
}

TEST(SlotMapping, RandomBatchesMatchBruteForceWalk) {
  std::mt19937 rng(31337);
  for (int iter = 0; iter < 3000; ++iter) {
    const int64_t bs = int64_t{1} << (rng() % 4);  // 1..8
    const int64_t per_kv = 1 + rng() % 3;
    const int64_t W = 1 + rng() % 3;
    const int64_t rank = rng() % W;
    const int64_t M = bs * per_kv;
    int64_t I = 1;
    for (int64_t c = 1 + rng() % M; c >= 1; --c) if (M % c == 0) { I = c; break; }
    const int n = 1 + static_cast<int>(rng() % 6);
    const int64_t width = 12;
    std::vector<std::vector<int32_t>> table(n, std::vector<int32_t>(width));
    std::vector<int32_t> flat;
    for (auto& row : table)
      for (auto& v : row) { v = static_cast<int32_t>(rng() % 500); flat.push_back(v); }
    Tensor bt = Tensor::from_vector(flat, {n, width});
    // Each request: context c, query q with all positions inside what the table covers.
    std::vector<int32_t> qsl{0}, seq;
    std::vector<int64_t> pos;
    const int64_t cap_local = width * bs;  // tokens one rank can hold per row
    for (int r = 0; r < n; ++r) {
      const int64_t max_len = cap_local * W - M * W;  // stay clear of the last virtual block
      const int64_t s = rng() % std::max<int64_t>(max_len, 1);
      const int64_t q = s == 0 ? 0 : static_cast<int64_t>(rng() % (s + 1));
      for (int64_t t = s - q; t < s; ++t) pos.push_back(t);
      qsl.push_back(qsl.back() + static_cast<int32_t>(q));
      seq.push_back(static_cast<int32_t>(s));
    }
    SlotMappingParams p{bs, per_kv, W, rank, I, 0};
    std::vector<int64_t> out(pos.size() + 3), out2(pos.size() + 3);
    compute_slot_mapping(qsl, pos, host_block_table(bt), p, out);
    compute_slot_mapping_from_seq_lens(qsl, seq, host_block_table(bt), p, out2,
                                       static_cast<int64_t>(out2.size()));
    for (int r = 0; r < n; ++r)
      for (int64_t t = qsl[r]; t < qsl[r + 1]; ++t)
        ASSERT_EQ(out[t], oracle_slot(table, r, pos[t], bs, per_kv, W, rank, I))
            << "iter " << iter << " row " << r << " pos " << pos[t];
    ASSERT_EQ(out, out2) << "iter " << iter;
    for (size_t t = pos.size(); t < out.size(); ++t) ASSERT_EQ(out[t], PAD_SLOT_ID);
  }
}

TEST(SlotMapping, InvalidInputsNameTheRow) {
  const std::vector<int32_t> qsl = {0, 1, 3};
  Tensor bt = Tensor::from_vector(std::vector<int32_t>{1, 2, 3, 4}, {2, 2});
  SlotMappingParams p;
  p.block_size = 4;
  std::vector<int64_t> out(3);
  auto expect_msg = [&](std::vector<int64_t> pos, const SlotMappingParams& pp, const char* needle) {
    try {
      compute_slot_mapping(qsl, pos, host_block_table(bt), pp, out);
      FAIL() << "expected InvalidArgument for " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_msg({0, 1, -5}, p, "request row 1: token 2 has position -5");
  expect_msg({0, 1, 8}, p, "request row 1: position 8 needs block-table column 2");  // too narrow
  SlotMappingParams pool = p;
  pool.num_blocks = 4;  // block id 4 at row 1 column 1 is outside [0, 4)
  expect_msg({0, 1, 5}, pool, "request row 1: block id 4");
  SlotMappingParams bad = p;
  bad.dcp_rank = 1;  // rank outside world 1
  EXPECT_THROW(compute_slot_mapping(qsl, std::vector<int64_t>{0, 1, 2}, host_block_table(bt), bad, out),
               InvalidArgument);
  // Too few output entries / decreasing start locations.
  std::vector<int64_t> small(2);
  EXPECT_THROW(compute_slot_mapping(qsl, std::vector<int64_t>{0, 1, 2}, host_block_table(bt), p, small),
               InvalidArgument);
  EXPECT_THROW(compute_slot_mapping(std::vector<int32_t>{0, 2, 1}, std::vector<int64_t>{0, 1, 2},
                                    host_block_table(bt), p, out),
               InvalidArgument);
  // Query longer than the sequence in the range form.
  EXPECT_THROW(compute_slot_mapping_from_seq_lens(qsl, std::vector<int32_t>{1, 1},
                                                  host_block_table(bt), p, out, 3),
               InvalidArgument);
  // Tensor form with a wrong dtype.
  EXPECT_THROW(compute_slot_mapping(Tensor::from_vector(qsl), Tensor::zeros({3}, DType::i32), bt, p),
               InvalidArgument);
}

TEST(DcpLocalSeqLens, AllThreeRankFormsAgreeWithCountingOracle) {
  std::mt19937 rng(17);
  for (int iter = 0; iter < 2000; ++iter) {
    const int64_t W = 1 + rng() % 8, I = 1 + rng() % 8;
    std::vector<int32_t> seq(1 + rng() % 20);
    for (auto& s : seq) s = static_cast<int32_t>(rng() % 300);
    Tensor t = Tensor::from_vector(seq);
    Tensor all = get_dcp_local_seq_lens(t, W, std::nullopt, I);
    ASSERT_EQ(all.shape(), (Dims{static_cast<int64_t>(seq.size()), W}));
    for (size_t i = 0; i < seq.size(); ++i) {
      int64_t sum = 0;
      for (int64_t k = 0; k < W; ++k) {
        int64_t count = 0;
        for (int64_t p = 0; p < seq[i]; ++p) count += ((p / I) % W == k);
        ASSERT_EQ(all.get({static_cast<int64_t>(i), k}), count);
        sum += count;
      }
      ASSERT_EQ(sum, seq[i]);  // local lengths sum over ranks to the global length
    }
    const int64_t rank = rng() % W;
    Tensor one = get_dcp_local_seq_lens(t, W, rank, I);
    Tensor via_tensor = get_dcp_local_seq_lens(t, W, Tensor::from_vector(std::vector<int32_t>{static_cast<int32_t>(rank)}), I);
    std::vector<int32_t> span_out(seq.size());
    get_dcp_local_seq_lens(seq, W, rank, I, span_out);
    for (size_t i = 0; i < seq.size(); ++i) {
      ASSERT_EQ(one.get({static_cast<int64_t>(i)}), all.get({static_cast<int64_t>(i), rank}));
      ASSERT_EQ(via_tensor.get({static_cast<int64_t>(i)}), one.get({static_cast<int64_t>(i)}));
      ASSERT_EQ(span_out[i], one.get({static_cast<int64_t>(i)}));
    }
  }
}

TEST(DcpLocalSeqLens, HandValuesAndErrors) {
  // seq 10, W 2, I 2: rank 0 owns 0,1,4,5,8,9 (6), rank 1 owns 2,3,6,7 (4).
  Tensor t = Tensor::from_vector(std::vector<int32_t>{10, 0, 3});
  EXPECT_EQ(get_dcp_local_seq_lens(t, 2, std::nullopt, 2).to_vector<int32_t>(),
            (std::vector<int32_t>{6, 4, 0, 0, 2, 1}));
  EXPECT_EQ(get_dcp_local_seq_lens(Tensor::from_vector(std::vector<int64_t>{10}), 2, 1, 2).to_vector<int32_t>(),
            (std::vector<int32_t>{4}));
  EXPECT_THROW(get_dcp_local_seq_lens(t, 2, 2, 1), InvalidArgument);  // rank out of range
  EXPECT_THROW(get_dcp_local_seq_lens(t, 0, 0, 1), InvalidArgument);
  EXPECT_THROW(get_dcp_local_seq_lens(Tensor::from_vector(std::vector<int32_t>{-4}), 2, 0, 1),
               InvalidArgument);
  EXPECT_THROW(get_dcp_local_seq_lens(t, 2, Tensor::from_vector(std::vector<int64_t>{0}), 1),
               InvalidArgument);  // tensor rank must be int32
}

TEST(MambaBlockTable, NoneAndAlign) {
  Tensor bt = Tensor::from_vector(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {3, 4});
  Tensor seq = Tensor::from_vector(std::vector<int32_t>{0, 17, 33});
  EXPECT_EQ(mamba_get_block_table_tensor(bt, seq, {16, 1}, "none").data(), bt.data());
  // block_size 16: starts max((s-1)//16, 0) = 0, 1, 2; two columns each.
  Tensor out = mamba_get_block_table_tensor(bt, seq, {16, 1}, "align");
  EXPECT_EQ(out.shape(), (Dims{3, 2}));
  EXPECT_EQ(out.to_vector<int32_t>(), (std::vector<int32_t>{1, 2, 6, 7, 11, 12}));
  // Strided (non-contiguous) block table view: every other column.
  Tensor strided = bt.slice(1, 0, 4, 2);  // [[1,3],[5,7],[9,11]]
  Tensor out2 = mamba_get_block_table_tensor(strided, Tensor::from_vector(std::vector<int32_t>{1, 20, 1}), {16, 0}, "align");
  EXPECT_EQ(out2.to_vector<int32_t>(), (std::vector<int32_t>{1, 7, 9}));
  EXPECT_THROW(mamba_get_block_table_tensor(bt, seq, {16, 2}, "align"), InvalidArgument);  // row 2 too narrow
  EXPECT_THROW(mamba_get_block_table_tensor(bt, Tensor::from_vector(std::vector<int32_t>{1, 2}), {16, 0}, "align"),
               InvalidArgument);  // row count mismatch
  EXPECT_THROW(mamba_get_block_table_tensor(bt, seq, {16, 0}, "sometimes"), InvalidArgument);
}

// ---- the step preparer ----------------------------------------------------------------

TEST(BatchPreparer, BuildsMetadataForAReorderedBatch) {
  BatchPreparerConfig cfg;
  cfg.max_num_reqs = 8;
  cfg.max_num_batched_tokens = 64;
  cfg.max_model_len = 64;
  cfg.block_size = 4;
  cfg.num_blocks = 100;
  BatchPreparer prep(cfg);
  InputBatch batch(8, cfg.max_num_blocks_per_req());
  batch.add_request({"p", 6, 0, 6, {10, 11}, {}});      // prefill 6 tokens at 0..5
  batch.add_request({"d", 5, 9, 1, {20, 21, 22}, {}});  // decode at position 9
  batch.add_request({"e", 20, 4, 3, {30, 31}, {}});     // long extend 4..6, still prefilling
  EXPECT_TRUE(reorder_batch_to_split_decodes_and_prefills(batch, 1));
  EXPECT_EQ(batch.req_ids(), (std::vector<std::string>{"d", "e", "p"}));
  const auto& cm = prep.prepare(batch);
  EXPECT_NO_THROW(cm.validate());
  EXPECT_EQ(cm.num_reqs, 3);
  EXPECT_EQ(cm.num_actual_tokens, 10);
  EXPECT_EQ(cm.max_query_len, 6);
  EXPECT_EQ(cm.max_seq_len, 10);
  EXPECT_EQ(cm.query_start_loc_cpu.to_vector<int32_t>(), (std::vector<int32_t>{0, 1, 4, 10}));
  EXPECT_EQ(cm.seq_lens.to_vector<int32_t>(), (std::vector<int32_t>{10, 7, 6}));
  EXPECT_EQ(cm.positions.to_vector<int64_t>(), (std::vector<int64_t>{9, 4, 5, 6, 0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(cm.is_prefilling.to_vector<uint8_t>(), (std::vector<uint8_t>{0, 1, 1}));
  // d: pos 9 -> block 22 off 1 = 89; e: 4,5,6 -> block 31 off 0..2 = 124..126; p: 40..43, 44, 45.
  EXPECT_EQ(cm.slot_mapping.to_vector<int64_t>(),
            (std::vector<int64_t>{89, 124, 125, 126, 40, 41, 42, 43, 44, 45}));
  EXPECT_EQ(split_decodes_and_prefills(cm, 1), (DecodePrefillSplit{1, 2, 1, 9}));
  EXPECT_EQ(cm.block_table_tensor.size(0), 3);
  EXPECT_EQ(cm.block_table_tensor.get({2, 1}), 11);

  // Next step: only the decode runs; the padded slot tail is PAD_SLOT_ID again, and the
  // CUDA-graph padding request has query and sequence length 0.
  batch.num_computed_tokens_cpu()[0] = 10;
  batch.num_computed_tokens_cpu()[1] = 7;
  batch.num_computed_tokens_cpu()[2] = 6;
  batch.num_scheduled_tokens()[1] = 0;
  batch.num_scheduled_tokens()[2] = 0;
  const auto& cm2 = prep.prepare(batch, 4, 8);
  EXPECT_EQ(cm2.num_actual_tokens, 1);
  EXPECT_EQ(cm2.num_reqs, 4);
  EXPECT_EQ(cm2.query_start_loc_cpu.to_vector<int32_t>(), (std::vector<int32_t>{0, 1, 1, 1, 1}));
  EXPECT_EQ(cm2.seq_lens.to_vector<int32_t>(), (std::vector<int32_t>{11, 7, 6, 0}));
  const int64_t* raw = cm2.slot_mapping.data_ptr<int64_t>();
  EXPECT_EQ(raw[0], 90);
  for (int t = 1; t < 64; ++t) ASSERT_EQ(raw[t], PAD_SLOT_ID) << t;  // whole buffer tail padded
}

TEST(BatchPreparer, RandomBatchesMatchBruteForce) {
  std::mt19937 rng(777);
  for (int iter = 0; iter < 1500; ++iter) {
    BatchPreparerConfig cfg;
    cfg.max_num_reqs = 16;
    cfg.max_num_batched_tokens = 512;
    cfg.max_model_len = 256;
    cfg.block_size = int64_t{1} << (rng() % 4);
    cfg.blocks_per_kv_block = 1 + rng() % 2;
    cfg.dcp_world_size = 1 + rng() % 3;
    cfg.dcp_rank = rng() % cfg.dcp_world_size;
    const int64_t M = cfg.block_size * cfg.blocks_per_kv_block;
    cfg.cp_kv_cache_interleave_size = (rng() % 2) ? 1 : M;
    cfg.num_blocks = 5000;
    BatchPreparer prep(cfg);
    const int64_t width = cfg.max_num_blocks_per_req();
    InputBatch b(16, width);
    std::vector<std::vector<int32_t>> table;
    const int n = 1 + static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) {
      RequestState r;
      r.req_id = fmt::format("r{}", i);
      r.num_computed_tokens = static_cast<int32_t>(rng() % 150);
      r.num_scheduled_tokens = static_cast<int32_t>(rng() % 40);
      r.num_prompt_tokens = static_cast<int32_t>(rng() % 200);
      for (int64_t k = 0; k < width; ++k) r.block_ids.push_back(static_cast<int32_t>(rng() % 5000));
      table.push_back(r.block_ids);
      b.add_request(r);
    }
    const auto& cm = prep.prepare(b);
    ASSERT_NO_THROW(cm.validate());
    const auto qsl = cm.query_start_loc_cpu.to_vector<int32_t>();
    const auto pos = cm.positions.to_vector<int64_t>();
    const auto slots = cm.slot_mapping.to_vector<int64_t>();
    int64_t total = 0;
    for (int r = 0; r < n; ++r) {
      const int64_t c = b.num_computed_tokens_cpu()[r], q = b.num_scheduled_tokens()[r];
      ASSERT_EQ(qsl[r + 1] - qsl[r], q);
      ASSERT_EQ(cm.seq_lens.get({r}), c + q);
      ASSERT_EQ(cm.is_prefilling.get({r}), c < b.num_prompt_tokens()[r] ? 1 : 0);
      for (int64_t i = 0; i < q; ++i) {
        ASSERT_EQ(pos[qsl[r] + i], c + i);
        ASSERT_EQ(slots[qsl[r] + i],
                  oracle_slot(table, r, c + i, cfg.block_size, cfg.blocks_per_kv_block,
                              cfg.dcp_world_size, cfg.dcp_rank, cfg.cp_kv_cache_interleave_size))
            << "iter " << iter << " row " << r << " token " << i;
      }
      total += q;
    }
    ASSERT_EQ(cm.num_actual_tokens, total);
    if (cfg.dcp_world_size > 1) {
      for (int r = 0; r < n; ++r) {
        int64_t count = 0;  // positions of this sequence stored on this rank
        for (int64_t p = 0; p < cm.seq_lens.get({r}); ++p)
          count += (p / cfg.cp_kv_cache_interleave_size) % cfg.dcp_world_size == cfg.dcp_rank;
        ASSERT_EQ(cm.dcp_local_seq_lens_cpu.get({r}), count);
      }
    }
  }
}

TEST(BatchPreparer, RejectsInvalidRowsNamingThem) {
  BatchPreparerConfig cfg;
  cfg.max_num_reqs = 4;
  cfg.max_num_batched_tokens = 16;
  cfg.max_model_len = 32;
  cfg.block_size = 4;
  cfg.num_blocks = 50;
  BatchPreparer prep(cfg);
  auto expect_msg = [&](InputBatch& b, const char* needle) {
    try {
      prep.prepare(b);
      FAIL() << "expected InvalidArgument: " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  {
    InputBatch b(4, cfg.max_num_blocks_per_req());
    b.add_request({"ok", 1, 3, 1, {1}, {}});
    b.add_request({"narrow", 9, 0, 9, {2, 3}, {}});  // 9 tokens need 3 blocks of 4
    expect_msg(b, "request row 1 (narrow): sequence length 9 needs 3 blocks");
  }
  {
    InputBatch b(4, cfg.max_num_blocks_per_req());
    b.add_request({"pool", 1, 0, 2, {77}, {}});  // block 77 outside [0, 50)
    expect_msg(b, "request row 0: block id 77");
  }
  {
    InputBatch b(4, cfg.max_num_blocks_per_req());
    b.add_request({"neg", 1, 3, 1, {1}, {}});
    b.num_computed_tokens_cpu()[0] = -2;
    expect_msg(b, "request row 0 (neg): num_computed_tokens = -2");
  }
  {
    InputBatch b(4, cfg.max_num_blocks_per_req());
    b.add_request({"long", 1, 30, 5, {1, 2, 3, 4, 5, 6, 7, 8}, {}});  // 35 > max_model_len 32
    expect_msg(b, "max_model_len = 32");
  }
  {
    InputBatch b(4, cfg.max_num_blocks_per_req());
    b.add_request({"a", 12, 0, 12, {1, 2, 3}, {}});
    b.add_request({"b", 8, 0, 8, {4, 5}, {}});  // 20 tokens > 16
    expect_msg(b, "request row 1 (b): the batch reaches 20 scheduled tokens");
  }
  {
    InputBatch b(4, cfg.max_num_blocks_per_req());
    b.add_request({"a", 1, 3, 1, {1}, {}});
    EXPECT_THROW(prep.prepare(b, 5), InvalidArgument);      // more padded rows than max
    EXPECT_THROW(prep.prepare(b, 1, 17), InvalidArgument);  // more padded tokens than max
  }
}

TEST(BatchPreparer, AnyBlockSizeMatchesBruteForceAndPadsAcrossSteps) {
  // Block sizes that are not powers of two take the division form of the row loop; the slot
  // buffer is re-padded across steps of different sizes (PAD_SLOT_ID past the tokens).
  std::mt19937 rng(91);
  for (int64_t bs : {1, 3, 12, 16, 24}) {
    BatchPreparerConfig cfg;
    cfg.max_num_reqs = 8;
    cfg.max_num_batched_tokens = 256;
    cfg.max_model_len = 200;
    cfg.block_size = bs;
    cfg.num_blocks = 9000;
    BatchPreparer prep(cfg);
    const int64_t width = cfg.max_num_blocks_per_req();
    for (int step = 0; step < 40; ++step) {
      InputBatch b(8, width);
      std::vector<std::vector<int32_t>> table;
      const int n = 1 + static_cast<int>(rng() % 8);
      for (int i = 0; i < n; ++i) {
        RequestState r;
        r.req_id = fmt::format("r{}", i);
        r.num_computed_tokens = static_cast<int32_t>(rng() % 150);
        r.num_scheduled_tokens = static_cast<int32_t>(rng() % 3 == 0 ? 1 : rng() % 30);
        r.num_prompt_tokens = static_cast<int32_t>(rng() % 200);
        for (int64_t k = 0; k < width; ++k) r.block_ids.push_back(static_cast<int32_t>(rng() % 9000));
        table.push_back(r.block_ids);
        b.add_request(r);
      }
      const int64_t padded = static_cast<int64_t>(rng() % 2) * 40;
      int64_t tokens = 0;
      for (int i = 0; i < n; ++i) tokens += b.num_scheduled_tokens()[i];
      const auto& cm = prep.prepare(b, -1, std::max<int64_t>(tokens, padded));
      const auto slots = cm.slot_mapping.to_vector<int64_t>();
      const auto qsl = cm.query_start_loc_cpu.to_vector<int32_t>();
      for (int r = 0; r < n; ++r) {
        const int64_t c = b.num_computed_tokens_cpu()[r];
        for (int64_t i = 0; i < qsl[r + 1] - qsl[r]; ++i)
          ASSERT_EQ(slots[qsl[r] + i], oracle_slot(table, r, c + i, bs, 1, 1, 0, 1)) << bs << " " << r;
      }
      // Past the tokens, the whole buffer is PAD_SLOT_ID (earlier, longer steps included).
      const int64_t* raw = cm.slot_mapping.data_ptr<int64_t>();
      for (int64_t t = tokens; t < cfg.max_num_batched_tokens; ++t) ASSERT_EQ(raw[t], PAD_SLOT_ID) << t;
    }
  }
}

TEST(BatchPreparer, PoolCheckNamesTheFirstBadBlockRead) {
  // One id outside the pool (or negative), planted in a column the step reads; every other id is
  // fine.  The error names its row, column and value; columns the step does not read are ignored.
  std::mt19937 rng(5);
  BatchPreparerConfig cfg;
  cfg.max_num_reqs = 8;
  cfg.max_num_batched_tokens = 512;
  cfg.max_model_len = 256;
  cfg.block_size = 4;
  cfg.num_blocks = 100;
  BatchPreparer prep(cfg);
  for (int iter = 0; iter < 200; ++iter) {
    InputBatch b(8, cfg.max_num_blocks_per_req());
    const int n = 1 + static_cast<int>(rng() % 8);
    for (int i = 0; i < n; ++i) {
      RequestState r;
      r.req_id = fmt::format("r{}", i);
      r.num_computed_tokens = static_cast<int32_t>(rng() % 100);
      r.num_scheduled_tokens = static_cast<int32_t>(1 + rng() % 20);
      r.num_prompt_tokens = 1;
      const int64_t blocks = (r.num_computed_tokens + r.num_scheduled_tokens + 3) / 4;
      for (int64_t k = 0; k < blocks; ++k) r.block_ids.push_back(static_cast<int32_t>(rng() % 100));
      b.add_request(r);
    }
    ASSERT_NO_THROW(prep.prepare(b));
    const int row = static_cast<int>(rng() % n);
    const int64_t c = b.num_computed_tokens_cpu()[row], end = c + b.num_scheduled_tokens()[row];
    const int64_t col = c / 4 + static_cast<int64_t>(rng() % ((end + 3) / 4 - c / 4));
    const int32_t bad = rng() % 2 ? 100 + static_cast<int32_t>(rng() % 50) : -1 - static_cast<int32_t>(rng() % 5);
    int32_t* bt = b.block_table().data_ptr<int32_t>();
    bt[row * b.max_num_blocks_per_req() + col] = bad;
    try {
      prep.prepare(b);
      FAIL() << "expected a pool error";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(fmt::format("request row {}: block id {} at block-table column {}",
                                                       row, bad, col)),
                std::string::npos) << e.what();
    }
    // A bad id in a column the step does not read is not an error.
    bt[row * b.max_num_blocks_per_req() + col] = 7;
    if (c / 4 > 0) {
      bt[row * b.max_num_blocks_per_req()] = -5;
      EXPECT_NO_THROW(prep.prepare(b));
    }
  }
}

TEST(BatchPreparer, LongDecodeRunsMatchBruteForceAndNameBadRows) {
  // Long runs of leading decodes (the AVX2 build takes them eight rows at a time), then extends:
  // every field against the oracle; then one bad value planted in a random row of the run (a
  // negative or too long context, a row too narrow, an id outside the pool, a token limit inside
  // the run) must be reported naming that row, as the row-by-row loop does.
  std::mt19937 rng(4242);
  for (int iter = 0; iter < 600; ++iter) {
    BatchPreparerConfig cfg;
    cfg.max_num_reqs = 80;
    cfg.max_model_len = 512;
    const int64_t sizes[] = {1, 2, 4, 8, 16, 12};
    cfg.block_size = sizes[rng() % 6];
    cfg.num_blocks = 5000;
    const int num_decodes = static_cast<int>(rng() % 70);
    const int num_extends = static_cast<int>(rng() % 5);
    const int n = num_decodes + num_extends;
    if (n == 0) continue;
    cfg.max_num_batched_tokens = 2048;
    BatchPreparer prep(cfg);
    const int64_t width = cfg.max_num_blocks_per_req();
    InputBatch b(80, width);
    std::vector<std::vector<int32_t>> table;
    for (int i = 0; i < n; ++i) {
      RequestState r;
      r.req_id = fmt::format("d{}", i);
      const bool decode = i < num_decodes;
      r.num_computed_tokens = static_cast<int32_t>(rng() % (decode ? 511 : 400));
      r.num_scheduled_tokens = decode ? 1 : static_cast<int32_t>(2 + rng() % 60);
      r.num_prompt_tokens = static_cast<int32_t>(rng() % 520);
      const int64_t need = (r.num_computed_tokens + r.num_scheduled_tokens + cfg.block_size - 1) / cfg.block_size;
      const int64_t blocks = need + static_cast<int64_t>(rng() % (width - need + 1));
      for (int64_t k = 0; k < blocks; ++k) r.block_ids.push_back(static_cast<int32_t>(rng() % 5000));
      table.push_back(r.block_ids);
      b.add_request(r);
    }
    {
      const auto& cm = prep.prepare(b);
      const auto qsl = cm.query_start_loc_cpu.to_vector<int32_t>();
      const auto pos = cm.positions.to_vector<int64_t>();
      const auto slots = cm.slot_mapping.to_vector<int64_t>();
      int64_t total = 0, max_q = 0, max_s = 0;
      for (int r = 0; r < n; ++r) {
        const int64_t c = b.num_computed_tokens_cpu()[r], q = b.num_scheduled_tokens()[r];
        ASSERT_EQ(qsl[r + 1], total + q) << "iter " << iter << " row " << r;
        ASSERT_EQ(cm.seq_lens.get({r}), c + q);
        ASSERT_EQ(cm.is_prefilling.get({r}), c < b.num_prompt_tokens()[r] ? 1 : 0) << r;
        for (int64_t i = 0; i < q; ++i) {
          ASSERT_EQ(pos[total + i], c + i);
          ASSERT_EQ(slots[total + i], oracle_slot(table, r, c + i, cfg.block_size, 1, 1, 0, 1))
              << "iter " << iter << " row " << r << " token " << i;
        }
        total += q;
        max_q = std::max(max_q, q);
        max_s = std::max(max_s, c + q);
      }
      ASSERT_EQ(cm.num_actual_tokens, total);
      ASSERT_EQ(cm.max_query_len, max_q);
      ASSERT_EQ(cm.max_seq_len, max_s);
    }
    if (num_decodes == 0) continue;
    const int row = static_cast<int>(rng() % num_decodes);
    const int64_t c = b.num_computed_tokens_cpu()[row];
    const std::string who = fmt::format("request row {} (d{})", row, row);
    std::string expected;
    switch (rng() % 5) {
      case 0:
        b.num_computed_tokens_cpu()[row] = -1 - static_cast<int32_t>(rng() % 3);
        expected = fmt::format("{}: num_computed_tokens = {}", who, b.num_computed_tokens_cpu()[row]);
        break;
      case 1:
        b.num_computed_tokens_cpu()[row] = static_cast<int32_t>(512 + rng() % 3);
        expected = fmt::format("{}: num_computed_tokens = {}", who, b.num_computed_tokens_cpu()[row]);
        break;
      case 2: {
        const int64_t need = (c + 1 + cfg.block_size - 1) / cfg.block_size;
        b.num_blocks_per_row()[row] = static_cast<int32_t>(need - 1);
        expected = fmt::format("{}: sequence length {} needs {} blocks", who, c + 1, need);
        break;
      }
      case 3: {
        int32_t* bt = b.block_table().data_ptr<int32_t>();
        const int64_t col = c / cfg.block_size;
        const int32_t bad = rng() % 2 ? 5000 + static_cast<int32_t>(rng() % 9) : -7;
        bt[row * width + col] = bad;
        expected = fmt::format("request row {}: block id {} at block-table column {}", row, bad, col);
        break;
      }
      default: {
        BatchPreparerConfig small = cfg;
        small.max_num_batched_tokens = row;  // row `row` is token number row + 1
        if (row == 0) continue;
        BatchPreparer tight(small);
        try {
          tight.prepare(b);
          FAIL() << "expected the token limit";
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find(fmt::format("{}: the batch reaches {} scheduled tokens",
                                                           who, row + 1)),
                    std::string::npos) << e.what();
        }
        continue;
      }
    }
    try {
      prep.prepare(b);
      FAIL() << "expected an error naming row " << row;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos)
          << "iter " << iter << ": " << e.what() << " / expected: " << expected;
    }
  }
}

TEST(BatchPreparer, DcpLocalLengthsAndSlots) {
  BatchPreparerConfig cfg;
  cfg.max_num_reqs = 4;
  cfg.max_num_batched_tokens = 64;
  cfg.max_model_len = 64;
  cfg.block_size = 4;
  cfg.dcp_world_size = 2;
  cfg.dcp_rank = 1;
  cfg.cp_kv_cache_interleave_size = 2;
  BatchPreparer prep(cfg);
  InputBatch b(4, cfg.max_num_blocks_per_req());
  b.add_request({"a", 10, 0, 10, {5, 7}, {}});  // rank 1 owns 2,3,6,7 -> local 4
  const auto& cm = prep.prepare(b);
  EXPECT_EQ(cm.dcp_local_seq_lens_cpu.to_vector<int32_t>(), (std::vector<int32_t>{4}));
  EXPECT_EQ(cm.slot_mapping.to_vector<int64_t>(),
            (std::vector<int64_t>{-1, -1, 20, 21, -1, -1, 22, 23, -1, -1}));
}

TEST(CpuGpuBuffer, AliasesOnCpu) {
  CpuGpuBuffer buf({5}, DType::i32, Device::cpu());
  EXPECT_TRUE(buf.aliased());
  buf.np<int32_t>()[2] = 9;
  EXPECT_EQ(buf.copy_to_gpu(3).get({2}), 9);
  EXPECT_EQ(buf.gpu().data(), buf.cpu().data());
  EXPECT_THROW(buf.copy_to_gpu(6), InvalidArgument);
}

}  // namespace
}  // namespace kvattn
