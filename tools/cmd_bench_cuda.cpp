// `kvattn bench-cuda`: the product table of the CUDA kernels on the shapes of
// docs/PERFORMANCE.md — for each target shape kvattn's time and rate (CUDA events, median), the
// ceiling measured in the same run (device copy, mma.sync / wgmma rate), FlashInfer's figure for
// the shape on an H200 and the target.  Setup (as the FlashInfer anchors): bf16, 32 query heads /
// 8 KV heads, head dim 128, page 16, cache [num_pages, 2, page, Hkv, D] (K and V of a page
// adjacent, NHD), page ids a random permutation of a ~9 GB pool; calls rotate over disjoint page
// sets when one call's KV is under 256 MB, so the data is not L2-resident.  Decode and prefill
// targets are timed on a plan kept across calls ("[plan kept]": an ops::PagedAttentionPlan
// planned before the timing, what the layers after the first of an engine step run, and what
// FlashInfer's anchors time, run() after a host-side plan()).
//
//   kvattn bench-cuda [--quick] [--only decode|prefill|write|merge|small] [--diagnostics] [--json]
//
// --diagnostics adds the rows that explain the product figures (plan per call, other paths and
// kernels on the same calls through the tool's routing hooks, loads-only ceilings, probes, the
// wgmma consumer schedules); --json writes bench/plot.py's input.  The instruments (ceilings,
// probes, event timing) are tools/cuda/, part of this tool, not of the library.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bench_shape.h"
#include "command_registry.h"
#include "int_option.h"
#include "kvattn/core/cuda_runtime_api.h"
#include "kvattn/core/tensor.h"
#include "kvattn/ops/ops.h"
#include <nlohmann/json.hpp>
#if defined(KVATTN_WITH_CUDA)
#include "cuda/bench_routing.h"
#include "cuda/bench_support.h"
#include "ops/cuda/hopper_prefill.h"
#include "ops/cuda/routing.h"
#endif

namespace kvattn::tools {
namespace {

struct Opts {
  bool quick = false;
  std::string only;
  int64_t batch = 0, kv_len = 0;  // --shape: one decode case only
  bool fp8 = false;
  bool mixed = false;  // --batch case with lengths U[256, kv_len] (the 128xU row's generator)
  int64_t long_len = 0;  // --batch case: the last request's length instead (one long request among short ones)
  std::string variants;  // --batch case once per "opts/splits[/chunk]" setting of attn_kernel's decode
  bool diagnostics = false;  // --diagnostics: variants, probes and loads-only ceilings among the rows
  bool json = false;         // --json: one JSON object (bench/plot.py's input) instead of the table
  int64_t iters = 0, spaced_us = 0, gather_ctas = 0;  // measurement settings (tools/cuda/bench_support.h)
  bool loop_mean = false;
  std::string gather_timeline;
  bool kept_plan = false;  // --kept-plan: the --batch case on a plan kept across calls
  bool sequential_pages = false;  // --sequential-pages: decode page ids in pool order (diagnostic)
};

#if defined(KVATTN_WITH_CUDA)
namespace k = kvattn::ops::cuda_impl::k;
namespace cb = kvattn::tools::cuda_bench;

// --sequential-pages: decode requests read consecutive pool pages instead of a random permutation
// (a diagnostic of page-order effects: address translation, DRAM locality); the anchors and
// targets use random order
bool g_sequential_pages = false;

// Uniform(-1, 1) values of dtype dt, generated on the host in chunks and copied.
void fill_device_random(const Tensor& t, uint64_t seed) {
  const int64_t es = t.element_size();
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<uint8_t> table(static_cast<size_t>(4096 * es));
  for (int i = 0; i < 4096; ++i) store_from_double(table.data() + i * es, t.dtype(), u(rng));
  // one random 64 MiB chunk from the host, replicated on the device (fast for 9 GB pools)
  const int64_t total = t.nbytes();
  const int64_t chunk = std::min<int64_t>(int64_t(64) << 20, total);
  std::vector<uint8_t> host(static_cast<size_t>(chunk));
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i + es <= chunk; i += es) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    std::memcpy(host.data() + i, table.data() + (x & 4095) * es, static_cast<size_t>(es));
  }
  char* base = static_cast<char*>(t.data());
  if (chunk > 0) kvattn::cuda::memcpy(base, host.data(), static_cast<size_t>(chunk));
  for (int64_t off = chunk; off < total; off += chunk)
    kvattn::cuda::memcpy(base + off, base, static_cast<size_t>(std::min(chunk, total - off)));
}

struct Pool {
  Tensor backing;  // [P, 2, page, Hkv, D]
  Tensor k, v;
  int64_t pages = 0;
};
Pool make_pool(int64_t pages, DType dt) {
  Pool p;
  p.pages = pages;
  p.backing = Tensor::empty({pages, 2, kPage, kHkv, kD}, dt, Device::cuda(0));
  fill_device_random(p.backing, 42);  // uniform(-1, 1) in the pool dtype (fp8 codes stay finite)
  p.k = p.backing.select(1, 0);
  p.v = p.backing.select(1, 1);
  return p;
}

// The order decode sets take their pages in: every page of the pool but the reserved page 0, a
// fixed random permutation (pool order with --sequential-pages).
std::vector<int32_t> pool_page_order(const Pool& pool) {
  std::mt19937 rng(7);
  std::vector<int32_t> perm(static_cast<size_t>(pool.pages - 1));
  std::iota(perm.begin(), perm.end(), 1);
  if (!g_sequential_pages) std::shuffle(perm.begin(), perm.end(), rng);
  return perm;
}

struct DecodeSet {
  Tensor qo, indptr, indices, last;
};

struct Row {
  std::string name;
  double us = 0, value = 0;
  std::string unit, target;
};

// --json: the rows are collected and written as one object at the end (finish)
bool g_json = false;
std::vector<Row>& json_rows() {
  static std::vector<Row> rows;
  return rows;
}

void print_row(const Row& r) {
  if (g_json) {
    json_rows().push_back(r);
    return;
  }
  fmt::print("{:<44} {:>10.1f} us {:>9.3f} {:<8} {}\n", r.name, r.us, r.value, r.unit, r.target);
  std::fflush(stdout);
}

// --json: {"device", "sms", "rows": [{"name", "us", "value", "unit", "target"}]} (bench/plot.py SCHEMA)
void finish(const std::string& device, int sms) {
  if (!g_json) return;
  nlohmann::json rows = nlohmann::json::array();
  for (const Row& r : json_rows())
    rows.push_back({{"name", r.name}, {"us", r.us}, {"value", r.value}, {"unit", r.unit}, {"target", r.target}});
  fmt::print("{}\n", nlohmann::json{{"device", device}, {"sms", sms}, {"rows", rows}}.dump(1));
  std::fflush(stdout);
}

