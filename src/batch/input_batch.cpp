#include "kvattn/batch/input_batch.h"

#include "kvattn/batch/tensor_access.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace kvattn {
namespace {

// classify_request's rule as an inlinable, branch-free expression (the exported function may be
// interposed, so the hot loop does not call it).
inline int32_t region_of(int32_t num_scheduled, int32_t num_computed, int32_t num_prompt,
                         int32_t decode_threshold) noexcept {
  return num_computed <= 0 ? 3 : (num_scheduled > decode_threshold ? 2 : (num_computed < num_prompt ? 1 : 0));
}

}  // namespace

InputBatch::InputBatch(int64_t max_num_reqs, int64_t max_num_blocks_per_req)
    : max_num_reqs_(max_num_reqs), max_num_blocks_per_req_(max_num_blocks_per_req) {
  KVATTN_CHECK(max_num_reqs > 0 && max_num_reqs <= (int64_t{1} << 24),
               "InputBatch: max_num_reqs = {} must be in [1, 2^24]", max_num_reqs);
  KVATTN_CHECK(max_num_blocks_per_req > 0 && max_num_blocks_per_req <= (int64_t{1} << 24),
               "InputBatch: max_num_blocks_per_req = {} must be in [1, 2^24]; it is "
               "cdiv(max_model_len, block_size)", max_num_blocks_per_req);
  slot_.resize(static_cast<size_t>(max_num_reqs));
  for (int64_t i = 0; i < max_num_reqs; ++i) slot_[i] = static_cast<int32_t>(i);
  ids_.resize(static_cast<size_t>(max_num_reqs));
  mm_.resize(static_cast<size_t>(max_num_reqs));
  prompt_t_ = Tensor::zeros({max_num_reqs}, DType::i32);
  computed_t_ = Tensor::zeros({max_num_reqs}, DType::i32);
  scheduled_t_ = Tensor::zeros({max_num_reqs}, DType::i32);
  num_blocks_t_ = Tensor::zeros({max_num_reqs}, DType::i32);
  block_table_ = Tensor::zeros({max_num_reqs, max_num_blocks_per_req}, DType::i32);
  prompt_ = prompt_t_.data_ptr<int32_t>();
  computed_ = computed_t_.data_ptr<int32_t>();
  scheduled_ = scheduled_t_.data_ptr<int32_t>();
  num_blocks_ = num_blocks_t_.data_ptr<int32_t>();
  bt_ = block_table_.data_ptr<int32_t>();
  scratch_a_.assign(static_cast<size_t>(max_num_reqs), 0);
  scratch_b_.assign(static_cast<size_t>(max_num_reqs), 0);
  scratch_c_.assign(static_cast<size_t>(max_num_reqs), 0);
}

void InputBatch::check_row(int64_t row, const char* what) const {
  KVATTN_CHECK(row >= 0 && row < num_reqs_, "{}: request row {} is outside [0, {}) (num_reqs)",
               what, row, num_reqs_);
}

int64_t InputBatch::add_request(const RequestState& req) {
  KVATTN_CHECK(num_reqs_ < max_num_reqs_,
               "add_request({}): the batch is full ({} = max_num_reqs rows); raise max_num_reqs "
               "or schedule fewer requests", req.req_id, max_num_reqs_);
  KVATTN_CHECK(req.num_prompt_tokens >= 0 && req.num_computed_tokens >= 0 &&
                   req.num_scheduled_tokens >= 0,
               "add_request({}): counts must be >= 0, got num_prompt_tokens = {}, "
               "num_computed_tokens = {}, num_scheduled_tokens = {}",
               req.req_id, req.num_prompt_tokens, req.num_computed_tokens,
               req.num_scheduled_tokens);
  KVATTN_CHECK(static_cast<int64_t>(req.block_ids.size()) <= max_num_blocks_per_req_,
               "add_request({}): {} block ids do not fit a block-table row of {} "
               "(max_num_blocks_per_req); raise max_model_len", req.req_id, req.block_ids.size(),
               max_num_blocks_per_req_);
  for (size_t i = 0; i < req.block_ids.size(); ++i) {
    KVATTN_CHECK(req.block_ids[i] >= 0, "add_request({}): block id {} at column {} is negative",
                 req.req_id, req.block_ids[i], i);
  }
  const int64_t r = num_reqs_++;
  ids_[slot_[r]] = req.req_id;
  mm_[slot_[r]] = req.mm_features;
  prompt_[r] = req.num_prompt_tokens;
  computed_[r] = req.num_computed_tokens;
  scheduled_[r] = req.num_scheduled_tokens;
  num_blocks_[r] = static_cast<int32_t>(req.block_ids.size());
  std::copy(req.block_ids.begin(), req.block_ids.end(), bt_ + r * max_num_blocks_per_req_);
  return r;
}

