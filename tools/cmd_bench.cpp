// `kvattn bench`: time the attention ops on realistic shapes and report each against the
// ceiling that bounds it, measured in the same run: decode (memory-bound) against the
// memory-copy bandwidth, prefill (compute-bound) against the CPU's f32 FMA peak.
//
//   kvattn bench --device cpu --op decode --batch 64 --kv-len 4096
//
// Decode: one query token per request; bandwidth = bytes of K and V read / median time.
// Prefill: causal, query = the last q_len tokens of kv_len; GFLOP/s = 4 D Hq pairs / time.
// Cache: bf16 (or --kv-dtype), pages of --page-size tokens as [num_pages, 2, page, Hkv, D]
// (K and V of a page adjacent, NHD interior: vLLM's default), page ids a random permutation
// of the pool, values uniform in (-1, 1).
#include <fmt/format.h>
#include <sys/mman.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "command_registry.h"
#include "int_option.h"
#include "kvattn/core/checked_math.h"
#include "kvattn/core/cuda_runtime_api.h"
#include "kvattn/core/tensor.h"
#include "kvattn/ops/bench.h"
#include "kvattn/ops/ops.h"

namespace kvattn::tools {
// The CUDA kernel suite (tools/cmd_bench_cuda.cpp); 2 when CUDA is not available.
int run_cuda_bench_suite(bool quick);
namespace {

struct BenchOptions {
  std::string device = "cpu";
  std::string op = "all";
  int64_t batch = -1, kv_len = -1, q_len = -1;
  int64_t num_qo_heads = 32, num_kv_heads = 8, head_dim = 128, page_size = 16;
  std::string dtype = "bf16", kv_dtype = "";
  int64_t threads = 0;  // 0: hardware concurrency
  int64_t copy_mib = 1024;
  double min_seconds = 1.0;
  bool json = false;
  bool suite = false;
};

// Peak f32 multiply-add rate of this CPU with `threads` threads: 8 independent 8-wide FMA
// chains per thread (the ceiling prefill FLOP rates are compared with).  AVX2+FMA when the
// CPU has them, else what the compiler makes of the portable loop.
template <int W>
float fma_chains(int64_t iters, float seed) {
  float acc[8][W];
  for (int c = 0; c < 8; ++c)
    for (int l = 0; l < W; ++l) acc[c][l] = seed + static_cast<float>(c * W + l) * 1e-7f;
  const float a = 0.999999f, b = 1e-7f;
  for (int64_t i = 0; i < iters; ++i)
    for (int c = 0; c < 8; ++c)
      for (int l = 0; l < W; ++l) acc[c][l] = acc[c][l] * a + b;
  float sum = 0;
  for (int c = 0; c < 8; ++c)
    for (int l = 0; l < W; ++l) sum += acc[c][l];
  return sum;
}
#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) float fma_chains_avx2(int64_t iters, float seed) {
  __m256 acc[8];
  for (int c = 0; c < 8; ++c) acc[c] = _mm256_set1_ps(seed + static_cast<float>(c) * 1e-7f);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i)
    for (int c = 0; c < 8; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  float out[8], sum = 0;
  for (int c = 0; c < 8; ++c) {
    _mm256_storeu_ps(out, acc[c]);
    for (float x : out) sum += x;
  }
  return sum;
}
#endif

double measure_cpu_fma_gflops(int threads) {
  const int64_t iters = 20'000'000;
#if defined(__x86_64__)
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  const bool avx2 = false;
#endif
  std::vector<float> sink(static_cast<size_t>(threads));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  for (int w = 0; w < threads; ++w)
    ts.emplace_back([&, w] {
#if defined(__x86_64__)
      sink[static_cast<size_t>(w)] = avx2 ? fma_chains_avx2(iters, static_cast<float>(w)) : fma_chains<8>(iters, static_cast<float>(w));
#else
      sink[static_cast<size_t>(w)] = fma_chains<8>(iters, static_cast<float>(w));
#endif
    });
  for (auto& t : ts) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  volatile float keep = 0;
  for (float x : sink) keep = keep + x;
  (void)keep;
  return 2.0 * 64.0 * static_cast<double>(iters) * threads / s / 1e9;
}

// Fast fill with uniform(-1, 1) values of `dt`: a table of random codes indexed by a cheap
// generator, in parallel slices.
void fill_random(const Tensor& t, uint64_t seed, int threads) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<double> u(-1, 1);
  const int64_t es = t.element_size();
  std::vector<uint8_t> table(static_cast<size_t>(4096 * es));
  for (int i = 0; i < 4096; ++i) store_from_double(table.data() + i * es, t.dtype(), u(rng));
  const int64_t n = t.numel();
  char* p = static_cast<char*>(t.data());
  const int64_t slice = (n + threads - 1) / threads;
  std::vector<std::thread> ts;
  for (int w = 0; w < threads; ++w)
    ts.emplace_back([&, w] {
      uint64_t x = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(w) + 1;
      for (int64_t i = w * slice; i < std::min(n, (w + 1) * slice); ++i) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        std::memcpy(p + i * es, table.data() + (x & 4095) * es, static_cast<size_t>(es));
      }
    });
  for (auto& th : ts) th.join();
}

