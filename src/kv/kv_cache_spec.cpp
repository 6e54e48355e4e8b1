// The KV cache spec family (see kv_cache_spec.h).
#include "kvattn/kv/kv_cache_spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "kvattn/core/error.h"
#include "kv_math.h"

namespace kvattn {

using kvmath::cdiv;
using kvmath::checked_mul;
using kvmath::round_up;

// ---------------------------------------------------------------------------------------
// Quant mode

namespace {
struct QuantName {
  KVQuantMode mode;
  const char* name;
};
constexpr QuantName kQuantNames[] = {
    {KVQuantMode::NONE, "NONE"},
    {KVQuantMode::FP8_PER_TENSOR, "FP8_PER_TENSOR"},
    {KVQuantMode::INT8_PER_TOKEN_HEAD, "INT8_PER_TOKEN_HEAD"},
    {KVQuantMode::FP8_PER_TOKEN_HEAD, "FP8_PER_TOKEN_HEAD"},
    {KVQuantMode::INT4_PER_TOKEN_HEAD, "INT4_PER_TOKEN_HEAD"},
    {KVQuantMode::NVFP4, "NVFP4"},
    {KVQuantMode::TURBOQUANT_K8V4, "TURBOQUANT_K8V4"},
    {KVQuantMode::TURBOQUANT_4BIT_NC, "TURBOQUANT_4BIT_NC"},
    {KVQuantMode::TURBOQUANT_K3V4_NC, "TURBOQUANT_K3V4_NC"},
    {KVQuantMode::TURBOQUANT_3BIT_NC, "TURBOQUANT_3BIT_NC"},
    {KVQuantMode::NVFP4_DS_MLA, "NVFP4_DS_MLA"},
};

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
}  // namespace

const char* kv_quant_mode_name(KVQuantMode mode) noexcept {
  for (const auto& q : kQuantNames)
    if (q.mode == mode) return q.name;
  return "?";
}

bool is_per_token_head(KVQuantMode m) noexcept {
  return m == KVQuantMode::INT8_PER_TOKEN_HEAD || m == KVQuantMode::FP8_PER_TOKEN_HEAD ||
         m == KVQuantMode::INT4_PER_TOKEN_HEAD;
}
bool is_nvfp4(KVQuantMode m) noexcept { return m == KVQuantMode::NVFP4; }

KVQuantMode get_kv_quant_mode(std::string_view s) {
  if (s == "int4_per_token_head") return KVQuantMode::INT4_PER_TOKEN_HEAD;
  if (s == "int8_per_token_head") return KVQuantMode::INT8_PER_TOKEN_HEAD;
  if (s == "fp8_per_token_head") return KVQuantMode::FP8_PER_TOKEN_HEAD;
  if (s == "nvfp4_ds_mla") return KVQuantMode::NVFP4_DS_MLA;
  if (starts_with(s, "nvfp4")) return KVQuantMode::NVFP4;
  if (starts_with(s, "turboquant_")) {
    std::string upper(s);
    for (auto& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    for (const auto& q : kQuantNames)
      if (upper == q.name) return q.mode;
    throw InvalidArgument(fmt::format(
        "Unknown TurboQuant KV cache dtype '{}'; valid: turboquant_k8v4, turboquant_4bit_nc, "
        "turboquant_k3v4_nc, turboquant_3bit_nc",
        s));
  }
  if (starts_with(s, "fp8")) return KVQuantMode::FP8_PER_TENSOR;
  return KVQuantMode::NONE;
}

bool is_quantized_kv_cache(std::string_view s) { return get_kv_quant_mode(s) != KVQuantMode::NONE; }

KVQuantMode get_kv_quant_mode(KVCacheDType t) noexcept {
  if (is_fp8(t)) return KVQuantMode::FP8_PER_TENSOR;
  if (is_nvfp4(t)) return KVQuantMode::NVFP4;
  return KVQuantMode::NONE;
}

const char* kv_cache_spec_kind_name(KVCacheSpecKind kind) noexcept {
  switch (kind) {
    case KVCacheSpecKind::FullAttention: return "full_attention";
    case KVCacheSpecKind::MLAAttention: return "mla_attention";
    case KVCacheSpecKind::SlidingWindow: return "sliding_window";
    case KVCacheSpecKind::SlidingWindowMLA: return "sliding_window_mla";
    case KVCacheSpecKind::Mamba: return "mamba";
    case KVCacheSpecKind::ChunkedLocalAttention: return "chunked_local_attention";
    case KVCacheSpecKind::SinkFullAttention: return "sink_full_attention";
    case KVCacheSpecKind::EncoderOnlyAttention: return "encoder_only_attention";
    case KVCacheSpecKind::CrossAttention: return "cross_attention";
    case KVCacheSpecKind::UniformType: return "uniform_type";
    case KVCacheSpecKind::Unknown: return "unknown";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------------------
// KVCacheSpec

KVCacheSpec::KVCacheSpec(int64_t block_size) : block_size_(block_size) {
  KVATTN_CHECK(block_size > 0, "KV cache spec block_size must be a positive number of tokens, got {}", block_size);
}

int64_t KVCacheSpec::get_num_kernel_states(int64_t kernel_block_size) const {
  Fraction t = tokens_per_state();
  if (t.num <= 0) return 1;
  return checked_mul(kernel_block_size, t.den, "get_num_kernel_states") / t.num;
}

int64_t KVCacheSpec::unpadded_page_size_bytes() const {
  return checked_mul(checked_mul(num_heads(), num_states(), "page size"), state_content_size_bytes(), "page size");
}

int64_t KVCacheSpec::page_size_bytes() const {
  auto padded = page_size_padded();
  return padded ? *padded : unpadded_page_size_bytes();
}

int64_t KVCacheSpec::max_num_blocks_per_req(const KVCacheLimits&, int64_t max_len) const {
  KVATTN_CHECK(max_len >= 0, "max_num_blocks_per_req: max_len must be >= 0, got {}", max_len);
  return cdiv(max_len, block_size_);
}

// ---------------------------------------------------------------------------------------
// AttentionSpec

namespace {
bool is_attention_kind(KVCacheSpecKind k) {
  return k != KVCacheSpecKind::Mamba && k != KVCacheSpecKind::UniformType && k != KVCacheSpecKind::Unknown;
}
const char* attention_class_name(KVCacheSpecKind k) {
  switch (k) {
    case KVCacheSpecKind::FullAttention: return "FullAttentionSpec";
    case KVCacheSpecKind::MLAAttention: return "MLAAttentionSpec";
    case KVCacheSpecKind::SlidingWindow: return "SlidingWindowSpec";
    case KVCacheSpecKind::SlidingWindowMLA: return "SlidingWindowMLASpec";
    case KVCacheSpecKind::ChunkedLocalAttention: return "ChunkedLocalAttentionSpec";
    case KVCacheSpecKind::SinkFullAttention: return "SinkFullAttentionSpec";
    case KVCacheSpecKind::EncoderOnlyAttention: return "EncoderOnlyAttentionSpec";
    case KVCacheSpecKind::CrossAttention: return "CrossAttentionSpec";
    default: return "AttentionSpec";
  }
}
std::string opt_str(const std::optional<int64_t>& v) { return v ? std::to_string(*v) : "None"; }

void check_limits(const KVCacheLimits& l) {
  KVATTN_CHECK(l.max_model_len >= 0 && l.max_num_batched_tokens >= 0 && l.max_num_encoder_input_tokens >= 0,
               "KVCacheLimits must not be negative (max_model_len={}, max_num_batched_tokens={}, "
               "max_num_encoder_input_tokens={})",
               l.max_model_len, l.max_num_batched_tokens, l.max_num_encoder_input_tokens);
  KVATTN_CHECK(l.decode_context_parallel_size >= 1,
               "decode_context_parallel_size must be >= 1, got {}", l.decode_context_parallel_size);
}
}  // namespace

AttentionSpec::AttentionSpec(KVCacheSpecKind kind, int64_t block_size, int64_t num_kv_heads, int64_t head_size,
                             DType dtype, AttentionSpecOptions options)
    : KVCacheSpec(block_size),
      kind_(kind),
      num_kv_heads_(num_kv_heads),
      head_size_(head_size),
      head_size_v_(options.head_size_v.value_or(head_size)),
      dtype_(dtype),
      opt_(std::move(options)) {
  const char* cls = attention_class_name(kind);
  KVATTN_CHECK(is_attention_kind(kind), "AttentionSpec: kind '{}' is not an attention kind",
               kv_cache_spec_kind_name(kind));
  KVATTN_CHECK(num_kv_heads > 0, "{}: num_kv_heads must be positive, got {}", cls, num_kv_heads);
  KVATTN_CHECK(head_size > 0, "{}: head_size must be positive, got {}", cls, head_size);
  KVATTN_CHECK(head_size_v_ >= 0, "{}: head_size_v must be >= 0, got {}", cls, head_size_v_);
  const Fraction t = opt_.tokens_per_state;
  KVATTN_CHECK(t.num > 0 && t.den > 0,
               "{}: tokens_per_state must be a positive fraction, got {}/{} (only Mamba uses -1)", cls, t.num, t.den);
  KVATTN_CHECK(checked_mul(block_size, t.den, cls) % t.num == 0,
               "{}: block_size {} is not a whole number of states of {}/{} tokens; pick a block size that "
               "is a multiple of tokens_per_state",
               cls, block_size, t.num, t.den);
  KVATTN_CHECK(!opt_.num_head_slots || *opt_.num_head_slots > 0, "{}: num_head_slots must be positive, got {}",
               cls, opt_str(opt_.num_head_slots));
  KVATTN_CHECK(!opt_.state_content_bytes || *opt_.state_content_bytes > 0,
               "{}: state_content_bytes must be positive, got {}", cls, opt_str(opt_.state_content_bytes));
  KVATTN_CHECK(!opt_.block_stride_alignment || *opt_.block_stride_alignment > 0,
               "{}: block_stride_alignment must be a positive number of tokens, got {}", cls,
               opt_str(opt_.block_stride_alignment));
  KVATTN_CHECK(opt_.extra_retained_tokens >= 0, "{}: extra_retained_tokens must be >= 0, got {}", cls,
               opt_.extra_retained_tokens);
  if (kind == KVCacheSpecKind::SlidingWindow || kind == KVCacheSpecKind::SlidingWindowMLA)
    KVATTN_CHECK(opt_.sliding_window && *opt_.sliding_window > 0,
                 "{}: sliding_window must be a positive number of tokens, got {}", cls, opt_str(opt_.sliding_window));
  if (kind == KVCacheSpecKind::ChunkedLocalAttention)
    KVATTN_CHECK(opt_.attention_chunk_size && *opt_.attention_chunk_size > 0,
                 "{}: attention_chunk_size must be a positive number of tokens, got {}", cls,
                 opt_str(opt_.attention_chunk_size));
  KVATTN_CHECK(!opt_.sliding_window || *opt_.sliding_window > 0, "{}: sliding_window must be positive, got {}", cls,
               *opt_.sliding_window);
  KVATTN_CHECK(!opt_.attention_chunk_size || *opt_.attention_chunk_size > 0,
               "{}: attention_chunk_size must be positive, got {}", cls, *opt_.attention_chunk_size);
  const int64_t real = unpadded_page_size_bytes();
  page_size_padded_ = opt_.page_size_padded;
  if (!page_size_padded_ && opt_.mla_alignment) {
    KVATTN_CHECK(*opt_.mla_alignment > 0, "{}: alignment must be positive, got {}", cls, *opt_.mla_alignment);
    int64_t padded = round_up(real, *opt_.mla_alignment);
    if (padded != real) page_size_padded_ = padded;
  }
  if (page_size_padded_)
    KVATTN_CHECK(*page_size_padded_ >= real,
                 "{}: page_size_padded {} is smaller than the real page of {} bytes (H={} x N={} x C={}); pad to "
                 "at least the real page",
                 cls, *page_size_padded_, real, num_heads(), num_states(), state_content_size_bytes());
}

int64_t AttentionSpec::num_heads() const { return opt_.num_head_slots.value_or(num_kv_heads_); }

int64_t AttentionSpec::state_content_size_bytes() const {
  if (opt_.state_content_bytes) return *opt_.state_content_bytes;
  return (head_size_ + head_size_v_) * dtype_size(dtype_);
}

int64_t AttentionSpec::get_block_stride_alignment() const {
  if (!opt_.block_stride_alignment) return 1;
  const int64_t kernel = std::gcd(block_size(), *opt_.block_stride_alignment);
  if (kernel == block_size()) return 1;
  return num_heads() * get_num_kernel_states(kernel) * state_content_size_bytes();
}

int64_t AttentionSpec::max_admission_blocks_per_request(int64_t in_flight_tokens, int64_t max_len) const {
  const int64_t sw = opt_.sliding_window.value_or(0);
  KVATTN_CHECK(sw > 0, "{}: max_admission_blocks_per_request needs a sliding window", attention_class_name(kind_));
  const int64_t tokens = std::min(sw - 1 + opt_.extra_retained_tokens + in_flight_tokens, max_len);
  return cdiv(tokens, block_size()) + 1;
}

int64_t AttentionSpec::max_memory_usage_bytes(const KVCacheLimits& limits) const {
  check_limits(limits);
  const int64_t page = page_size_bytes();
  const int64_t dcp = limits.decode_context_parallel_size;
  int64_t pages = 0;
  switch (kind_) {
    case KVCacheSpecKind::FullAttention:
    case KVCacheSpecKind::MLAAttention:
    case KVCacheSpecKind::SinkFullAttention: {
      const int64_t len = dcp > 1 ? cdiv(limits.max_model_len, dcp) : limits.max_model_len;
      pages = cdiv(len, block_size());
      break;
    }
    case KVCacheSpecKind::SlidingWindow:
    case KVCacheSpecKind::SlidingWindowMLA:
      KVATTN_CHECK(dcp == 1,
                   "DCP does not support sliding window ({} with decode_context_parallel_size={}); use "
                   "decode_context_parallel_size=1 for models with sliding-window layers",
                   attention_class_name(kind_), dcp);
      pages = max_admission_blocks_per_request(limits.max_num_batched_tokens, limits.max_model_len);
      break;
    case KVCacheSpecKind::ChunkedLocalAttention:
      pages = cdiv(std::min(*opt_.attention_chunk_size + limits.max_num_batched_tokens, limits.max_model_len),
                   block_size());
      break;
    case KVCacheSpecKind::CrossAttention:
      pages = cdiv(limits.max_num_encoder_input_tokens, block_size());
      break;
    case KVCacheSpecKind::EncoderOnlyAttention:
      pages = 0;
      break;
    default:
      throw InternalError("AttentionSpec with a non-attention kind");
  }
  return checked_mul(pages, page, "max_memory_usage_bytes");
}

int64_t AttentionSpec::max_num_blocks_per_req(const KVCacheLimits& limits, int64_t max_len) const {
  check_limits(limits);
  KVATTN_CHECK(max_len >= 0, "max_num_blocks_per_req: max_len must be >= 0, got {}", max_len);
  return cdiv(max_len, block_size() * limits.decode_context_parallel_size);
}

KVCacheSpecPtr AttentionSpec::copy_with_new_block_size(int64_t bs) const {
  AttentionSpecOptions o = opt_;
  o.head_size_v = head_size_v_;
  return std::make_shared<AttentionSpec>(kind_, bs, num_kv_heads_, head_size_, dtype_, o);
}

std::shared_ptr<const AttentionSpec> AttentionSpec::with_options(const AttentionSpecOptions& options) const {
  return std::make_shared<AttentionSpec>(kind_, block_size(), num_kv_heads_, head_size_, dtype_, options);
}

std::string AttentionSpec::repr() const {
  const auto& o = opt_;
  return fmt::format(
      "{}(block_size={}, num_kv_heads={}, head_size={}, head_size_v={}, dtype={}, kv_quant_mode={}, "
      "page_size_padded={}, num_head_slots={}, state_content_bytes={}, tokens_per_state={}/{}, dcp_sharded={}, "
      "uses_slot_mapping={}, block_stride_alignment={}, sliding_window={}, attention_chunk_size={}, "
      "extra_retained_tokens={}, non_causal={}, sink_len={})",
      attention_class_name(kind_), block_size(), num_kv_heads_, head_size_, head_size_v_, dtype_name(dtype_),
      kv_quant_mode_name(o.kv_quant_mode), opt_str(page_size_padded_), opt_str(o.num_head_slots),
      opt_str(o.state_content_bytes), o.tokens_per_state.num, o.tokens_per_state.den, o.dcp_sharded,
      o.uses_slot_mapping, opt_str(o.block_stride_alignment), opt_str(o.sliding_window),
      opt_str(o.attention_chunk_size), o.extra_retained_tokens, o.non_causal, opt_str(o.sink_len));
}

std::shared_ptr<const AttentionSpec> FullAttentionSpec(int64_t bs, int64_t h, int64_t hs, DType dt,
                                                       AttentionSpecOptions o) {
  return std::make_shared<AttentionSpec>(KVCacheSpecKind::FullAttention, bs, h, hs, dt, std::move(o));
}
std::shared_ptr<const AttentionSpec> MLAAttentionSpec(int64_t bs, int64_t h, int64_t hs, DType dt,
                                                      AttentionSpecOptions o) {
  if (!o.head_size_v) o.head_size_v = 0;
  return std::make_shared<AttentionSpec>(KVCacheSpecKind::MLAAttention, bs, h, hs, dt, std::move(o));
}
std::shared_ptr<const AttentionSpec> SlidingWindowSpec(int64_t bs, int64_t h, int64_t hs, DType dt, int64_t sw,
                                                       AttentionSpecOptions o) {
  o.sliding_window = sw;
  return std::make_shared<AttentionSpec>(KVCacheSpecKind::SlidingWindow, bs, h, hs, dt, std::move(o));
}
std::shared_ptr<const AttentionSpec> ChunkedLocalAttentionSpec(int64_t bs, int64_t h, int64_t hs, DType dt,
                                                               int64_t chunk, AttentionSpecOptions o) {
  o.attention_chunk_size = chunk;
  return std::make_shared<AttentionSpec>(KVCacheSpecKind::ChunkedLocalAttention, bs, h, hs, dt, std::move(o));
}
std::shared_ptr<const AttentionSpec> CrossAttentionSpec(int64_t bs, int64_t h, int64_t hs, DType dt,
                                                        AttentionSpecOptions o) {
  return std::make_shared<AttentionSpec>(KVCacheSpecKind::CrossAttention, bs, h, hs, dt, std::move(o));
}
std::shared_ptr<const AttentionSpec> EncoderOnlyAttentionSpec(int64_t bs, int64_t h, int64_t hs, DType dt,
                                                              AttentionSpecOptions o) {
  return std::make_shared<AttentionSpec>(KVCacheSpecKind::EncoderOnlyAttention, bs, h, hs, dt, std::move(o));
}

const AttentionSpec* as_attention_spec(const KVCacheSpec* spec) noexcept {
  return dynamic_cast<const AttentionSpec*>(spec);
}

// ---------------------------------------------------------------------------------------
// MambaSpec

MambaSpec::MambaSpec(int64_t block_size, std::vector<std::vector<int64_t>> shapes, std::vector<DType> dtypes,
                     MambaSpecOptions options)
    : KVCacheSpec(block_size), shapes_(std::move(shapes)), dtypes_(std::move(dtypes)), opt_(std::move(options)) {
  KVATTN_CHECK(!shapes_.empty(), "MambaSpec needs at least one state shape");
  KVATTN_CHECK(shapes_.size() == dtypes_.size(), "MambaSpec: {} state shapes but {} dtypes; give one dtype per shape",
               shapes_.size(), dtypes_.size());
  for (const auto& s : shapes_)
    for (int64_t d : s) KVATTN_CHECK(d > 0, "MambaSpec: state dimensions must be positive, got {}", d);
  const auto& m = opt_.mamba_cache_mode;
  KVATTN_CHECK(m == "none" || m == "align" || m == "all",
               "MambaSpec: unknown mamba_cache_mode '{}'; valid: 'none', 'align', 'all'", m);
  KVATTN_CHECK(opt_.num_speculative_blocks >= 0 && opt_.num_prefill_checkpoint_blocks >= 0,
               "MambaSpec: num_speculative_blocks ({}) and num_prefill_checkpoint_blocks ({}) must be >= 0",
               opt_.num_speculative_blocks, opt_.num_prefill_checkpoint_blocks);
  if (opt_.page_size_padded)
    KVATTN_CHECK(*opt_.page_size_padded >= state_content_size_bytes(),
                 "MambaSpec: page_size_padded {} is smaller than the state size {} bytes", *opt_.page_size_padded,
                 state_content_size_bytes());
}

int64_t MambaSpec::state_content_size_bytes() const {
  int64_t total = 0;
  for (size_t i = 0; i < shapes_.size(); ++i) {
    int64_t n = dtype_size(dtypes_[i]);
    for (int64_t d : shapes_[i]) n = checked_mul(n, d, "MambaSpec state size");
    total += n;
  }
  return total;
}

int64_t MambaSpec::max_memory_usage_bytes(const KVCacheLimits& limits) const {
  check_limits(limits);
  int64_t pages = 1 + opt_.num_speculative_blocks;
  if (opt_.mamba_cache_mode == "all")
    pages = cdiv(limits.max_model_len, block_size()) + opt_.num_speculative_blocks;
  else if (opt_.mamba_cache_mode == "align")
    pages = 2 + opt_.num_speculative_blocks + opt_.num_prefill_checkpoint_blocks;
  return checked_mul(pages, page_size_bytes(), "MambaSpec max_memory_usage_bytes");
}

int64_t MambaSpec::max_num_blocks_per_req(const KVCacheLimits& limits, int64_t max_len) const {
  KVATTN_CHECK(max_len >= 0, "max_num_blocks_per_req: max_len must be >= 0, got {}", max_len);
  if (opt_.mamba_cache_mode == "align") return cdiv(max_len, block_size()) + opt_.num_speculative_blocks;
  KVCacheLimits l = limits;
  l.max_model_len = max_len;
  return cdiv(max_memory_usage_bytes(l), page_size_bytes());
}

KVCacheSpecPtr MambaSpec::copy_with_new_block_size(int64_t bs) const {
  return std::make_shared<MambaSpec>(bs, shapes_, dtypes_, opt_);
}

std::string MambaSpec::repr() const {
  std::string shapes;
  for (size_t i = 0; i < shapes_.size(); ++i) {
    shapes += i ? ", (" : "(";
    for (size_t j = 0; j < shapes_[i].size(); ++j) shapes += fmt::format("{}{}", j ? ", " : "", shapes_[i][j]);
    shapes += fmt::format(") {}", dtype_name(dtypes_[i]));
  }
  return fmt::format(
      "MambaSpec(block_size={}, shapes=[{}], page_size_padded={}, mamba_type={}, mamba_cache_mode={}, "
      "num_speculative_blocks={}, num_prefill_checkpoint_blocks={})",
      block_size(), shapes, opt_str(opt_.page_size_padded), opt_.mamba_type, opt_.mamba_cache_mode,
      opt_.num_speculative_blocks, opt_.num_prefill_checkpoint_blocks);
}

// ---------------------------------------------------------------------------------------
// UniformTypeKVCacheSpecs

UniformTypeKVCacheSpecs::UniformTypeKVCacheSpecs(int64_t block_size,
                                                 std::vector<std::pair<std::string, KVCacheSpecPtr>> specs)
    : KVCacheSpec(block_size), specs_(std::move(specs)) {
  KVATTN_CHECK(!specs_.empty(), "UniformTypeKVCacheSpecs needs at least one layer");
  std::set<std::string_view> names;
  for (const auto& [name, s] : specs_) {
    KVATTN_CHECK(s != nullptr, "UniformTypeKVCacheSpecs: layer '{}' has a null spec", name);
    KVATTN_CHECK(names.insert(name).second, "UniformTypeKVCacheSpecs: layer '{}' appears twice", name);
    KVATTN_CHECK(s->block_size() == block_size,
                 "UniformTypeKVCacheSpecs: layer '{}' has block_size {} but the group uses {}; all layers of a "
                 "uniform group need one block size",
                 name, s->block_size(), block_size);
    KVATTN_CHECK(s->kind() != KVCacheSpecKind::UniformType, "UniformTypeKVCacheSpecs cannot nest (layer '{}')", name);
  }
}

std::shared_ptr<const UniformTypeKVCacheSpecs> UniformTypeKVCacheSpecs::from_specs(
    const std::vector<std::pair<std::string, KVCacheSpecPtr>>& specs) {
  if (specs.empty()) return nullptr;
  const AttentionSpec* first = as_attention_spec(specs.front().second.get());
  if (first == nullptr) return nullptr;
  for (const auto& [name, s] : specs) {
    const AttentionSpec* a = as_attention_spec(s.get());
    if (a == nullptr || a->kind() != first->kind() || a->block_size() != first->block_size() ||
        a->sliding_window() != first->sliding_window() || a->attention_chunk_size() != first->attention_chunk_size())
      return nullptr;
  }
  return std::make_shared<UniformTypeKVCacheSpecs>(first->block_size(), specs);
}

const KVCacheSpecPtr& UniformTypeKVCacheSpecs::spec_of(std::string_view layer_name) const {
  for (const auto& [name, s] : specs_)
    if (name == layer_name) return s;
  throw InvalidArgument(fmt::format("UniformTypeKVCacheSpecs: layer '{}' is not part of this group", layer_name));
}

int64_t UniformTypeKVCacheSpecs::num_heads() const {
  throw Unsupported("UniformTypeKVCacheSpecs has per-layer head counts; use iter_layer_specs() for num_heads");
}
Fraction UniformTypeKVCacheSpecs::tokens_per_state() const {
  throw Unsupported("UniformTypeKVCacheSpecs has per-layer geometry; use iter_layer_specs() for tokens_per_state");
}
int64_t UniformTypeKVCacheSpecs::state_content_size_bytes() const {
  throw Unsupported(
      "UniformTypeKVCacheSpecs has per-layer geometry; use iter_layer_specs() for state_content_size_bytes");
}

int64_t UniformTypeKVCacheSpecs::page_size_bytes() const {
  int64_t total = 0;
  for (const auto& [name, s] : specs_) total += s->page_size_bytes();
  return total;
}

bool UniformTypeKVCacheSpecs::has_layer_views() const {
  return std::all_of(specs_.begin(), specs_.end(), [](const auto& p) { return p.second->has_layer_views(); });
}

int64_t UniformTypeKVCacheSpecs::max_memory_usage_bytes(const KVCacheLimits& limits) const {
  int64_t max_pages = 0;
  for (const auto& [name, s] : specs_)
    max_pages = std::max(max_pages, cdiv(s->max_memory_usage_bytes(limits), s->page_size_bytes()));
  return checked_mul(max_pages, page_size_bytes(), "UniformTypeKVCacheSpecs max_memory_usage_bytes");
}

int64_t UniformTypeKVCacheSpecs::max_num_blocks_per_req(const KVCacheLimits& limits, int64_t max_len) const {
  const int64_t n = specs_.front().second->max_num_blocks_per_req(limits, max_len);
  for (const auto& [name, s] : specs_) {
    const int64_t m = s->max_num_blocks_per_req(limits, max_len);
    if (m != n)
      throw InvalidArgument(fmt::format(
          "UniformTypeKVCacheSpecs: layer '{}' needs {} blocks per request but layer '{}' needs {}; layers of one "
          "group must agree on the block-table width",
          name, m, specs_.front().first, n));
  }
  return n;
}

KVCacheSpecPtr UniformTypeKVCacheSpecs::copy_with_new_block_size(int64_t bs) const {
  std::vector<std::pair<std::string, KVCacheSpecPtr>> out;
  for (const auto& [name, s] : specs_) out.emplace_back(name, s->copy_with_new_block_size(bs));
  return std::make_shared<UniformTypeKVCacheSpecs>(bs, std::move(out));
}

std::string UniformTypeKVCacheSpecs::repr() const {
  std::string out = fmt::format("UniformTypeKVCacheSpecs(block_size={}, kv_cache_specs={{", block_size());
  for (size_t i = 0; i < specs_.size(); ++i)
    out += fmt::format("{}'{}': {}", i ? ", " : "", specs_[i].first, specs_[i].second->repr());
  return out + "})";
}

std::vector<KVCacheSpecPtr> iter_layer_specs(const KVCacheSpecPtr& spec) {
  if (auto u = std::dynamic_pointer_cast<const UniformTypeKVCacheSpecs>(spec)) {
    std::vector<KVCacheSpecPtr> out;
    for (const auto& [name, s] : u->kv_cache_specs()) out.push_back(s);
    return out;
  }
  return {spec};
}

// ---------------------------------------------------------------------------------------
// merge

KVCacheSpecPtr merge_kv_cache_specs(const std::vector<KVCacheSpecPtr>& specs) {
  KVATTN_CHECK(!specs.empty(), "merge_kv_cache_specs: no specs to merge");
  for (const auto& s : specs) KVATTN_CHECK(s != nullptr, "merge_kv_cache_specs: null spec");
  const std::string first = specs.front()->repr();
  if (std::all_of(specs.begin(), specs.end(), [&](const KVCacheSpecPtr& s) { return s->repr() == first; }))
    return specs.front();

  // Full-attention specs may differ only in window / chunk / non_causal.
  const AttentionSpec* a0 = as_attention_spec(specs.front().get());
  auto stripped = [](const AttentionSpec& a) {
    AttentionSpecOptions o = a.options();
    o.sliding_window.reset();
    o.attention_chunk_size.reset();
    o.non_causal = false;
    o.head_size_v = a.head_size_v();
    return a.with_options(o)->repr();
  };
  const bool full_kind = a0 && (a0->kind() == KVCacheSpecKind::FullAttention || a0->kind() == KVCacheSpecKind::MLAAttention);
  if (!full_kind)
    throw InvalidArgument(fmt::format(
        "All KV cache specs of one group must be equal to merge; got {} and others ({} specs). Put layers with "
        "different specs in different groups",
        first, specs.size()));
  const std::string base = stripped(*a0);
  std::set<int64_t> windows, chunks;
  bool non_causal = false;
  for (const auto& s : specs) {
    const AttentionSpec* a = as_attention_spec(s.get());
    if (a == nullptr || a->kind() != a0->kind() || stripped(*a) != base)
      throw InvalidArgument(fmt::format(
          "All attention layers in the same KV cache group must have the same attention spec (apart from the "
          "window); got {} and {}",
          first, s->repr()));
    if (a->sliding_window()) windows.insert(*a->sliding_window());
    if (a->attention_chunk_size()) chunks.insert(*a->attention_chunk_size());
    non_causal = non_causal || a->options().non_causal;
  }
  KVATTN_CHECK(windows.size() <= 1, "All attention layers in the same KV cache group must have the same window size; "
               "got {} distinct sliding windows",
               windows.size());
  KVATTN_CHECK(chunks.size() <= 1, "All attention layers in the same KV cache group must have the same attention "
               "chunk size; got {} distinct chunk sizes",
               chunks.size());
  KVATTN_CHECK(windows.empty() || chunks.empty(),
               "Model with both sliding window layers and chunked local attention layers is not supported in one "
               "KV cache group");
  AttentionSpecOptions o = a0->options();
  o.head_size_v = a0->head_size_v();
  o.sliding_window = windows.empty() ? std::nullopt : std::optional<int64_t>(*windows.begin());
  o.attention_chunk_size = chunks.empty() ? std::nullopt : std::optional<int64_t>(*chunks.begin());
  o.non_causal = non_causal;
  return a0->with_options(o);
}

}  // namespace kvattn