// One decode configuration: kv lengths per request; rotating sets of pages.  kept_plan: every
// set has its ops::PagedAttentionPlan, planned once before the timing, so the timed calls are
// what the layers after the first of an engine step run (FlashInfer's run() after plan(); its
// anchors time run() only); otherwise every timed call runs its plan kernel too.
// hint: pass the batch's KvLengthsHint as the native decode wrapper does (classify_kv_lengths of
// the host lengths); false: unknown.
Row bench_decode(const std::string& name, const Pool& pool, const std::vector<int64_t>& lens, DType dt,
                 const std::string& target, bool quick, bool kept_plan = false, bool hint = true) {
  const int64_t B = static_cast<int64_t>(lens.size());
  int64_t pages_needed = 0;
  for (int64_t l : lens) pages_needed += (l + kPage - 1) / kPage;
  const int64_t esz = dtype_size(dt);
  const double kv_bytes = [&] {
    double s = 0;
    for (int64_t l : lens) s += double(l) * kHkv * kD * 2 * esz;
    return s;
  }();
  int sets = kv_bytes < 256e6 ? static_cast<int>(std::min<int64_t>((pool.pages - 1) / std::max<int64_t>(pages_needed, 1), 16)) : 1;
  sets = std::max(sets, 1);
  const std::vector<int32_t> perm = pool_page_order(pool);
  std::vector<DecodeSet> ds;
  for (int s = 0; s < sets; ++s) {
    std::vector<int32_t> qo(static_cast<size_t>(B + 1)), ip(static_cast<size_t>(B + 1)), last(static_cast<size_t>(B));
    std::vector<int32_t> ind;
    int64_t next = int64_t(s) * pages_needed;
    for (int64_t r = 0; r < B; ++r) {
      qo[r + 1] = static_cast<int32_t>(r + 1);
      const int64_t n = (lens[r] + kPage - 1) / kPage;
      ip[r + 1] = ip[r] + static_cast<int32_t>(n);
      last[r] = static_cast<int32_t>(n == 0 ? 0 : lens[r] - (n - 1) * kPage);
      for (int64_t i = 0; i < n; ++i) ind.push_back(perm[static_cast<size_t>((next++) % int64_t(perm.size()))]);
    }
    DecodeSet d;
    d.qo = Tensor::from_vector(qo).to(Device::cuda(0));
    d.indptr = Tensor::from_vector(ip).to(Device::cuda(0));
    d.indices = Tensor::from_vector(ind).to(Device::cuda(0));
    d.last = Tensor::from_vector(last).to(Device::cuda(0));
    ds.push_back(d);
  }
  Tensor q = Tensor::empty({B, kHq, kD}, DType::bf16, Device::cuda(0));
  fill_device_random(q, 3);
  Tensor out = Tensor::empty({B, kHq, kD}, DType::bf16, Device::cuda(0));
  Tensor lse = Tensor::empty({B, kHq}, DType::f32, Device::cuda(0));
  struct Ctx {
    ops::PagedAttentionArgs a;
    std::vector<DecodeSet>* ds;
    std::vector<ops::PagedAttentionPlan>* plans;  // one per set, or nullptr
  } ctx;
  std::vector<ops::PagedAttentionPlan> plans(kept_plan ? ds.size() : 0);
  ctx.ds = &ds;
  ctx.plans = kept_plan ? &plans : nullptr;
  ctx.a.query = q;
  ctx.a.k_cache = pool.k;
  ctx.a.v_cache = pool.v;
  ctx.a.out = out;
  ctx.a.lse = lse;
  if (hint) ctx.a.kv_lengths = ops::classify_kv_lengths(std::vector<int32_t>(lens.begin(), lens.end()));
  ctx.a.max_query_len = 1;  // one row per request, as the native decode wrapper says
  auto call = [](void* c, int i) {
    auto* x = static_cast<Ctx*>(c);
    const size_t s = static_cast<size_t>(i) % x->ds->size();
    const DecodeSet& d = (*x->ds)[s];
    x->a.qo_indptr = d.qo;
    x->a.paged_kv_indptr = d.indptr;
    x->a.paged_kv_indices = d.indices;
    x->a.paged_kv_last_page_len = d.last;
    x->a.plan = x->plans != nullptr ? &(*x->plans)[s] : nullptr;
    ops::paged_attention(x->a);
  };
  for (size_t s = 0; kept_plan && s < ds.size(); ++s) call(&ctx, static_cast<int>(s));  // the step's plans
  const double us = cb::time_median_us(call, &ctx, 10, quick ? 20 : 60);
  // host time to submit one call (no sync inside the loop): when it is near the event time,
  // the event time measures the host, not the kernel
  double host_us = 0;
  if (kv_bytes < 64e6) {
    kvattn::cuda::synchronize();
    const int n = 100;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) call(&ctx, i);
    host_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
    kvattn::cuda::synchronize();
  }
  Row r;
  r.name = name;
  r.us = us;
  r.value = kv_bytes / (us * 1e-6) / 1e12;
  r.unit = "TB/s";
  r.target = host_us > 0 ? fmt::format("{} [host submit {:.1f} us/call]", target, host_us) : target;
  if (kept_plan) {
    int64_t planned = 0;
    for (const auto& pl : plans) planned += pl.plans();
    if (planned > static_cast<int64_t>(plans.size()))  // a plan was not reusable: say so, do not hide it
      r.target += fmt::format(" [{} plans for {} sets: not all calls reused one]", planned, plans.size());
  }
  return r;
}