// A host tensor backed by 2 MiB-aligned memory with transparent huge pages requested: the
// attention kernel walks pages scattered over a multi-GB pool, and 4 KiB pages would turn
// that walk into a TLB-miss benchmark.
Tensor host_tensor_hugepages(const Dims& shape, DType dt) {
  const size_t bytes = static_cast<size_t>(
      checked_mul(checked_product(shape.span(), "bench: KV-cache elements"), dtype_size(dt), "bench: KV-cache bytes"));
  const size_t align = size_t{2} << 20, rounded = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded == 0 ? align : rounded);
  if (p == nullptr) throw OutOfMemory(fmt::format("bench: could not allocate {} bytes for the KV cache", rounded));
#ifdef MADV_HUGEPAGE
  madvise(p, rounded, MADV_HUGEPAGE);
#endif
  auto buf = Buffer::wrap(p, rounded, Device::cpu(), [p] { std::free(p); });
  return Tensor::from_buffer(buf, 0, shape, contiguous_strides(shape), dt);
}

struct Setup {
  Tensor cache;          // [num_pages, 2, page, Hkv, D]
  ops::PagedAttentionArgs args;
  double bytes = 0, flops = 0;
};

// Checks that one case's sizes are representable (int64 byte sizes; int32 page ids and query
// offsets, as the kernels' metadata holds them) and fit this host's memory, before anything is
// allocated or timed.  Every size is derived from the options, so every step is checked.
void check_case_fits(const BenchOptions& o, int64_t batch, int64_t q_len, int64_t kv_len) {
  const DType dt = parse_dtype(o.dtype);
  const DType kvdt = o.kv_dtype.empty() ? dt : parse_dtype(o.kv_dtype);
  const int64_t pages_per_req = (kv_len + o.page_size - 1) / o.page_size;
  const int64_t num_pages = checked_add(checked_mul(batch, pages_per_req, "bench: pages (--batch * pages per request)"),
                                        1, "bench: pages");  // page 0 = the null block
  checked_cast<int32_t>(num_pages, "bench: page ids (--batch * ceil(--kv-len / --page-size) + 1)");
  checked_cast<int32_t>(checked_mul(batch, q_len, "bench: query tokens (--batch * query length)"),
                        "bench: query tokens (--batch * query length)");
  const Dims cache_shape{num_pages, 2, o.page_size, o.num_kv_heads, o.head_dim};
  const int64_t cache_bytes =
      checked_mul(checked_product(cache_shape.span(), "bench: KV-cache elements"), dtype_size(kvdt), "bench: KV-cache bytes");
  const int64_t query_bytes = checked_mul(
      checked_mul(checked_mul(batch, q_len, "bench: query elements"), o.num_qo_heads * o.head_dim, "bench: query elements"),
      2 * dtype_size(dt), "bench: query and output bytes");
  const int64_t host_bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  const int64_t need = checked_add(cache_bytes, query_bytes, "bench: bytes needed");
  if (host_bytes > 0 && need > host_bytes)
    throw OutOfMemory(fmt::format("bench: batch {} x kv {} (q {}) needs {:.1f} GiB (KV cache {:.1f} GiB) but this host has "
                                  "{:.1f} GiB of memory; use a smaller --batch or --kv-len",
                                  batch, kv_len, q_len, static_cast<double>(need) / (1 << 30),
                                  static_cast<double>(cache_bytes) / (1 << 30), static_cast<double>(host_bytes) / (1 << 30)));
}

