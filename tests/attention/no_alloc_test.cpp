// The paged-KV builder allocates nothing per step (global operator new is counted; this file
// replaces operator new/delete for the whole test_attention binary, forwarding to malloc/free;
// under ASan it counts through the sanitizer's allocator hooks instead).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "kvattn/attention/paged_kv_metadata.h"

namespace {
std::atomic<long> g_allocations{0};
}  // namespace

#if defined(__SANITIZE_ADDRESS__)
// Under AddressSanitizer, operator new is ASan's; count through its allocator hooks instead.
extern "C" int __sanitizer_install_malloc_and_free_hooks(
    void (*malloc_hook)(const volatile void*, size_t), void (*free_hook)(const volatile void*));
namespace {
void count_malloc(const volatile void*, size_t) { g_allocations.fetch_add(1, std::memory_order_relaxed); }
void count_free(const volatile void*) {}
const int g_hooks_installed = __sanitizer_install_malloc_and_free_hooks(count_malloc, count_free);
}  // namespace
#else
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpragmas"
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return ::operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop
#endif

namespace kvattn {
namespace {

TEST(NoAllocation, PagedKVBuildAllocatesNothing) {
  const int n = 64;
  std::vector<int32_t> qsl{0}, seq, table;
  for (int r = 0; r < n; ++r) {
    qsl.push_back(qsl.back() + (r < 40 ? 1 : 9));
    seq.push_back(100 + r * 7);
    for (int c = 0; c < 64; ++c) table.push_back(1 + r * 64 + c);
  }
  Tensor qsl_t = Tensor::from_vector(qsl), seq_t = Tensor::from_vector(seq);
  Tensor bt = Tensor::from_vector(table, {n, 64});
  CommonAttentionMetadata cm;
  cm.query_start_loc = cm.query_start_loc_cpu = qsl_t;
  cm.seq_lens = cm.seq_lens_cpu_upper_bound = seq_t;
  cm.num_reqs = n;
  cm.num_actual_tokens = qsl.back();
  cm.block_table_tensor = bt;
  PagedKVMetadataConfig c;
  c.max_num_reqs = 64;
  c.max_model_len = 1024;
  c.page_size = 16;
  c.num_blocks = 100000;
  PagedKVMetadataBuilder plain(c);
  c.dcp_world_size = 2;
  c.dcp_rank = 1;
  PagedKVMetadataBuilder dcp(c);
  plain.build(cm, 40);
  dcp.build(cm, 40);
  const long before = g_allocations.load();
  for (int step = 0; step < 4; ++step) {
    EXPECT_GT(plain.build(cm, 40, step % 2 ? 32 : 0).num_actual_pages, 0);
    EXPECT_GT(dcp.build(cm, 40).num_actual_pages, 0);
  }
  EXPECT_EQ(g_allocations.load() - before, 0);
}

}  // namespace
}  // namespace kvattn