// kept_plan: as bench_decode's (planned once before the timing, the timed calls reuse it).
// Request r: kv_lens[r] keys, its query the last q_lens[r] tokens (chunked prefill after the
// others are cached); pages a random permutation of the pool's.
Row bench_prefill_lens(const std::string& name, const Pool& pool, const std::vector<int64_t>& kv_lens,
                       const std::vector<int64_t>& q_lens, bool causal, const std::string& target, bool quick,
                       bool kept_plan) {
  const int64_t B = static_cast<int64_t>(kv_lens.size());
  std::mt19937 rng(11);
  std::vector<int32_t> perm(static_cast<size_t>(pool.pages - 1));
  std::iota(perm.begin(), perm.end(), 1);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> qo(static_cast<size_t>(B + 1)), ip(static_cast<size_t>(B + 1)), last(static_cast<size_t>(B)), ind;
  double pairs = 0;
  for (int64_t r = 0; r < B; ++r) {
    const int64_t L = kv_lens[static_cast<size_t>(r)], Lq = q_lens[static_cast<size_t>(r)];
    const int64_t n = (L + kPage - 1) / kPage;
    qo[r + 1] = static_cast<int32_t>(qo[r] + Lq);
    ip[r + 1] = static_cast<int32_t>(ip[r] + n);
    last[r] = static_cast<int32_t>(L - (n - 1) * kPage);
    for (int64_t i = 0; i < n; ++i) ind.push_back(perm[ind.size()]);
    const double ctx = double(L - Lq);
    pairs += causal ? double(Lq) * ctx + double(Lq) * (Lq + 1) / 2 : double(Lq) * L;
  }
  const int64_t T = qo[B];
  Tensor q = Tensor::empty({T, kHq, kD}, DType::bf16, Device::cuda(0));
  fill_device_random(q, 5);
  Tensor out = Tensor::empty({T, kHq, kD}, DType::bf16, Device::cuda(0));
  ops::PagedAttentionArgs a;
  a.query = q;
  a.k_cache = pool.k;
  a.v_cache = pool.v;
  a.out = out;
  a.causal = causal;
  a.qo_indptr = Tensor::from_vector(qo).to(Device::cuda(0));
  a.paged_kv_indptr = Tensor::from_vector(ip).to(Device::cuda(0));
  a.paged_kv_indices = Tensor::from_vector(ind).to(Device::cuda(0));
  a.paged_kv_last_page_len = Tensor::from_vector(last).to(Device::cuda(0));
  ops::PagedAttentionPlan plan;
  if (kept_plan) {
    a.plan = &plan;
    ops::paged_attention(a);
  }
  const double us = cb::time_median_us([](void* c, int) { ops::paged_attention(*static_cast<ops::PagedAttentionArgs*>(c)); },
                                      &a, 3, quick ? 5 : 20);
  Row r;
  r.name = name;
  r.us = us;
  r.value = 4.0 * kD * kHq * pairs / (us * 1e-6) / 1e12;
  r.unit = "TFLOP/s";
  r.target = target;
  if (kept_plan && plan.plans() > 1)  // a plan was not reusable: say so, do not hide it
    r.target += fmt::format(" [{} plans: not all calls reused one]", plan.plans());
  return r;
}
// B requests of L keys, each query its last Lq tokens (Lq <= 0: all L).
Row bench_prefill(const std::string& name, const Pool& pool, int64_t B, int64_t L, bool causal,
                  const std::string& target, bool quick, bool kept_plan = false, int64_t Lq = -1) {
  return bench_prefill_lens(name, pool, std::vector<int64_t>(static_cast<size_t>(B), L),
                            std::vector<int64_t>(static_cast<size_t>(B), Lq > 0 ? Lq : L), causal, target, quick, kept_plan);
}

Row bench_write(const Pool& pool, int64_t T, const std::string& target, bool quick) {
  Tensor key = Tensor::empty({T, kHkv, kD}, DType::bf16, Device::cuda(0));
  Tensor value = Tensor::empty({T, kHkv, kD}, DType::bf16, Device::cuda(0));
  fill_device_random(key, 8);
  fill_device_random(value, 9);
  std::mt19937 rng(13);
  const int sets = 8;
  std::vector<int64_t> perm(static_cast<size_t>((pool.pages - 1) * kPage));
  std::iota(perm.begin(), perm.end(), kPage);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<Tensor> slots;
  for (int s = 0; s < sets; ++s) {
    std::vector<int64_t> v(perm.begin() + s * T, perm.begin() + (s + 1) * T);
    std::sort(v.begin(), v.end());  // new tokens land in consecutive slots of their pages
    slots.push_back(Tensor::from_vector(v).to(Device::cuda(0)));
  }
  struct Ctx {
    ops::ReshapeAndCacheArgs a;
    std::vector<Tensor>* slots;
  } ctx;
  ctx.a.key = key;
  ctx.a.value = value;
  ctx.a.key_cache = pool.k;
  ctx.a.value_cache = pool.v;
  ctx.slots = &slots;
  const double us = cb::time_median_us(
      [](void* c, int i) {
        auto* x = static_cast<Ctx*>(c);
        x->a.slot_mapping = (*x->slots)[static_cast<size_t>(i) % x->slots->size()];
        ops::reshape_and_cache_flash(x->a);
      },
      &ctx, 10, quick ? 20 : 60);
  Row r;
  r.name = fmt::format("KV write (reshape_and_cache) {} tokens", T);
  r.us = us;
  r.value = 2.0 * 2 * T * kHkv * kD * 2 / (us * 1e-6) / 1e12;  // K+V read and written
  r.unit = "TB/s";
  r.target = target;
  return r;
}

// The page ids bench_decode gives its first set (the same permutation), the first `count` of them,
// request-major, on the GPU: what the loads-only ceilings and the page probe read.
Tensor first_set_page_ids(const Pool& pool, int64_t count) {
  const std::vector<int32_t> perm = pool_page_order(pool);
  std::vector<int32_t> ind(perm.begin(), perm.begin() + count);
  return Tensor::from_vector(ind).to(Device::cuda(0));
}

// A lower bound of the read ceiling of decode's access pattern: the K / V rows of B uniform
// requests of L keys on the pages bench_decode gives its first set (same permutation), loaded
// and discarded in the decode's unit order (cb::measure_kv_gather_tbps).
// mode 1: balanced ranges of tiles; 2: balanced ranges of whole pages (every KV head at once);
// 3: the same pages by the bulk copy engine (the highest read rate measured over these pages);
// 4: mode 3 with pages claimed in blocks of 4 at run time (no equal-range imbalance at the end).
Row bench_gather(const Pool& pool, int64_t B, int64_t L, int mode = 0) {
  const int64_t n = L / kPage;
  Row r;
  r.name = fmt::format("ceiling: K/V gather {}x{}{} (decode's pages, loads only)", B, L,
                       mode == 1   ? ", ranges"
                       : mode == 2 ? ", pages"
                       : mode == 3 ? ", pages, bulk copy"
                       : mode == 4 ? ", pages, bulk, claimed"
                                   : "");
  r.unit = "TB/s";
  if (B * n > pool.pages - 1) {
    r.target = "(pool too small: not measured)";
    return r;
  }
  const Tensor indices = first_set_page_ids(pool, B * n);
  const int64_t es = pool.k.element_size();
  r.value = cb::measure_kv_gather_tbps(pool.k.data(), pool.v.data(), pool.k.stride(0) * es, pool.k.stride(1) * es,
                                      pool.k.stride(2) * es, indices.data_ptr<int32_t>(), static_cast<int>(B),
                                      static_cast<int>(L / 64), static_cast<int>(kHkv), mode);
  return r;
}

