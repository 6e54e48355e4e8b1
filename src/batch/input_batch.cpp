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
  spare_row_.assign(static_cast<size_t>((max_num_blocks_per_req + 7) / 8 * 8), 0);
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
  for (int64_t row = 0; row < num_reqs_; ++row) {
    KVATTN_CHECK(ids_[slot_[row]] != req.req_id,
                 "add_request({}): the batch already holds this request id at row {}; request ids must "
                 "be unique (remove_request the old row first)", req.req_id, row);
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

namespace {

// Copies the first n ids of a block-table row (n <= room; both rows hold room ids).  Past n the
// destination row is unspecified, so whole 8-id (32-byte) steps are copied while they stay inside
// the row, an overlapping last step otherwise: no scalar tail.  Fixed-size memcpy compiles to
// vector moves (one ymm move in the AVX2 build of the walk, two xmm moves in the baseline one).
[[gnu::always_inline]] inline void copy_ids(int32_t* __restrict dst, const int32_t* __restrict src,
                                            int64_t n, int64_t room) noexcept {
  constexpr size_t kStep = 8 * sizeof(int32_t);
  if (((n + 7) & ~int64_t{7}) <= room) {
    for (int64_t i = 0; i < n; i += 8) std::memcpy(dst + i, src + i, kStep);
  } else if (n >= 8) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) std::memcpy(dst + i, src + i, kStep);
    if (i < n) std::memcpy(dst + n - 8, src + n - 8, kStep);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
  }
}

}  // namespace

// Applies the permutation `from` (from[x] = the row whose request moves to row x, for the
// displaced rows listed in `rows`; every other row stays) by rotating each cycle once through a
// spare row: a cycle of length k moves k rows plus the spare (k + 1 row copies) where k - 1 row
// swaps would move 2(k - 1) rows both ways, and ends in the same state (block-table entries past
// a row's used prefix are unspecified either way).  Counts k - 1 swaps per cycle, the seed's walk.
[[gnu::always_inline]] inline void InputBatch::rotate_cycles(int32_t* from, const int32_t* rows,
                                                             int64_t num_rows) noexcept {
  const int64_t width = max_num_blocks_per_req_;
  int32_t* spare = spare_row_.data();
  int64_t moved = 0;
  for (int64_t k = 0; k < num_rows; ++k) {
    const int32_t a = rows[k];
    if (from[a] == a) continue;  // already placed by an earlier cycle
    const int32_t a_slot = slot_[a], a_prompt = prompt_[a], a_computed = computed_[a],
                  a_sched = scheduled_[a], a_nblocks = num_blocks_[a];
    copy_ids(spare, bt_ + a * width, a_nblocks, width);
    int32_t cur = a;
    for (int32_t p = from[cur]; p != a; p = from[cur]) {
      {  // the row copied next (cycle rows are scattered over the table: start its lines now)
        const char* next = reinterpret_cast<const char*>(bt_ + from[p] * width);
        __builtin_prefetch(next);
        __builtin_prefetch(next + 64);
        __builtin_prefetch(next + 128);
      }
      from[cur] = cur;
      slot_[cur] = slot_[p];
      prompt_[cur] = prompt_[p];
      computed_[cur] = computed_[p];
      scheduled_[cur] = scheduled_[p];
      num_blocks_[cur] = num_blocks_[p];
      copy_ids(bt_ + cur * width, bt_ + p * width, num_blocks_[p], width);
      ++moved;
      cur = p;
    }
    from[cur] = cur;
    slot_[cur] = a_slot;
    prompt_[cur] = a_prompt;
    computed_[cur] = a_computed;
    scheduled_[cur] = a_sched;
    num_blocks_[cur] = a_nblocks;
    copy_ids(bt_ + cur * width, spare, a_nblocks, width);
  }
  num_swaps_ += moved;
}

void InputBatch::apply_reorder(int32_t* from, const int32_t* rows, int64_t num_rows) noexcept {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  if (host_has_avx2()) return apply_reorder_avx2(from, rows, num_rows);
#endif
  rotate_cycles(from, rows, num_rows);
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
[[gnu::target("avx2")]] void InputBatch::apply_reorder_avx2(int32_t* from, const int32_t* rows,
                                                            int64_t num_rows) noexcept {
  rotate_cycles(from, rows, num_rows);
}
#endif

bool reorder_batch_to_split_decodes_and_prefills(InputBatch& batch, int32_t decode_threshold) {
  const int64_t n = batch.num_reqs();
  const int32_t* sched = batch.scheduled_;
  const int32_t* computed = batch.computed_;
  const int32_t* prompt = batch.prompt_;
  int32_t* reg = batch.scratch_a_.data();   // region of the request currently at each row
  int32_t* from = batch.scratch_b_.data();  // from[dst] = row whose request moves to dst
  int32_t* displaced = batch.scratch_c_.data();

  // Each row's region and the region sizes (int32 lane sums: the pass vectorises), then whether
  // the rows are already in region order — the common steady state, where the reorder is these
  // two passes alone.
  int32_t n_short = 0, n_long = 0, n_prefill = 0;
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
  // Target region of row r: count[0] decodes, then count[1] short extends, ...
  const int32_t b0 = static_cast<int32_t>(n) - n_short - n_long - n_prefill;
  const int32_t b1 = b0 + n_short, b2 = b1 + n_long;
  // Displaced rows (region differs from the target region of their position), ascending, one
  // target range at a time (branch-free: the displaced test is a coin flip).  Region g supplies
  // as many displaced rows as its target range holds displaced positions, so the sources of
  // region g take the pairing slots [start[g], start[g + 1]).
  const int32_t n32 = static_cast<int32_t>(n);
  const int32_t lo[4] = {0, b0, b1, b2}, hi[4] = {b0, b1, b2, n32};
  int32_t start[4];
  int32_t num_displaced = 0;
  for (int32_t g = 0; g < 4; ++g) {
    start[g] = num_displaced;
    for (int32_t r = lo[g]; r < hi[g]; ++r) {
      displaced[num_displaced] = r;
      num_displaced += reg[r] != g;
    }
  }
  // Pair the k-th displaced row taken in region order (stable) with the k-th displaced row in
  // ascending order — the seed's assignment — by a counting sort whose four cursors stay in
  // registers.
  int32_t s0 = start[0], s1 = start[1], s2 = start[2], s3 = start[3];
  for (int32_t k = 0; k < num_displaced; ++k) {
    const int32_t r = displaced[k];
    const int32_t g = reg[r];
    const int32_t at = g == 0 ? s0 : (g == 1 ? s1 : (g == 2 ? s2 : s3));
    s0 += g == 0;
    s1 += g == 1;
    s2 += g == 2;
    s3 += g == 3;
    from[displaced[at]] = r;
  }
  batch.apply_reorder(from, displaced, num_displaced);
  return true;
}

}  // namespace kvattn
