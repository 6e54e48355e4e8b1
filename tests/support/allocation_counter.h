// tests/support/allocation_counter.h — counts heap allocations, for "a step allocates nothing"
// tests.  Include it from exactly ONE source file of a test binary: it replaces the global
// operator new/delete of that binary (counting, then forwarding to malloc/free).  Under
// AddressSanitizer, whose allocator owns operator new, it counts through the sanitizer's
// malloc hooks instead.  Read the count with kvattn::test::allocations().
#pragma once

#include <atomic>
#include <cstdlib>
#include <new>

namespace kvattn::test {
inline std::atomic<long> g_allocations{0};
inline long allocations() { return g_allocations.load(std::memory_order_relaxed); }
}  // namespace kvattn::test

// GCC defines __SANITIZE_ADDRESS__ under -fsanitize=address; clang answers __has_feature.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVATTN_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(KVATTN_TEST_ASAN)
extern "C" int __sanitizer_install_malloc_and_free_hooks(
    void (*malloc_hook)(const volatile void*, size_t), void (*free_hook)(const volatile void*));
namespace {
void kvattn_count_malloc(const volatile void*, size_t) {
  kvattn::test::g_allocations.fetch_add(1, std::memory_order_relaxed);
}
void kvattn_count_free(const volatile void*) {}
const int kvattn_hooks_installed = __sanitizer_install_malloc_and_free_hooks(kvattn_count_malloc, kvattn_count_free);
}  // namespace
#else
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpragmas"
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  kvattn::test::g_allocations.fetch_add(1, std::memory_order_relaxed);
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