// The whole-page decode probe (cb::measure_page_decode_probe_tbps) on the pages bench_gather uses.
// mode: 0 merge untimed, 1 one launch, 2 two launches (see cb::measure_page_decode_probe_tbps)
Row bench_page_probe(const Pool& pool, int64_t B, int64_t L, int mode) {
  const int64_t n = L / kPage;
  Row r;
  r.name = fmt::format("probe: whole-page decode {}x{} ({})", B, L,
                       mode == 1 ? "one launch" : mode == 2 ? "two launches" : "merge untimed");
  r.unit = "TB/s";
  if (B * n > pool.pages - 1 || L % kPage != 0) {
    r.target = "(pool too small or a partial last page: not measured)";
    return r;
  }
  const Tensor indices = first_set_page_ids(pool, B * n);
  double err = -1;
  r.value = cb::measure_page_decode_probe_tbps(pool.k.data(), pool.v.data(), pool.k.stride(0) * pool.k.element_size(),
                                              indices.data_ptr<int32_t>(), static_cast<int>(B), static_cast<int>(n), mode,
                                              &err);
  r.target = r.value > 0 ? fmt::format("max |err| vs f32 reference {:.2e}", err) : "(shape not covered)";
  return r;
}

Row bench_merge(int64_t T, const std::string& target, bool quick) {
  const int sets = 4;
  struct Set { Tensor po, so, pl, sl, out; };
  std::vector<Set> s;
  for (int i = 0; i < sets; ++i) {
    Set x;
    x.po = Tensor::empty({T, kHq, kD}, DType::bf16, Device::cuda(0));
    x.so = Tensor::empty({T, kHq, kD}, DType::bf16, Device::cuda(0));
    x.out = Tensor::empty({T, kHq, kD}, DType::bf16, Device::cuda(0));
    x.pl = Tensor::empty({kHq, T}, DType::f32, Device::cuda(0));
    x.sl = Tensor::empty({kHq, T}, DType::f32, Device::cuda(0));
    fill_device_random(x.po, 20 + i);
    fill_device_random(x.so, 30 + i);
    fill_device_random(x.pl, 40 + i);
    fill_device_random(x.sl, 50 + i);
    s.push_back(x);
  }
  const double us = cb::time_median_us(
      [](void* c, int i) {
        auto* v = static_cast<std::vector<Set>*>(c);
        const Set& x = (*v)[static_cast<size_t>(i) % v->size()];
        ops::merge_attn_states(x.out, x.po, x.pl, x.so, x.sl);
      },
      &s, 10, quick ? 20 : 60);
  Row r;
  r.name = fmt::format("merge_attn_states {}x{}x{}", T, kHq, kD);
  r.us = us;
  r.value = (3.0 * T * kHq * kD * 2 + 2.0 * T * kHq * 4) / (us * 1e-6) / 1e12;
  r.unit = "TB/s";
  r.target = target;
  return r;
}

// Runs the decode rows of `name` on `lens` under the routing `change` makes (then restores it).
template <typename F>
Row with_routing(F change, const std::function<Row()>& row) {
  const k::KernelRouting saved = cb::routing();
  change(cb::routing());
  Row r = row();
  cb::routing() = saved;
  return r;
}

// The diagnostic modes (--batch, --only small): a shape or a path in detail.
int run_batch(const Opts& o) {
  KVATTN_CHECK(!o.mixed || o.kv_len >= 256, "bench-cuda: --mixed draws lengths from U[256, --kv-len]; --kv-len {} is "
               "below 256", o.kv_len);
  std::vector<int64_t> lens(static_cast<size_t>(o.batch), o.kv_len);
  if (o.mixed) {
    std::mt19937 rng(99);
    std::uniform_int_distribution<int64_t> u(256, o.kv_len);
    for (auto& x : lens) x = u(rng);
  }
  if (o.long_len > 0) lens.back() = o.long_len;
  int64_t pages = 0;
  for (int64_t x : lens) pages += (x + kPage - 1) / kPage;
  const DType dt = o.fp8 ? DType::fp8_e4m3 : DType::bf16;
  Pool one = make_pool(std::max<int64_t>(pages * 2 + 1, 1024), dt);
  const std::string name = fmt::format("decode {} {}x{}{}", o.fp8 ? "fp8" : "bf16", o.batch, o.mixed ? "U[256," : "",
                                       o.kv_len) + (o.mixed ? "]" : "") +
                           (o.long_len > 0 ? fmt::format(" (last {})", o.long_len) : std::string()) +
                           (o.sequential_pages ? " [sequential pages]" : "");
  if (o.variants.empty()) {
    // bf16 uniform lengths of whole 512-key chunks: the loads-only kernel over the same pages first
    if (!o.fp8 && !o.mixed && o.long_len == 0 && o.kv_len % 512 == 0) {
      for (int mode : {0, 1, 2, 3, 4}) print_row(bench_gather(one, o.batch, o.kv_len, mode));
      for (int mode : {0, 1, 2}) print_row(bench_page_probe(one, o.batch, o.kv_len, mode));
    }
    print_row(bench_decode(name, one, lens, dt, "", true, o.kept_plan));
    // the same call with the whole-page decode path off (attn_kernel's decode), same process
    print_row(with_routing([](k::KernelRouting& r) { r.page_decode = k::Route::off; },
                           [&] { return bench_decode(name + " [page path off]", one, lens, dt, "", true, o.kept_plan); }));
    return 0;
  }
  // A/B of attn_kernel's decode settings in one process (routing.h decode_options / splits / chunk)
  for (size_t pos = 0; pos < o.variants.size();) {
    size_t end = o.variants.find(',', pos);
    if (end == std::string::npos) end = o.variants.size();
    const std::string v = o.variants.substr(pos, end - pos);
    pos = end + 1;
    const size_t slash = v.find('/');
    const size_t slash2 = slash == std::string::npos ? slash : v.find('/', slash + 1);
    const int opts = std::atoi(v.c_str()), splits = slash == std::string::npos ? 0 : std::atoi(v.c_str() + slash + 1);
    const int chunk = slash2 == std::string::npos ? 0 : std::atoi(v.c_str() + slash2 + 1);
    print_row(with_routing(
        [&](k::KernelRouting& r) {
          r.decode_options = opts & k::kDecodeOptsMask;
          r.decode_splits = splits;
          r.decode_chunk = chunk;
        },
        [&] {
          return bench_decode(fmt::format("{} [opts {} splits {}{}]{}", name, opts, splits,
                                          chunk > 0 ? fmt::format(" chunk {}", chunk) : std::string(),
                                          o.kept_plan ? " [plan kept]" : ""),
                              one, lens, dt, "", o.quick, o.kept_plan);
        }));
  }
  return 0;
}

