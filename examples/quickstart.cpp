// kvattn quickstart: plan and allocate a paged KV cache, write one request's K/V into its
// blocks, and run a paged decode step — then check it against dense attention by hand.
// Built and run as a test (CTest `example_quickstart`), so it stays correct.
#include <kvattn/kv/allocate.h>
#include <kvattn/kv/kv_cache_config.h>
#include <kvattn/ops/paged_attention.h>
#include <kvattn/ops/reshape_and_cache.h>

#include <cmath>
#include <cstdio>
#include <vector>

using namespace kvattn;

int main() {
  const int64_t kv_heads = 2, q_heads = 4, head = 64, block = 16, context = 40;

  // 1. One full-attention layer, bf16 KV, 16-token blocks, 8 blocks (block 0 is the null block).
  auto spec = FullAttentionSpec(block, kv_heads, head, DType::bf16);
  std::vector<LayerKVCacheSpec> layers = {{"model.layers.0.self_attn.attn", spec}};
  KVCacheConfig config = materialize_kv_cache_config(get_kv_cache_groups(layers), KVCacheLayout::LBNHC, 8);
  KVCacheViews views = allocate_kv_cache(config, Device::cpu(), KVCacheLayout::LBNHC);
  // vLLM's [B, H, N, 2 * head] layer view -> FlashInfer-style K and V views [B, N, H, head].
  auto [k_cache, v_cache] = ops::split_kv_cache_layer_view(views.at("model.layers.0.self_attn.attn"), head);

  // 2. A request of 40 tokens in blocks 5, 2, 7: write its K/V through the slot mapping.
  const std::vector<int32_t> blocks = {5, 2, 7};
  Tensor key = Tensor::empty({context, kv_heads, head}, DType::bf16);
  Tensor value = Tensor::empty({context, kv_heads, head}, DType::bf16);
  std::vector<int64_t> slots;
  for (int64_t t = 0; t < context; ++t) {
    slots.push_back(blocks[static_cast<size_t>(t / block)] * block + t % block);
    for (int64_t h = 0; h < kv_heads; ++h)
      for (int64_t d = 0; d < head; ++d) {
        key.set({t, h, d}, std::sin(0.1 * static_cast<double>(t + 3 * h + d)));
        value.set({t, h, d}, std::cos(0.07 * static_cast<double>(t * d + h)));
      }
  }
  ops::reshape_and_cache_flash(key, value, k_cache, v_cache, Tensor::from_vector(slots), "auto", Tensor(), Tensor());

  // 3. Decode: one query token attending to the 40 cached tokens, block-table form.
  Tensor query = Tensor::empty({1, q_heads, head}, DType::bf16);
  for (int64_t h = 0; h < q_heads; ++h)
    for (int64_t d = 0; d < head; ++d) query.set({0, h, d}, std::cos(0.3 * static_cast<double>(h + d)));
  ops::PagedAttentionArgs args;
  args.query = query;
  args.k_cache = k_cache;
  args.v_cache = v_cache;
  args.qo_indptr = Tensor::from_vector(std::vector<int32_t>{0, 1});
  args.block_table = Tensor::from_vector(blocks, {1, 3});
  args.seq_lens = Tensor::from_vector(std::vector<int32_t>{static_cast<int32_t>(context)});
  args.out = Tensor::empty({1, q_heads, head}, DType::f32);
  ops::paged_attention(args);

  // 4. The same attention, dense, for query head 3 (KV head 3 / (4 / 2) = 1).
  const int64_t h = 3, kvh = h / (q_heads / kv_heads);
  std::vector<double> scores(static_cast<size_t>(context));
  double max_s = -1e30, denom = 0, worst = 0;
  for (int64_t t = 0; t < context; ++t) {
    double s = 0;
    for (int64_t d = 0; d < head; ++d) s += query.get({0, h, d}) * key.get({t, kvh, d});
    scores[static_cast<size_t>(t)] = s / std::sqrt(static_cast<double>(head));
    max_s = std::max(max_s, scores[static_cast<size_t>(t)]);
  }
  for (double& s : scores) denom += (s = std::exp(s - max_s));
  for (int64_t d = 0; d < head; ++d) {
    double o = 0;
    for (int64_t t = 0; t < context; ++t) o += scores[static_cast<size_t>(t)] / denom * value.get({t, kvh, d});
    worst = std::max(worst, std::fabs(o - args.out.get({0, h, d})));
  }
  std::printf("quickstart: paged decode over blocks [5, 2, 7] matches dense attention (max error %.2g)\n", worst);
  return worst < 1e-3 ? 0 : 1;
}