Setup make_setup(const BenchOptions& o, int64_t batch, int64_t q_len, int64_t kv_len, Device dev, int threads) {
  const DType dt = parse_dtype(o.dtype);
  const DType kvdt = o.kv_dtype.empty() ? dt : parse_dtype(o.kv_dtype);
  check_case_fits(o, batch, q_len, kv_len);
  const int64_t pages_per_req = (kv_len + o.page_size - 1) / o.page_size;
  const int64_t num_pages = batch * pages_per_req + 1;  // page 0 = the null block
  Setup s;
  const Dims cache_shape{num_pages, 2, o.page_size, o.num_kv_heads, o.head_dim};
  const Tensor cache = dev.is_cpu() ? host_tensor_hugepages(cache_shape, kvdt) : Tensor::empty(cache_shape, kvdt);
  fill_random(cache, 1, threads);
  const Tensor q = Tensor::empty({batch * q_len, o.num_qo_heads, o.head_dim}, dt);
  fill_random(q, 2, threads);
  std::vector<int32_t> perm(static_cast<size_t>(num_pages - 1));
  std::iota(perm.begin(), perm.end(), 1);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(3));
  std::vector<int32_t> qo(static_cast<size_t>(batch + 1)), ip(static_cast<size_t>(batch + 1)),
      last(static_cast<size_t>(batch));
  for (int64_t r = 0; r <= batch; ++r) {
    qo[r] = static_cast<int32_t>(r * q_len);
    ip[r] = static_cast<int32_t>(r * pages_per_req);
  }
  for (int64_t r = 0; r < batch; ++r) last[r] = static_cast<int32_t>(kv_len - (pages_per_req - 1) * o.page_size);
  const auto on = [&](const Tensor& t) { return dev.is_cpu() ? t : t.to(dev); };
  s.cache = on(cache);
  ops::PagedAttentionArgs& a = s.args;
  a.query = on(q);
  a.k_cache = s.cache.select(1, 0);
  a.v_cache = s.cache.select(1, 1);
  a.qo_indptr = on(Tensor::from_vector(qo));
  a.paged_kv_indptr = on(Tensor::from_vector(ip));
  a.paged_kv_indices = on(Tensor::from_vector(perm));
  a.paged_kv_last_page_len = on(Tensor::from_vector(last));
  a.out = Tensor::empty(a.query.shape(), dt, dev);
  a.causal = true;
  s.bytes = static_cast<double>(batch) * static_cast<double>(kv_len) * static_cast<double>(o.num_kv_heads) *
            static_cast<double>(o.head_dim) * 2.0 * static_cast<double>(dtype_size(kvdt));
  s.flops = ops::bench::attention_flops(static_cast<double>(batch) * ops::bench::causal_pairs(q_len, kv_len),
                                        o.head_dim, o.num_qo_heads);
  return s;
}

