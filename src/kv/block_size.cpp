// Kernel block size selection (see kv/block_size.h).
#include "kvattn/kv/block_size.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "kvattn/core/error.h"

namespace kvattn {

std::string kernel_block_size_str(const KernelBlockSize& size) {
  if (const auto* v = std::get_if<int64_t>(&size)) return fmt::format("{}", *v);
  if (const auto* m = std::get_if<MultipleOf>(&size)) return fmt::format("MultipleOf({})", m->base);
  return "<unknown>";
}

std::string format_kernel_block_sizes(const std::vector<KernelBlockSize>& sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i) out += ", ";
    out += kernel_block_size_str(sizes[i]);
  }
  return out + "]";
}

std::vector<KernelBlockSize> BlockSizeBackend::get_supported_kernel_block_sizes(const KVCacheSpec* spec) const {
  if (!supported_kernel_block_sizes) return {MultipleOf{1}};
  return supported_kernel_block_sizes(spec);
}

BlockSizeBackend BlockSizeBackend::with_sizes(std::string name, std::vector<KernelBlockSize> sizes) {
  BlockSizeBackend b;
  b.name = std::move(name);
  b.supported_kernel_block_sizes = [sizes = std::move(sizes)](const KVCacheSpec*) { return sizes; };
  return b;
}

namespace {

void check_backends(const std::vector<const BlockSizeBackend*>& backends,
                    const std::vector<const KVCacheSpec*>& specs, const char* fn) {
  KVATTN_CHECK(specs.empty() || specs.size() == backends.size(),
               "{}: {} specs for {} backends; pass one spec per backend (or none)", fn, specs.size(),
               backends.size());
  for (size_t i = 0; i < backends.size(); ++i)
    KVATTN_CHECK(backends[i] != nullptr, "{}: backend {} is null", fn, i);
}

const KVCacheSpec* spec_at(const std::vector<const KVCacheSpec*>& specs, size_t i) {
  return specs.empty() ? nullptr : specs[i];
}

// Validated sizes of one backend.
std::vector<KernelBlockSize> sizes_of(const BlockSizeBackend& b, const KVCacheSpec* spec) {
  std::vector<KernelBlockSize> sizes = b.get_supported_kernel_block_sizes(spec);
  for (const auto& s : sizes) {
    if (std::holds_alternative<std::monostate>(s))
      throw InvalidArgument(fmt::format(
          "Unknown supported size: {} declared by backend {}; declare an int block size or MultipleOf(base)",
          kernel_block_size_str(s), b.name));
    if (const auto* v = std::get_if<int64_t>(&s))
      KVATTN_CHECK(*v > 0, "backend {} declares kernel block size {}; sizes must be positive", b.name, *v);
    if (const auto* m = std::get_if<MultipleOf>(&s))
      KVATTN_CHECK(m->base > 0, "backend {} declares MultipleOf({}); the base must be positive", b.name,
                   m->base);
  }
  return sizes;
}

bool accepts(const std::vector<KernelBlockSize>& sizes, int64_t block_size) {
  for (const auto& s : sizes) {
    if (const auto* v = std::get_if<int64_t>(&s)) {
      if (*v == block_size) return true;
    } else if (const auto* m = std::get_if<MultipleOf>(&s)) {
      if (block_size % m->base == 0) return true;
    }
  }
  return false;
}

}  // namespace

bool block_size_is_supported(const std::vector<const BlockSizeBackend*>& backends, int64_t block_size,
                             const std::vector<const KVCacheSpec*>& specs) {
  check_backends(backends, specs, "block_size_is_supported");
  KVATTN_CHECK(block_size > 0, "block_size_is_supported: block size {} must be positive", block_size);
  for (size_t i = 0; i < backends.size(); ++i)
    if (!accepts(sizes_of(*backends[i], spec_at(specs, i)), block_size)) return false;
  return true;
}

int64_t select_common_block_size(int64_t kv_manager_block_size,
                                 const std::vector<const BlockSizeBackend*>& backends,
                                 const std::vector<const KVCacheSpec*>& specs) {
  check_backends(backends, specs, "select_common_block_size");
  KVATTN_CHECK(kv_manager_block_size > 0, "select_common_block_size: block size {} must be positive",
               kv_manager_block_size);
  if (block_size_is_supported(backends, kv_manager_block_size, specs)) return kv_manager_block_size;

  // A MultipleOf that accepts a divisor also accepts the manager size, so every remaining
  // candidate is an exact size some backend declares.
  std::set<int64_t, std::greater<>> candidates;
  for (size_t i = 0; i < backends.size(); ++i)
    for (const auto& s : sizes_of(*backends[i], spec_at(specs, i)))
      if (const auto* v = std::get_if<int64_t>(&s); v && kv_manager_block_size % *v == 0) candidates.insert(*v);
  for (int64_t size : candidates)
    if (block_size_is_supported(backends, size, specs)) return size;

  std::string detail;
  for (size_t i = 0; i < backends.size(); ++i) {
    if (i) detail += "; ";
    detail += fmt::format("{}: {}", backends[i]->name,
                          format_kernel_block_sizes(sizes_of(*backends[i], spec_at(specs, i))));
  }
  throw InvalidArgument(fmt::format(
      "No common block size for {} ({}). Choose a --block-size that every backend accepts or that one "
      "of their exact sizes divides.",
      kv_manager_block_size, detail));
}

