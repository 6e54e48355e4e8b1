// Fuzz target for the engine's scheduler (kvattn::engine::simulate_schedule): the bytes choose
// a model's KV cache groups (from `kvattn plan` for tiny-llama, tiny-gemma2 or hybrid-mamba, or
// synthetic full / sliding-window / state groups), a budget, the scheduler's limits and options
// (prefix sharing, chunking through the token budget, DCP block spans, the admission policy)
// and a trace.  simulate_schedule checks every step (budget, seats, real blocks for every token
// computed or attended to, pool and owner invariants, no idle step), and the end (every
// admissible request finished with exactly its output_len, rejection iff it can never fit,
// all blocks free, within the step and recompute bounds); a violation is an InternalError and
// aborts.  `plan`'s "fits" must agree: a max-length request is never rejected under a plan
// that succeeded.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "kvattn/core/error.h"
#include "kvattn/engine/runner.h"
#include "kvattn/engine/scheduler_check.h"

using namespace kvattn;
using namespace kvattn::engine;

namespace {

struct Bytes {
  const uint8_t* p;
  const uint8_t* end;
  uint32_t next(uint32_t mod) {
    uint32_t v = 0;
    for (int i = 0; i < 2; ++i) v = v * 256 + (p != end ? *p++ : 0);
    return mod ? v % mod : v;
  }
};

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_scheduler: %s\n", what);
  std::abort();
}

// Plans are cached: planning is the slow part, and the bytes pick among few budgets.
const KVPlan* plan_for(const std::string& model, int64_t mib, int64_t batched, int64_t max_len) {
  static std::map<std::tuple<std::string, int64_t, int64_t, int64_t>, std::unique_ptr<KVPlan>> cache;
  auto key = std::make_tuple(model, mib, batched, max_len);
  auto it = cache.find(key);
  if (it == cache.end()) {
    std::unique_ptr<KVPlan> plan;
    try {
      PlanOptions po;
      po.gpu_memory = mib << 20;
      po.max_num_batched_tokens = batched;
      po.max_model_len = max_len;
      plan = std::make_unique<KVPlan>(plan_kv_cache(load_model_config(model), po));
    } catch (const InvalidArgument&) {
      // plan says it does not fit; run refuses the same budget (it plans first).
    }
    it = cache.emplace(key, std::move(plan)).first;
  }
  return it->second.get();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in{data, data + size};
  const int32_t max_seqs = 1 + static_cast<int32_t>(in.next(16));
  const int32_t batched = 8 << in.next(8);  // 8 .. 1024
  const bool sharing = in.next(4) != 0;
  const bool reserve = in.next(2) != 0;
  SchedulerConfig cfg;
  int32_t num_blocks = 0;
  int64_t max_len = 0;
  if (in.next(2) == 0) {
    static const char* kModels[] = {"tiny-llama", "tiny-gemma2", "hybrid-mamba"};
    const std::string model = kModels[in.next(3)];
    max_len = int64_t{256} << in.next(3);  // 256 .. 1024
    const KVPlan* plan = plan_for(model, 1 + in.next(24), batched, max_len);
    if (plan == nullptr) return 0;
    const int64_t dcp = model == "tiny-llama" ? 1 + in.next(2) : 1;
    cfg = make_scheduler_config(*plan, max_seqs, batched, dcp, sharing);
    num_blocks = static_cast<int32_t>(plan->config.num_blocks);
    // plan's "fits" agrees with run: a max-length request is admissible.
    const TraceRequest longest{0, 0, static_cast<int32_t>(max_len - 1), 1};
    Scheduler probe(cfg, num_blocks, {longest});
    if (probe.num_rejected() != 0) fail("a max-length request is rejected under a plan that fits");
    if (in.next(2) == 0) num_blocks = 2 + static_cast<int32_t>(in.next(static_cast<uint32_t>(num_blocks)));
  } else {
    cfg.block_size = 1 << in.next(6);  // 1 .. 32
    cfg.max_num_seqs = max_seqs;
    cfg.max_num_batched_tokens = batched;
    cfg.enable_prefix_sharing = sharing;
    cfg.groups.clear();
    const int groups = 1 + static_cast<int>(in.next(3));
    for (int g = 0; g < groups; ++g) {
      SchedulerGroup sg;
      const uint32_t kind = in.next(4);
      if (kind == 2) {
        sg.kind = KVGroupKind::sliding_window;
        sg.sliding_window = 1 + static_cast<int32_t>(in.next(300));
      } else if (kind == 3 && g > 0) {
        sg.kind = KVGroupKind::state;
      }
      cfg.groups.push_back(sg);
    }
    max_len = 16 + in.next(1024);
    cfg.max_model_len = max_len;
    num_blocks = 2 + static_cast<int32_t>(in.next(400));
  }
  cfg.reserve_to_finish = reserve;
  std::vector<TraceRequest> reqs;
  const int n = 1 + static_cast<int>(in.next(12));
  int64_t arrival = 0;
  for (int i = 0; i < n; ++i) {
    TraceRequest r;
    r.id = i;
    r.source_line = i + 1;
    const uint32_t gap = in.next(8);
    arrival += gap == 7 ? int64_t{1} << (20 + in.next(21)) : gap;  // sometimes an idle stretch up to 2^40
    r.arrival_step = std::min<int64_t>(arrival, int64_t{1} << 41);
    r.output_len = 1 + static_cast<int32_t>(in.next(static_cast<uint32_t>(std::min<int64_t>(max_len - 1, 96))));
    r.prompt_len = 1 + static_cast<int32_t>(in.next(static_cast<uint32_t>(max_len - r.output_len)));
    if (in.next(3) != 0) {
      r.shared_prefix_id = static_cast<int32_t>(in.next(3));
      r.shared_prefix_len = static_cast<int32_t>(in.next(static_cast<uint32_t>(r.prompt_len) + 1));
    }
    reqs.push_back(r);
  }
  try {
    (void)simulate_schedule(cfg, num_blocks, reqs, reserve ? 1.5 : 64.0);
  } catch (const InternalError& e) {
    std::fprintf(stderr, "fuzz_scheduler: %s\n", e.what());
    std::abort();
  }
  return 0;
}