std::function<int()> setup_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  app.option_defaults()->always_capture_default();
  app.add_option("--device", o->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--op", o->op, "decode, prefill or all")->check(CLI::IsMember({"decode", "prefill", "all"}));
  // Options whose default depends on --op: no default shown by the parser, the text says it.
  add_int_option(app, "--batch", o->batch, 1, 1 << 20, "requests (default: decode 64, prefill 2; with --op all, the decode case only)")
      ->default_str("");
  add_int_option(app, "--kv-len", o->kv_len, 1, 1 << 24, "KV tokens per request (default: decode 4096, prefill 1024; with --op all, the decode case only)")
      ->default_str("");
  add_int_option(app, "--q-len", o->q_len, 1, 1 << 24,
                 "prefill query tokens per request, at most --kv-len (default: = --kv-len)")
      ->default_str("");
  add_int_option(app, "--threads", o->threads, 1, 4096, "CPU threads (default: hardware concurrency)")->default_str("");
  add_int_option(app, "--num-qo-heads", o->num_qo_heads, 1, 1024, "query heads");
  add_int_option(app, "--num-kv-heads", o->num_kv_heads, 1, 1024, "KV heads (divides --num-qo-heads)");
  add_int_option(app, "--head-dim", o->head_dim, 1, 1024, "head size");
  add_int_option(app, "--page-size", o->page_size, 1, 1 << 16, "tokens per page");
  app.add_option("--dtype", o->dtype, "query/output dtype (e.g. bf16, f16, f32)");
  app.add_option("--kv-dtype", o->kv_dtype, "KV-cache dtype (default: --dtype; or fp8_e4m3, fp8_e5m2)")->default_str("");
  add_int_option(app, "--copy-mib", o->copy_mib, 1, 1 << 16, "size of the memory-copy reference (MiB)");
  app.add_option("--min-seconds", o->min_seconds, "minimum timed seconds per case")
      ->type_name("FLOAT")
      ->check(CLI::Range(0.001, 3600.0));
  app.add_flag("--json", o->json, "print one JSON object instead of text");
  app.add_flag("--suite", o->suite,
               "run the standard shapes of the performance anchors on --device and print the table with "
               "ratios to the ceilings measured in the same run");
  return [o]() -> int {
    if (o->suite && o->device == "cuda") return run_cuda_bench_suite(false);
    const Device dev = o->device == "cuda" ? Device::cuda(0) : Device::cpu();
    if (dev.is_cuda() && !(ops::cuda_ops_available() && cuda::available()))
      throw Unsupported(fmt::format("bench --device cuda: {}; run with --device cpu",
                                    ops::cuda_ops_available() ? "no CUDA device is visible"
                                                              : "this kvattn was built without the CUDA ops "
                                                                "(rebuild with -DKVATTN_CUDA=ON)"));
    (void)parse_dtype(o->dtype);  // refuse an unknown dtype before any timing
    if (!o->kv_dtype.empty()) (void)parse_dtype(o->kv_dtype);
    KVATTN_CHECK(o->num_qo_heads % o->num_kv_heads == 0,
                 "bench: --num-qo-heads {} is not a multiple of --num-kv-heads {}; use a divisor of the query heads",
                 o->num_qo_heads, o->num_kv_heads);
    // The cases, checked to fit before anything is measured.
    struct Case {
      const char* name;
      int64_t batch, q_len, kv_len;
    };
    std::vector<Case> cases;
    if (!o->suite && (o->op == "decode" || o->op == "all"))
      cases.push_back({"decode", o->batch > 0 ? o->batch : 64, 1, o->kv_len > 0 ? o->kv_len : 4096});
    if (!o->suite && (o->op == "prefill" || o->op == "all")) {
      const int64_t kv = o->kv_len > 0 && o->op == "prefill" ? o->kv_len : 1024;
      KVATTN_CHECK(o->q_len <= kv, "bench: --q-len {} exceeds the prefill case's KV length {}; the query is the last "
                   "--q-len tokens of the KV sequence (set --kv-len with --op prefill)", o->q_len, kv);
      cases.push_back({"prefill", o->batch > 0 && o->op == "prefill" ? o->batch : 2, o->q_len > 0 ? o->q_len : kv, kv});
    }
    for (const Case& c : cases) check_case_fits(*o, c.batch, c.q_len, c.kv_len);
    const int threads = o->threads > 0 ? checked_cast<int>(o->threads, "bench: --threads")
                                       : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    ops::set_cpu_num_threads(threads);
    nlohmann::json report;
    report["device"] = dev.str();
    report["threads"] = threads;
    report["shape"] = {{"num_qo_heads", o->num_qo_heads}, {"num_kv_heads", o->num_kv_heads},
                       {"head_dim", o->head_dim}, {"page_size", o->page_size}, {"dtype", o->dtype},
                       {"kv_dtype", o->kv_dtype.empty() ? o->dtype : o->kv_dtype}};
    double copy_bw = 0;
    if (dev.is_cpu()) {
      copy_bw = ops::bench::measure_cpu_copy_bandwidth(o->copy_mib << 20, threads);
      report["copy_GBps"] = copy_bw / 1e9;
      if (!o->json)
        fmt::print("memory copy ({} MiB, {} threads, read + write): {:.2f} GB/s\n", o->copy_mib, threads, copy_bw / 1e9);
    }
    // Prefill is compute-bound: its ceiling is the FMA peak, measured here when a prefill case runs.
    double fma_peak = 0;
    const bool runs_prefill = o->suite || o->op == "prefill" || o->op == "all";
    if (dev.is_cpu() && runs_prefill) {
      fma_peak = measure_cpu_fma_gflops(threads);
      report["fma_peak_GFLOP_per_s"] = fma_peak;
      if (!o->json) fmt::print("f32 FMA peak ({} threads): {:.1f} GFLOP/s\n", threads, fma_peak);
    }
    const auto sync = [dev] { if (dev.is_cuda()) cuda::synchronize(); };
    const auto run_case = [&](const char* name, int64_t batch, int64_t q_len, int64_t kv_len) {
      const bool compute_bound = q_len > 1;  // prefill: FLOPs per KV byte grow with the query length
      Setup s = make_setup(*o, batch, q_len, kv_len, dev, threads);
      const auto st = ops::bench::time_kernel([&] { ops::paged_attention(s.args); }, sync, 1, 3, o->min_seconds);
      const double gbps = s.bytes / st.median_s / 1e9, gflops = s.flops / st.median_s / 1e9;
      nlohmann::json j = {{"batch", batch}, {"q_len", q_len}, {"kv_len", kv_len}, {"median_ms", st.median_s * 1e3},
                          {"min_ms", st.min_s * 1e3}, {"cpu_ms_per_call", st.cpu_mean_s * 1e3}, {"iters", st.iters}, {"kv_GBps", gbps}, {"GFLOP_per_s", gflops}};
      if (compute_bound && fma_peak > 0) j["ratio_to_fma_peak"] = gflops / fma_peak;
      if (!compute_bound && copy_bw > 0) j["ratio_to_copy"] = gbps * 1e9 / copy_bw;
      report[name] = j;
      if (!o->json) {
        fmt::print("{:8} batch {} x q {} x kv {}: median {:.3f} ms (min {:.3f}, {} iters), KV read {:.2f} GB/s, "
                   "{:.2f} GFLOP/s",
                   name, batch, q_len, kv_len, st.median_s * 1e3, st.min_s * 1e3, st.iters, gbps, gflops);
        if (compute_bound && fma_peak > 0) fmt::print(", {:.0f}% of the FMA peak", 100.0 * gflops / fma_peak);
        if (!compute_bound && copy_bw > 0) fmt::print(", {:.0f}% of copy bandwidth", 100.0 * gbps * 1e9 / copy_bw);
        fmt::print(" [CPU time {:.1f} ms/call]\n", st.cpu_mean_s * 1e3);
      }
    };
    if (o->suite) {
      // The anchors' standard shapes (performance-anchors.md) that fit a host's memory.
      const double fma = fma_peak;
      run_case("decode 1x1024", 1, 1, 1024);
      run_case("decode 16x4096", 16, 1, 4096);
      run_case("decode 64x4096", 64, 1, 4096);
      run_case("decode 128x4096", 128, 1, 4096);
      const std::string saved = o->kv_dtype;
      o->kv_dtype = "fp8_e4m3";
      run_case("decode fp8 64x4096", 64, 1, 4096);
      o->kv_dtype = saved;
      run_case("prefill causal 16x1024", 16, 1024, 1024);
      run_case("prefill causal 8x2048", 8, 2048, 2048);
      if (!o->json) {
        fmt::print("ratios: decode rows to the copy bandwidth above; prefill GFLOP/s to the FMA peak:");
        for (const char* k : {"prefill causal 16x1024", "prefill causal 8x2048"})
          fmt::print(" {} {:.0f}%", k, 100.0 * report[k]["GFLOP_per_s"].get<double>() / fma);
        fmt::print("\n");
      } else {
        fmt::print("{}\n", report.dump(2));
      }
      return 0;
    }
    for (const Case& c : cases) run_case(c.name, c.batch, c.q_len, c.kv_len);
    if (o->json) fmt::print("{}\n", report.dump(2));
    return 0;
  };
}

const bool bench_registered =
    register_command({"bench", "Time the attention ops against the ceilings measured in the same run (copy bandwidth, FMA peak)",
                      &setup_bench, 800});

}  // namespace
}  // namespace kvattn::tools