int run_small(const Opts& o, const Pool& pool) {
  auto uni = [](int64_t b, int64_t l) { return std::vector<int64_t>(static_cast<size_t>(b), l); };
  // the small-call path's measurement set: what a launch and its drain add to a spinning grid,
  // the cluster kernel on 1 x 1024 (three rows), 4 warps against the automatic warp choice and the
  // 8-warp route off against on (A/Bs, two rounds each), 1 x 8192 and 8 x 1024, then one request
  // of 1024 to 8192 keys at a bound of 4, 8 and 16 pieces per unit
  for (const auto& [ctas, cl, sm] : {std::tuple{128, 1, 0}, std::tuple{128, 16, 98304}, std::tuple{128, 8, 98304}})
    print_row(Row{fmt::format("launch + drain: {} CTAs, cluster {}, smem {} (8 us spin)", ctas, cl, sm),
                  cb::measure_spin_launch_us(ctas, cl, sm, 8.0) - 8.0, 0, "", ""});
  for (int round = 0; round < 3; ++round)
    print_row(bench_decode("decode bf16 1x1024", pool, uni(1, 1024), DType::bf16, "<= 10 us", o.quick));
  using Shapes = std::initializer_list<std::pair<int, int>>;
  // one routing setting A/B in this process: every arm on every shape, alternated over two rounds
  auto ab = [&](std::initializer_list<std::pair<bool, const char*>> arms, void (*set)(k::KernelRouting&, bool),
                Shapes shapes) {
    for (int round = 0; round < 2; ++round)
      for (const auto& [value, tag] : arms)
        for (const auto& [b, l] : shapes)
          print_row(with_routing([&, v = value](k::KernelRouting& r) { set(r, v); }, [&] {
            return bench_decode(fmt::format("decode bf16 {}x{} [{}]", b, l, tag), pool, uni(b, l), DType::bf16, "",
                                o.quick);
          }));
  };
  // warps per CTA of the cluster kernel: 4, then automatic (8 where they fit)
  ab({{true, "warps 4"}, {false, "warps auto"}}, [](k::KernelRouting& r, bool v) { r.small_warps4 = v; },
     Shapes{{1, 1024}, {1, 2048}, {1, 4096}, {1, 8192}, {2, 1024}, {4, 1024}, {8, 1024}});
  // the 8-warp route (calls below 4 pieces per unit on 4 warps whose 8-warp clusters fill >= 3/4
  // of the SMs) off and on; off runs them on attn_kernel's small form
  ab({{false, "route8 off"}, {true, "route8 on"}}, [](k::KernelRouting& r, bool v) { r.small_route8 = v; },
     Shapes{{8, 1024}, {12, 1024}, {16, 1024}, {8, 2048}, {8, 4096}, {12, 4096}, {16, 4096}});
  print_row(bench_decode("decode bf16 1x8192", pool, uni(1, 8192), DType::bf16, "(FI 23.7 us)", o.quick));
  print_row(bench_decode("decode bf16 8x1024", pool, uni(8, 1024), DType::bf16, "", o.quick));
  // pieces per unit (the cluster size) against the keys per piece
  for (int64_t len : {1024, 2048, 4096, 8192})
    for (int cmax : {4, 8, 16})
      print_row(with_routing([cmax](k::KernelRouting& r) { r.small_cluster_max = cmax; }, [&] {
        return bench_decode(fmt::format("decode bf16 1x{} [pieces <= {}]", len, cmax), pool, uni(1, len), DType::bf16,
                            "", o.quick);
      }));
  return 0;
}