void InputBatch::remove_request(int64_t row) {
  check_row(row, "remove_request");
  const int64_t last = num_reqs_ - 1;
  if (row != last) swap_states(row, last);
  --num_reqs_;  // the removed request's slot now sits past the end, free for the next add
}

const std::string& InputBatch::req_id(int64_t row) const {
  check_row(row, "req_id");
  return ids_[slot_[row]];
}

const std::vector<MultiModalFeature>& InputBatch::mm_features(int64_t row) const {
  check_row(row, "mm_features");
  return mm_[slot_[row]];
}

std::vector<std::string> InputBatch::req_ids() const {
  std::vector<std::string> out;
  out.reserve(size());
  for (int64_t r = 0; r < num_reqs_; ++r) out.push_back(ids_[slot_[r]]);
  return out;
}

std::vector<std::vector<MultiModalFeature>> InputBatch::mm_features() const {
  std::vector<std::vector<MultiModalFeature>> out;
  out.reserve(size());
  for (int64_t r = 0; r < num_reqs_; ++r) out.push_back(mm_[slot_[r]]);
  return out;
}

std::span<const int32_t> InputBatch::block_row(int64_t row) const {
  check_row(row, "block_row");
  return {bt_ + row * max_num_blocks_per_req_, static_cast<size_t>(num_blocks_[row])};
}

void InputBatch::append_block_ids(int64_t row, std::span<const int32_t> ids) {
  check_row(row, "append_block_ids");
  const int64_t n = num_blocks_[row];
  KVATTN_CHECK(n + static_cast<int64_t>(ids.size()) <= max_num_blocks_per_req_,
               "append_block_ids: request row {} ({}) would hold {} blocks, the row holds {} "
               "(max_num_blocks_per_req)", row, ids_[slot_[row]], n + ids.size(),
               max_num_blocks_per_req_);
  for (size_t i = 0; i < ids.size(); ++i) {
    KVATTN_CHECK(ids[i] >= 0, "append_block_ids: request row {}: block id {} is negative", row,
                 ids[i]);
  }
  std::copy(ids.begin(), ids.end(), bt_ + row * max_num_blocks_per_req_ + n);
  num_blocks_[row] = static_cast<int32_t>(n + static_cast<int64_t>(ids.size()));
}

inline void InputBatch::swap_rows(int64_t i1, int64_t i2) noexcept {
  ++num_swaps_;
  if (i1 == i2) return;
  std::swap(slot_[i1], slot_[i2]);
  std::swap(prompt_[i1], prompt_[i2]);
  std::swap(computed_[i1], computed_[i2]);
  std::swap(scheduled_[i1], scheduled_[i2]);
  // Only the used prefix of each block-table row carries state: exchange the common prefix, then
  // copy the longer row's rest one way (the shorter row's tail is unspecified after the swap).
  int32_t* a = bt_ + i1 * max_num_blocks_per_req_;
  int32_t* b = bt_ + i2 * max_num_blocks_per_req_;
  const int32_t na = num_blocks_[i1], nb = num_blocks_[i2];
  const int32_t common = std::min(na, nb);
  swap_block_ids(a, b, common);
  if (na > common) std::memcpy(b + common, a + common, sizeof(int32_t) * static_cast<size_t>(na - common));
  if (nb > common) std::memcpy(a + common, b + common, sizeof(int32_t) * static_cast<size_t>(nb - common));
  std::swap(num_blocks_[i1], num_blocks_[i2]);
}