std::shared_ptr<const AttentionSpec> customize_attention_spec(const BlockSizeBackend& backend,
                                                              const std::shared_ptr<const AttentionSpec>& spec_in) {
  KVATTN_CHECK(spec_in != nullptr, "customize_attention_spec: spec is null (backend {})", backend.name);
  std::shared_ptr<const AttentionSpec> spec = backend.customize_spec ? backend.customize_spec(spec_in) : spec_in;
  KVATTN_CHECK(spec != nullptr, "customize_attention_spec: backend {} customize_spec returned null",
               backend.name);
  const std::vector<KernelBlockSize> sizes = sizes_of(backend, spec.get());
  int64_t max_fixed = 0;
  bool all_fixed = !sizes.empty();
  for (const auto& s : sizes) {
    if (const auto* v = std::get_if<int64_t>(&s))
      max_fixed = std::max(max_fixed, *v);
    else
      all_fixed = false;
  }
  if (!spec->block_stride_alignment().has_value() && all_fixed) {
    AttentionSpecOptions opt = spec->options();
    opt.block_stride_alignment = max_fixed;
    return spec->with_options(opt);
  }
  return spec;
}

}  // namespace kvattn

// prepare_kernel_block_sizes lives here with the rest of the selection rules.
#include "kvattn/kv/attention_group.h"

namespace kvattn {

namespace {
// Stands in for a group without a backend: accepts every block size (vLLM's default).
const BlockSizeBackend& default_backend() {
  static const BlockSizeBackend b = BlockSizeBackend::with_sizes("default", {MultipleOf{1}});
  return b;
}
}  // namespace

std::vector<int64_t> prepare_kernel_block_sizes(const KVCacheConfig& kv_cache_config,
                                                const std::vector<std::vector<AttentionGroup>>& attn_groups) {
  std::vector<int64_t> kernel_block_sizes;
  const auto& groups = kv_cache_config.kv_cache_groups;
  for (size_t gid = 0; gid < groups.size(); ++gid) {
    const KVCacheGroupSpec& group = groups[gid];
    KVATTN_CHECK(group.kv_cache_spec != nullptr, "prepare_kernel_block_sizes: KV cache group {} has no spec",
                 gid);
    KVCacheSpecPtr spec = group.kv_cache_spec;
    if (spec->kind() == KVCacheSpecKind::UniformType) {
      // Every layer of a uniform group has the same type: any one dispatches.
      spec = iter_layer_specs(spec).front();
    }
    if (spec->kind() == KVCacheSpecKind::EncoderOnlyAttention) continue;
    if (!spec->has_layer_views()) {
      kernel_block_sizes.push_back(spec->block_size());
    } else if (as_attention_spec(spec)) {
      const int64_t manager_bs = group.kv_cache_spec->block_size();
      // Block-outermost packing puts other layers' pages between a layer's blocks, so such
      // groups are never split group-wide.
      bool packed = false;
      for (const KVCacheTensor& t : kv_cache_config.kv_cache_tensors) {
        if (t.block_stride <= t.layer_stride) continue;
        for (const auto& name : t.layers)
          if (std::find(group.layer_names.begin(), group.layer_names.end(), name) != group.layer_names.end())
            packed = true;
      }
      if (packed) {
        kernel_block_sizes.push_back(manager_bs);
        continue;
      }
      KVATTN_CHECK(gid < attn_groups.size(),
                   "prepare_kernel_block_sizes: no attention groups for KV cache group {} ({} given); pass "
                   "attention groups indexed by KV cache group id",
                   gid, attn_groups.size());
      std::vector<const BlockSizeBackend*> backends;
      std::vector<const KVCacheSpec*> specs;
      for (const AttentionGroup& g : attn_groups[gid]) {
        backends.push_back(g.backend ? g.backend : &default_backend());
        specs.push_back(g.kv_cache_spec.get());
      }
      kernel_block_sizes.push_back(select_common_block_size(manager_bs, backends, specs));
    } else if (spec->kind() == KVCacheSpecKind::Mamba) {
      kernel_block_sizes.push_back(spec->block_size());  // non-attention state: never split
    } else {
      throw Unsupported(fmt::format("prepare_kernel_block_sizes: unknown kv cache spec {} in group {}",
                                    spec->repr(), gid));
    }
  }
  return kernel_block_sizes;
}

}  // namespace kvattn