int run(const Opts& o) {
  g_sequential_pages = o.sequential_pages;
  g_json = o.json;
  cb::settings().iters = static_cast<int>(o.iters);
  cb::settings().spaced_us = static_cast<int>(o.spaced_us);
  cb::settings().loop_mean = o.loop_mean;
  cb::settings().gather_ctas = static_cast<int>(o.gather_ctas);
  cb::settings().gather_timeline = o.gather_timeline;
  if (!kvattn::cuda::available()) {
    fmt::print(stderr, "bench-cuda: no CUDA device visible\n");
    return 2;
  }
  const std::string device = kvattn::cuda::device_name(0);
  const int sms = kvattn::cuda::multiprocessor_count(0);
  if (!g_json) {
    fmt::print("kvattn bench-cuda on {} ({} SMs)\n", device, sms);
    fmt::print("{:<44} {:>13} {:>9} {:<8} {}\n", "case", "median", "rate", "unit",
               "same-run ceiling | FlashInfer anchor | target");
  }
  const double copy_tbps = cb::measure_copy_tbps(int64_t(2) << 30);
  const double mma_tflops = cb::measure_mma_tflops();
  print_row(Row{"ceiling: device copy 2 GiB (read+write)", 0, copy_tbps, "TB/s", "(anchor 4.23-4.25)"});
  print_row(Row{"ceiling: mma.sync bf16 m16n8k16, registers", 0, mma_tflops, "TFLOP/s", "(cuBLAS 8192^3 ~790)"});
  const double stream3 = cb::measure_stream3_tbps(int64_t(64) << 20);
  print_row(Row{"ceiling: stream 2 reads + 1 write, 3 x 64 MiB", 0, stream3, "TB/s", "(merge's pattern)"});
  const bool diag = o.diagnostics;
  if (diag) {  // floor of a one-launch op's event time: empty kernels timed back to back as the ops are
    print_row(Row{"ceiling: empty launch, 1 CTA", cb::measure_empty_launch_us(1, 1), 0, "", "(launch floor)"});
    print_row(Row{"ceiling: empty launch, 128 CTAs", cb::measure_empty_launch_us(128, 1), 0, "", ""});
    print_row(Row{"ceiling: empty launch, 128 CTAs in clusters of 16", cb::measure_empty_launch_us(128, 16), 0, "", ""});
  }
  int rc = 0;
  if (o.batch > 0) {
    rc = run_batch(o);
    finish(device, sms);
    return rc;
  }
  const bool all = o.only.empty();
  // pool: 140k pages of 64 KiB (bf16) = 9.2 GB
  const int64_t pool_pages = o.quick ? 40000 : 140000;
  Pool pool = make_pool(pool_pages, DType::bf16);
  auto uni = [](int64_t b, int64_t l) { return std::vector<int64_t>(static_cast<size_t>(b), l); };  // b requests of l keys
  if (o.only == "small") {
    rc = run_small(o, pool);
    finish(device, sms);
    return rc;
  }
  // a product row: the same-run ceiling and the FlashInfer anchor next to its target
  auto product = [](Row r, const std::string& ceiling, const std::string& anchor, const std::string& target) {
    r.target = fmt::format("{} | {} | {}", ceiling.empty() ? "-" : ceiling, anchor.empty() ? "-" : anchor,
                           target.empty() ? "-" : target) + (r.target.empty() ? "" : " " + r.target);
    return r;
  };
  const std::string copy_ceiling = fmt::format("copy {:.2f} TB/s", copy_tbps);
  if (all || o.only == "decode") {
    print_row(product(bench_decode("decode bf16 1x1024", pool, uni(1, 1024), DType::bf16, "", o.quick), "", "", "<= 10 us"));
    print_row(product(bench_decode("decode bf16 1x8192", pool, uni(1, 8192), DType::bf16, "", o.quick), "", "FI 23.7 us", ""));
    print_row(product(bench_decode("decode bf16 16x4096", pool, uni(16, 4096), DType::bf16, "", o.quick), copy_ceiling,
                      "FI 3.4-3.5 TB/s", ""));
    if (diag) {
      // the same small shapes on attn_kernel's general path (plan, attention, merge launches), and
      // the small path's two kernels: attn_kernel's small form, the cluster kernel at <= 8 and
      // <= 16 pieces per unit (small path forced, so the cluster rows run the cluster kernel also
      // where automatic routing leaves a shape to attn_kernel's small form: 16 x 4096)
      for (const auto& [b, l] : {std::pair{1, 1024}, std::pair{1, 8192}, std::pair{16, 4096}, std::pair{8, 1024}})
        print_row(with_routing([](k::KernelRouting& r) { r.small_decode = k::Route::off; }, [&, b = b, l = l] {
          return bench_decode(fmt::format("decode bf16 {}x{} [general path]", b, l), pool, uni(b, l), DType::bf16, "",
                              o.quick);
        }));
      for (const auto& [cluster, cmax, tag] : {std::tuple{false, 16, "attn_kernel small"}, std::tuple{true, 8, "cluster <= 8"},
                                               std::tuple{true, 16, "cluster <= 16"}})
        for (const auto& [b, l] : {std::pair{1, 1024}, std::pair{8, 1024}, std::pair{1, 8192}, std::pair{16, 4096}})
          print_row(with_routing(
              [cluster = cluster, cmax = cmax](k::KernelRouting& r) {
                r.small_decode = k::Route::force;
                r.small_cluster = cluster;
                r.small_cluster_max = cmax;
              },
              [&, b = b, l = l, tag = tag] {
                return bench_decode(fmt::format("decode bf16 {}x{} [{}]", b, l, tag), pool, uni(b, l), DType::bf16, "",
                                    o.quick);
              }));
    }
    // the target shapes on a plan kept across calls (the engine's layers after the first of a
    // step; FlashInfer's anchors time run() after plan()); diagnostics add the plan kernel in every
    // call and the same call with the whole-page path off
    auto target_row = [&](const std::string& name, const Pool& pl, const std::vector<int64_t>& lens, DType dt,
                          const std::string& anchor, const std::string& target) {
      if (diag) print_row(bench_decode(name + " [plan per call]", pl, lens, dt, "", o.quick));
      const Row kept = bench_decode(name + " [plan kept]", pl, lens, dt, "", o.quick, true);
      print_row(product(kept, copy_ceiling, anchor, target));
      if (diag)
        print_row(with_routing([](k::KernelRouting& r) { r.page_decode = k::Route::off; }, [&] {
          return bench_decode(name + " [plan kept, page path off]", pl, lens, dt, "", o.quick, true);
        }));
      return kept;
    };
    if (diag) {
      for (int mode : {0, 1, 2, 3, 4}) print_row(bench_gather(pool, 64, 4096, mode));
      for (int mode : {0, 1, 2}) print_row(bench_page_probe(pool, 64, 4096, mode));
    }
    target_row("decode bf16 64x4096", pool, uni(64, 4096), DType::bf16, "", ">= 4.4 TB/s");
    if (diag) {
      for (int mode : {0, 1, 2, 3, 4}) print_row(bench_gather(pool, 128, 4096, mode));
      for (int mode : {0, 1, 2}) print_row(bench_page_probe(pool, 128, 4096, mode));
    }
    target_row("decode bf16 128x4096", pool, uni(128, 4096), DType::bf16, "", ">= 4.4 TB/s");
    std::mt19937 rng(99);
    std::uniform_int_distribution<int64_t> u(256, 8192);
    std::vector<int64_t> mixed(128);
    for (auto& x : mixed) x = u(rng);
    target_row("decode bf16 128xU[256,8192]", pool, mixed, DType::bf16, "", ">= 4.2 TB/s");
    if (diag) {
      // the mixed row without the lengths hint (the work counter, as callers that pass no hint get)
      print_row(bench_decode("decode bf16 128xU[256,8192] [plan kept, no hint]", pool, mixed, DType::bf16, "", o.quick,
                             true, false));
      // one long request among short ones: its pieces span most CTAs, so the merge of a cut
      // request (two levels past page_sched::kGroup pieces) is on this row's tail
      std::vector<int64_t> skewed = uni(64, 1024);
      skewed.back() = 131072;
      target_row("decode bf16 63x1024 + 1x131072", pool, skewed, DType::bf16, "", "");
    }
    if (!o.quick || pool_pages >= 131072) {
      const Row bf = target_row("decode bf16 256x8192", pool, uni(256, 8192), DType::bf16, "FI 4.3-4.5 TB/s", "");
      pool = Pool{};
      Pool p8 = make_pool(pool_pages, DType::fp8_e4m3);
      const Row f8 = target_row("decode fp8 e4m3 256x8192", p8, uni(256, 8192), DType::fp8_e4m3, "", ">= 1.6x bf16 speed");
      if (!g_json) fmt::print("  fp8 speed-up over bf16 (time ratio, plans kept): {:.2f}x (target >= 1.6x)\n", bf.us / f8.us);
      if (diag)
        print_row(bench_decode("decode fp8 e4m3 1x1024", p8, uni(1, 1024), DType::fp8_e4m3, "(small path)", o.quick));
      p8 = Pool{};
      pool = make_pool(pool_pages, DType::bf16);
    }
  }
  if (all || o.only == "prefill") {
    try {
      const std::string mma_ceiling = fmt::format("mma.sync {:.0f} TFLOP/s", mma_tflops);
      if (diag)
        for (const auto& [B, L, causal] : {std::tuple{8, 2048, true}, std::tuple{8, 2048, false}, std::tuple{1, 8192, true}})
          print_row(bench_prefill(fmt::format("prefill {} bf16 {}x{} [plan per call]", causal ? "causal" : "non-causal", B, L),
                                  pool, B, L, causal, "", o.quick));
      // the prefill shapes (plans kept) as routed — the wgmma kernel where it serves the call,
      // else the mma.sync kernel, each row tagged with its kernel and next to that kernel's
      // same-run ceiling — with FlashInfer's FA3 paged (and FA2) figures of the same H200 shape
      // and #38's target, FA3's speed; diagnostics: the wgmma kernel under each consumer
      // schedule, then the mma.sync kernel
      const double wg = cb::measure_wgmma_tflops();
      print_row(Row{"ceiling: wgmma bf16 m64n256k16, shared memory", 0, wg, "TFLOP/s", wg > 0 ? "(cuBLAS 8192^3 ~790)" : "(no sm_90a code)"});
      if (diag && wg > 0) {
        // the prefill kernel's own wgmma shapes, alone and as one tile's mix (tensor work only)
        const char* mixes[] = {"S = QK^T 8 x m64n128k16 (shared memory)", "PV 16 x m64n64k16 (P in registers)",
                               "PV 8 x m64n128k16 (P in registers)", "tile: S + PV as m64n64", "tile: S + PV as m64n128"};
        for (int mix = 1; mix <= 5; ++mix)
          print_row(Row{fmt::format("ceiling: wgmma bf16 {}", mixes[mix - 1]), 0, cb::measure_wgmma_mix_tflops(mix), "TFLOP/s",
                        "(2 warpgroups per SM, no softmax)"});
      }
      const std::string wg_ceiling = wg > 0 ? fmt::format("wgmma {:.0f} TFLOP/s", wg) : mma_ceiling;
      struct Shape {
        int64_t B, L, Lq;
        bool causal;
        const char *fa3, *fa2;
      };
      for (const Shape sh : {Shape{8, 2048, -1, true, "465", "299"}, Shape{1, 8192, -1, true, "517", "302"},
                             Shape{4, 4096, -1, true, "487", "316"}, Shape{16, 1024, -1, true, "367", "272"},
                             Shape{32, 512, -1, true, "248", "230"}, Shape{8, 4096, 512, true, "538", "320"},
                             Shape{8, 2048, -1, false, "509", "334"}, Shape{1, 32768, 2048, true, nullptr, nullptr}}) {
        const std::string shape = sh.Lq > 0 ? fmt::format("{}x(q {}, kv {})", sh.B, sh.Lq, sh.L) : fmt::format("{}x{}", sh.B, sh.L);
        const std::string base = fmt::format("prefill {} bf16 {} [plan kept]", sh.causal ? "causal" : "non-causal", shape);
        auto timed = [&](const std::string& tag_for_wgmma) {
          Row r = bench_prefill(base, pool, sh.B, sh.L, sh.causal, "", o.quick, true, sh.Lq);
          const cb::PrefillServed served = cb::last_prefill();
          r.name += served.wgmma ? tag_for_wgmma : std::string(" [mma.sync]");
          if (!served.wgmma) r.target = served.reason;
          return r;
        };
        // (the last shape, a long context's prefill chunk, has no FlashInfer figure)
        const Row routed = timed(" [wgmma]");
        print_row(product(routed, routed.name.ends_with(" [wgmma]") ? wg_ceiling : mma_ceiling,
                          sh.fa3 ? fmt::format("FA3 paged {}, FA2 {}", sh.fa3, sh.fa2) : std::string("-"),
                          sh.fa3 ? fmt::format(">= {} TFLOP/s (FA3)", sh.fa3) : std::string("-")));
        if (!diag) continue;
        // the plan's tail left as whole units (the routed row cuts it where the plan finds it pays)
        print_row(with_routing([](k::KernelRouting& r) { r.prefill_tail_split = 1; },
                               [&] { return timed(" [wgmma, tail whole]"); }));
        for (const int sched : {0, 1, 2, 3})
          print_row(with_routing(
              [sched](k::KernelRouting& r) {
                r.prefill_hopper = k::Route::force;
                r.hopper_sched = sched;
              },
              [&] { return timed(fmt::format(" [wgmma {}]", k::hopper_prefill_sched_name(sched))); }));
        print_row(with_routing([](k::KernelRouting& r) { r.prefill_hopper = k::Route::off; }, [&] { return timed(""); }));
      }
      {
        // a batch of mixed lengths (no FlashInfer figure of it): 16 requests of U[256, 4096]
        // tokens (seeded), where the units' costs differ most
        std::mt19937 rng(23);
        std::vector<int64_t> lens;
        for (int i = 0; i < 16; ++i) lens.push_back(256 + static_cast<int64_t>(rng() % 3841));
        cb::reset_last_prefill();
        Row r = bench_prefill_lens("prefill causal bf16 mixed 16x U[256, 4096] [plan kept]", pool, lens, lens, true, "",
                                   o.quick, true);
        const cb::PrefillServed served = cb::last_prefill();
        r.name += served.wgmma ? " [wgmma]" : " [mma.sync]";
        print_row(product(r, served.wgmma ? wg_ceiling : mma_ceiling, "", ""));
      }
      {
        // fp8 e4m3 pages (plan kept): the wgmma kernel widens them to f16 on sm_90a; FlashInfer's
        // fp8 prefill on the same H200 is its FA2 path (245 TFLOP/s)
        pool = Pool{};
        Pool p8 = make_pool(pool_pages, DType::fp8_e4m3);
        cb::reset_last_prefill();
        Row r = bench_prefill("prefill causal fp8 e4m3 8x2048 [plan kept]", p8, 8, 2048, true, "", o.quick, true);
        const cb::PrefillServed served = cb::last_prefill();
        r.name += served.wgmma ? " [wgmma]" : " [attn_kernel]";
        print_row(product(r, served.wgmma ? wg_ceiling : mma_ceiling, "FA2 fp8 245", ">= 400 TFLOP/s"));
        p8 = Pool{};
        pool = make_pool(pool_pages, DType::bf16);
      }
      if (diag) {
        // the same shapes on attn_kernel's prefill configuration
        for (const auto& [B, L, causal] : {std::tuple{8, 2048, true}, std::tuple{8, 2048, false}, std::tuple{1, 8192, true}})
          print_row(with_routing([](k::KernelRouting& r) { r.prefill = k::Route::off; }, [&, B = B, L = L, causal = causal] {
            return bench_prefill(fmt::format("prefill {} {}x{} [attn_kernel]", causal ? "causal" : "non-causal", B, L), pool,
                                 B, L, causal, "", o.quick);
          }));
      }
    } catch (const std::exception& e) {
      fmt::print(stderr, "prefill: {}\n", e.what());
    }
  }
  if (all || o.only == "write") {
    print_row(product(bench_write(pool, 16384, "", o.quick), copy_ceiling, "", ">= 3.4 TB/s"));
    print_row(product(bench_write(pool, 256, "", o.quick), "", "FI ~4.7 us", ""));
  }
  if (all || o.only == "merge") {
    const std::string s3 = fmt::format("stream {:.2f} TB/s", stream3);
    print_row(product(bench_merge(8192, "", o.quick), s3, "", ">= 3.8 TB/s"));
    print_row(product(bench_merge(256, "", o.quick), "", "FI ~5 us floor", ""));
  }
  finish(device, sms);
  return 0;
}
#endif