void InputBatch::swap_states(int64_t i1, int64_t i2) {
  check_row(i1, "swap_states");
  check_row(i2, "swap_states");
  swap_rows(i1, i2);
}

BatchRegion classify_request(int32_t num_scheduled, int32_t num_computed, int32_t num_prompt,
                             int32_t decode_threshold) noexcept {
  return static_cast<BatchRegion>(region_of(num_scheduled, num_computed, num_prompt, decode_threshold));
}

bool reorder_batch_to_split_decodes_and_prefills(InputBatch& batch, int32_t decode_threshold) {
  const int64_t n = batch.num_reqs();
  const auto sched = batch.num_scheduled_tokens();
  const auto computed = batch.num_computed_tokens_cpu();
  const auto prompt = batch.num_prompt_tokens();
  auto region = batch.scratch_a();  // region of the request currently at each row
  auto dest = batch.scratch_b();    // dest[src] = row the request at src must move to, -1 = stays
  auto displaced = batch.scratch_c();

  // Each row's region and the region sizes (int32 lane sums: the pass vectorises), then whether
  // the rows are already in region order — the common steady state, where the reorder is these
  // two passes alone.
  int32_t n_short = 0, n_long = 0, n_prefill = 0;
  int32_t* reg = region.data();
  for (int64_t r = 0; r < n; ++r) {
    const int32_t g = region_of(sched[r], computed[r], prompt[r], decode_threshold);
    reg[r] = g;
    n_short += g == 1;
    n_long += g == 2;
    n_prefill += g == 3;
  }
  int32_t descents = 0;
  for (int64_t r = 1; r < n; ++r) descents += reg[r] < reg[r - 1];
  if (descents == 0) return false;
  const int64_t count[4] = {n - n_short - n_long - n_prefill, n_short, n_long, n_prefill};
  // Target region of row r: regions laid out as count[0] decodes, count[1] short extends, ...
  int64_t bound[4];
  bound[0] = count[0];
  for (int g = 1; g < 4; ++g) bound[g] = bound[g - 1] + count[g];
  // Displaced rows per region (counting sort keeps them stable within a region).
  int64_t per_region[4] = {0, 0, 0, 0};
  int64_t num_displaced = 0;
  for (int64_t r = 0, g = 0; r < n; ++r) {
    while (r >= bound[g]) ++g;
    dest[r] = -1;
    if (region[r] != g) {
      ++per_region[region[r]];
      displaced[num_displaced++] = static_cast<int32_t>(r);  // ascending target rows
    }
  }
  if (num_displaced == 0) return false;
  // src_order: displaced rows sorted (stably) by their current region; pair the k-th of them
  // with the k-th displaced row in ascending order.
  int64_t start[4];
  start[0] = 0;
  for (int g = 1; g < 4; ++g) start[g] = start[g - 1] + per_region[g - 1];
  // Reuse `region` for the sorted sources after reading each row's region once.
  for (int64_t k = 0; k < num_displaced; ++k) {
    const int32_t r = displaced[k];
    dest[r] = region[r];  // stash the region; replaced below
  }
  for (int64_t k = 0; k < num_displaced; ++k) {
    const int32_t r = displaced[k];
    const int32_t g = dest[r];
    region[start[g]++] = r;  // region[0..num_displaced) := sources in region order
  }
  for (int64_t k = 0; k < num_displaced; ++k) dest[region[k]] = displaced[k];
  // Walk each cycle from its first source (in source order), swapping through that row.
  for (int64_t k = 0; k < num_displaced; ++k) {
    const int32_t src = region[k];
    int32_t dst = dest[src];
    while (src != dst) {
      batch.swap_rows(src, dst);  // rows come from the walk: always in [0, num_reqs)
      const int32_t next = dest[dst];
      dest[dst] = dst;  // settled
      dst = next;
    }
    dest[src] = src;
  }
  return true;
}

}  // namespace kvattn
