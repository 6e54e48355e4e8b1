// kvattn/model/safetensors.h — memory-mapped safetensors checkpoints (one file or shards).
//
// A WeightStore maps `model.safetensors` (or every shard named by
// `model.safetensors.index.json`) read-only and exposes each tensor as a CPU Tensor viewing the
// mapping: no copy, no allocation per tensor beyond its small descriptor.  Every header is
// validated before anything is exposed: JSON shape, dtype (BF16, F16, F32), offsets inside the
// data section, byte size = numel * element size, no overlap, no duplicate name across shards.
// A violation is an InvalidArgument naming the file and the tensor.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvattn/core/dtype.h"
#include "kvattn/core/tensor.h"

namespace kvattn::model {

// One tensor entry of a safetensors header, as validated.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  Dims shape;
  int64_t begin = 0;  // byte offsets relative to the start of the data section
  int64_t end = 0;
};

// Parses and validates a safetensors header (the bytes after the 8-byte length prefix) for a
// data section of `data_size` bytes.  Throws InvalidArgument naming `file_label` and the
// tensor.  Exposed for the fuzz target and tests; `WeightStore` uses it.
std::vector<SafetensorsEntry> parse_safetensors_header(std::string_view header_json,
                                                       int64_t data_size,
                                                       const std::string& file_label);

// Parses a whole in-memory safetensors file (length prefix + header + data).
std::vector<SafetensorsEntry> parse_safetensors_bytes(std::span<const uint8_t> bytes,
                                                      const std::string& file_label);

// safetensors dtype string ("BF16", "F16", "F32", ...) -> DType; throws InvalidArgument for
// dtypes kvattn does not load, listing the valid ones.
DType safetensors_dtype(std::string_view name, const std::string& context);

class WeightStore {
 public:
  WeightStore() = default;
  // Opens model_dir/model.safetensors, or the shards listed in
  // model_dir/model.safetensors.index.json (the index wins when both exist).  Validates every
  // header, the index's weight_map (every listed tensor present in its shard, no shard
  // missing) and maps the files read-only.
  static WeightStore open(const std::filesystem::path& model_dir);
  // Opens explicit safetensors files (tests, tools).
  static WeightStore open_files(const std::vector<std::filesystem::path>& files);
  // A whole safetensors file already in memory (`bytes` is kept alive by the tensors).
  static WeightStore from_buffer(std::shared_ptr<Buffer> bytes, const std::string& label);

  bool has(std::string_view name) const;
  // CPU tensor viewing the mapping; throws InvalidArgument naming the tensor (and the
  // closest names) when absent.
  const Tensor& get(std::string_view name) const;
  std::vector<std::string> names() const;  // sorted
  size_t size() const noexcept { return tensors_.size(); }
  // The file a tensor lives in (for error messages).
  const std::filesystem::path& file_of(std::string_view name) const;
  // Total bytes of tensor data over all files.
  int64_t total_bytes() const noexcept { return total_bytes_; }

  // Architecture hook: checks that `name` exists with exactly `shape` (and `dtype`, when
  // given) and returns it; otherwise throws InvalidArgument naming the tensor, the expected
  // and found shape/dtype, and the file.
  const Tensor& expect(std::string_view name, const Dims& shape) const;
  const Tensor& expect(std::string_view name, const Dims& shape, DType dtype) const;
  // Tensors not claimed by any expect() call so far (an architecture can reject them).
  std::vector<std::string> unclaimed() const;

 private:
  void add_file(std::shared_ptr<Buffer> bytes, const std::filesystem::path& label);
  struct Item {
    Tensor tensor;
    size_t file = 0;
  };
  std::map<std::string, Item, std::less<>> tensors_;
  std::vector<std::filesystem::path> files_;
  std::vector<std::shared_ptr<Buffer>> mappings_;
  mutable std::map<std::string, bool, std::less<>> claimed_;  // guarded by claim_mutex_
  std::shared_ptr<std::mutex> claim_mutex_ = std::make_shared<std::mutex>();
  int64_t total_bytes_ = 0;
};

}  // namespace kvattn::model