std::function<int()> setup(CLI::App& app) {
  auto o = std::make_shared<Opts>();
  app.option_defaults()->always_capture_default();
  app.add_flag("--quick", o->quick, "fewer repetitions and a smaller pool");
  app.add_option("--only", o->only, "decode, prefill, write or merge; small: the small-call measurement set")
      ->check(CLI::IsMember({"decode", "prefill", "write", "merge", "small"}));
  // --batch / --kv-len: page ids of 2 * batch * kv-len / 16 pages stay within int32.
  auto* batch = add_int_option(app, "--batch", o->batch, 1, 4096,
                               "with --kv-len: time one decode shape only (and the same call with the whole-page path off)")
                    ->default_str("");
  auto* kv_len = add_int_option(app, "--kv-len", o->kv_len, 1, 1 << 20, "kv length of the --batch decode case")->default_str("");
  batch->needs(kv_len);
  kv_len->needs(batch);
  app.add_flag("--fp8", o->fp8, "the --batch case with an fp8 e4m3 cache")->needs(batch);
  app.add_flag("--mixed", o->mixed, "the --batch case with kv lengths U[256, kv-len] (as the 128xU row); --kv-len >= 256")
      ->needs(batch);
  add_int_option(app, "--long", o->long_len, 1, 1 << 20,
                 "the --batch case with its last request this long instead (one long request among short ones)")
      ->default_str("")
      ->needs(batch);
  app.add_flag("--kept-plan", o->kept_plan, "the --batch case on a plan kept across calls (plan kernel once per page set)")
      ->needs(batch);
  app.add_flag("--sequential-pages", o->sequential_pages,
               "decode page ids in pool order instead of a random permutation (diagnostic; the targets use random order)");
  app.add_flag("--diagnostics", o->diagnostics,
               "also the diagnostic rows: plan per call, other paths and kernels on the same calls, loads-only "
               "ceilings, probes, the wgmma consumer schedules");
  app.add_flag("--json", o->json, "write one JSON object (device, sms, rows) instead of the table: bench/plot.py's input");
  add_int_option(app, "--iters", o->iters, 1, 1 << 20, "timed calls per row instead of each row's count (diagnostic)")
      ->default_str("");
  add_int_option(app, "--spaced-us", o->spaced_us, 1, 1 << 20,
                 "time each call after this many microseconds of idle device, behind a hold kernel (diagnostic)")
      ->default_str("");
  app.add_flag("--loop-mean", o->loop_mean,
               "time a row as the mean over one event pair around all its calls, not the median of per-call events");
  add_int_option(app, "--gather-ctas", o->gather_ctas, 1, 1 << 16, "cap the bulk-copy gather ceiling's grid (diagnostic)")
      ->default_str("");
  app.add_option("--gather-timeline", o->gather_timeline,
                 "append the bulk-copy gather ceiling's per-CTA stamps to this CSV file (with --diagnostics)");
  app.add_option("--variants", o->variants,
                 "the --batch case once per opts/splits[/chunk] setting of attn_kernel's decode (routing.h decode_options, "
                 "decode_splits, decode_chunk; non-negative integers), e.g. "
                 "109/0,237/0,109/0/56")
      ->needs(batch)
      ->check([](const std::string& v) -> std::string {
        // Each comma-separated entry is 1 to 3 '/'-separated integers in [0, 2^31).
        size_t pos = 0;
        while (pos <= v.size()) {
          size_t end = v.find(',', pos);
          if (end == std::string::npos) end = v.size();
          const std::string entry = v.substr(pos, end - pos);
          int fields = 0;
          size_t f = 0;
          while (f <= entry.size()) {
            size_t g = entry.find('/', f);
            if (g == std::string::npos) g = entry.size();
            const std::string num = entry.substr(f, g - f);
            if (num.empty() || num.size() > 10 || num.find_first_not_of("0123456789") != std::string::npos ||
                std::stoll(num) > 2147483647)
              return "entry '" + entry + "' must be opts[/splits[/chunk]] with integers in [0, 2147483647]";
            ++fields;
            f = g + 1;
          }
          if (fields > 3) return "entry '" + entry + "' has more than 3 fields (opts/splits/chunk)";
          pos = end + 1;
        }
        return std::string();
      });
  return [o]() -> int {
#if defined(KVATTN_WITH_CUDA)
    return run(*o);
#else
    fmt::print(stderr, "bench-cuda: this build has no CUDA kernels (configure with -DKVATTN_CUDA=ON)\n");
    return 2;
#endif
  };
}

}  // namespace

int run_cuda_bench_suite(bool quick) {
#if defined(KVATTN_WITH_CUDA)
  Opts o;
  o.quick = quick;
  return run(o);
#else
  fmt::print(stderr, "bench --suite --device cuda: this build has no CUDA kernels (configure with -DKVATTN_CUDA=ON)\n");
  return 2;
#endif
}

namespace {
const bool bench_cuda_registered = register_command({"bench-cuda", "Benchmark the CUDA kernels against the H200 targets", &setup, 210});

}  // namespace
}  // namespace kvattn::tools
