// safetensors.cpp — header validation and read-only memory mapping of safetensors files.
#include "kvattn/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "kvattn/core/error.h"
#include "read_file.h"

namespace kvattn::model {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The safetensors format caps the header at 100 MB; larger is a corrupt file.
constexpr int64_t kMaxHeaderBytes = 100'000'000;

std::string clip(std::string_view s, size_t n = 80) {
  return s.size() <= n ? std::string(s) : std::string(s.substr(0, n)) + "...";
}

// a*b with overflow detection (both non-negative).
bool mul_overflows(int64_t a, int64_t b, int64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

int64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
             ? -1
             : static_cast<int64_t>(v);
}

}  // namespace

DType safetensors_dtype(std::string_view name, const std::string& context) {
  if (name == "BF16") return DType::bf16;
  if (name == "F16") return DType::f16;
  if (name == "F32") return DType::f32;
  throw InvalidArgument(fmt::format(
      "{}: dtype '{}' cannot be loaded; valid safetensors dtypes are BF16, F16, F32 (convert the "
      "checkpoint, e.g. save it again with torch_dtype=bfloat16)",
      context, clip(name)));
}

std::vector<SafetensorsEntry> parse_safetensors_header(std::string_view header_json,
                                                       int64_t data_size,
                                                       const std::string& file_label) {
  json j;
  try {
    j = json::parse(header_json.begin(), header_json.end());
  } catch (const json::exception& e) {
    throw InvalidArgument(fmt::format(
        "{}: the safetensors header is not valid JSON ({}); the file is corrupt or not a "
        "safetensors file",
        file_label, e.what()));
  }
  if (!j.is_object())
    throw InvalidArgument(fmt::format(
        "{}: the safetensors header must be a JSON object of tensor entries, got {}", file_label,
        j.type_name()));
  std::vector<SafetensorsEntry> entries;
  entries.reserve(j.size());
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object())
        throw InvalidArgument(fmt::format("{}: __metadata__ must be an object of strings, got {}",
                                          file_label, v.type_name()));
      for (auto m = v.begin(); m != v.end(); ++m)
        if (!m.value().is_string())
          throw InvalidArgument(fmt::format(
              "{}: __metadata__ value '{}' must be a string, got {}", file_label, clip(m.key()),
              m.value().type_name()));
      continue;
    }
    const std::string ctx = fmt::format("{}: tensor '{}'", file_label, clip(name));
    if (!v.is_object())
      throw InvalidArgument(fmt::format("{}: entry must be an object with dtype, shape and "
                                        "data_offsets, got {}",
                                        ctx, v.type_name()));
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || sh == v.end() || off == v.end())
      throw InvalidArgument(
          fmt::format("{}: entry needs the fields dtype, shape and data_offsets", ctx));
    if (!dt->is_string())
      throw InvalidArgument(fmt::format("{}: dtype must be a string, got {}", ctx, dt->type_name()));
    SafetensorsEntry e;
    e.name = name;
    e.dtype = safetensors_dtype(dt->get_ref<const std::string&>(), ctx);
    if (!sh->is_array())
      throw InvalidArgument(fmt::format("{}: shape must be an array of non-negative integers, got {}",
                                        ctx, sh->type_name()));
    if (sh->size() > static_cast<size_t>(kMaxDims))
      throw InvalidArgument(fmt::format("{}: shape has {} dimensions; at most {} are supported",
                                        ctx, sh->size(), kMaxDims));
    int64_t numel = 1;
    for (const json& d : *sh) {
      if (!d.is_number_integer() || (d.is_number_integer() && !d.is_number_unsigned() && d.get<int64_t>() < 0))
        throw InvalidArgument(fmt::format("{}: shape entries must be non-negative integers, got {}",
                                          ctx, clip(d.dump())));
      if (d.is_number_unsigned() && d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw InvalidArgument(fmt::format("{}: shape entry {} is too large", ctx, clip(d.dump())));
      const int64_t n = d.get<int64_t>();
      if (mul_overflows(numel, n, &numel))
        throw InvalidArgument(fmt::format("{}: shape {} overflows 64 bits", ctx, clip(sh->dump())));
      e.shape.push_back(n);
    }
    if (!off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      throw InvalidArgument(fmt::format(
          "{}: data_offsets must be [begin, end] with non-negative integers, got {}", ctx,
          clip(off->dump())));
    const uint64_t b = (*off)[0].get<uint64_t>(), en = (*off)[1].get<uint64_t>();
    if (b > en || en > static_cast<uint64_t>(data_size))
      throw InvalidArgument(fmt::format(
          "{}: data_offsets [{}, {}] lie outside the data section of {} bytes (begin <= end <= "
          "size required); the file is truncated or corrupt",
          ctx, b, en, data_size));
    e.begin = static_cast<int64_t>(b);
    e.end = static_cast<int64_t>(en);
    int64_t bytes = 0;
    if (mul_overflows(numel, dtype_size(e.dtype), &bytes) || bytes != e.end - e.begin)
      throw InvalidArgument(fmt::format(
          "{}: data_offsets [{}, {}] hold {} bytes but shape {} of {} needs {} bytes", ctx, e.begin,
          e.end, e.end - e.begin, e.shape.str(), dtype_name(e.dtype),
          mul_overflows(numel, dtype_size(e.dtype), &bytes) ? std::string("more than 2^63")
                                                            : std::to_string(bytes)));
    entries.push_back(std::move(e));
  }
  // The data section is covered exactly once, without holes or overlaps (as the reference
  // implementation requires).
  std::vector<const SafetensorsEntry*> order;
  order.reserve(entries.size());
  for (const auto& e : entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  int64_t pos = 0;
  for (const SafetensorsEntry* e : order) {
    if (e->begin != pos)
      throw InvalidArgument(fmt::format(
          "{}: tensor '{}' starts at byte {} of the data section but the previous tensor ends at "
          "{}; tensors must tile the data section without holes or overlaps",
          file_label, clip(e->name), e->begin, pos));
    pos = e->end;
  }
  if (pos != data_size)
    throw InvalidArgument(fmt::format(
        "{}: the tensors cover {} bytes but the data section has {} bytes; the file is corrupt",
        file_label, pos, data_size));
  return entries;
}

std::vector<SafetensorsEntry> parse_safetensors_bytes(std::span<const uint8_t> bytes,
                                                      const std::string& file_label) {
  if (bytes.size() < 8)
    throw InvalidArgument(fmt::format(
        "{}: {} bytes is too short for a safetensors file (8-byte header length, header, data); "
        "the file is truncated",
        file_label, bytes.size()));
  const int64_t n = read_u64_le(bytes.data());
  const int64_t avail = static_cast<int64_t>(bytes.size()) - 8;
  if (n < 0 || n > kMaxHeaderBytes || n > avail)
    throw InvalidArgument(fmt::format(
        "{}: header length {} exceeds the {} bytes after the length prefix (or the 100 MB "
        "limit); the file is truncated or not a safetensors file",
        file_label, n < 0 ? std::string("> 2^63") : std::to_string(n), avail));
  const std::string_view header(reinterpret_cast<const char*>(bytes.data()) + 8,
                                static_cast<size_t>(n));
  return parse_safetensors_header(header, avail - n, file_label);
}

// ---- WeightStore ------------------------------------------------------------------------

namespace {

struct Mapping {
  std::shared_ptr<Buffer> buffer;
  size_t size = 0;
};

Mapping map_file(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw InvalidArgument(fmt::format("cannot open '{}': {}; check the model directory",
                                      path.string(), std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InvalidArgument(fmt::format("'{}' is not a regular file", path.string()));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    throw InvalidArgument(fmt::format(
        "{}: {} bytes is too short for a safetensors file; the file is truncated", path.string(),
        size));
  }
  // Private, copy-on-write: the pages are shared with the page cache until someone writes.
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED)
    throw OutOfMemory(fmt::format("cannot map '{}' ({} bytes): {}", path.string(), size,
                                  std::strerror(err)));
  Mapping m;
  m.size = size;
  m.buffer = Buffer::wrap(p, size, Device::cpu(), [p, size] { ::munmap(p, size); });
  return m;
}

std::string read_text(const std::filesystem::path& p) { return detail::read_file(p); }

bool plain_file_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\\') == std::string::npos && s.find('\0') == std::string::npos;
}

}  // namespace

void WeightStore::add_file(std::shared_ptr<Buffer> bytes_buf, const fs::path& path) {
  const auto* bytes = static_cast<const uint8_t*>(bytes_buf->data());
  const size_t size = bytes_buf->size();
  auto entries = parse_safetensors_bytes({bytes, size}, path.string());
  const int64_t data_start = 8 + read_u64_le(bytes);
  const size_t file_index = files_.size();
  for (auto& e : entries) {
    if (auto it = tensors_.find(e.name); it != tensors_.end())
      throw InvalidArgument(fmt::format(
          "tensor '{}' appears in both '{}' and '{}'; a checkpoint holds each tensor once", e.name,
          files_[it->second.file].string(), path.string()));
    Item item;
    item.file = file_index;
    item.tensor = Tensor::from_buffer(bytes_buf, data_start + e.begin, e.shape,
                                      contiguous_strides(e.shape), e.dtype);
    total_bytes_ += e.end - e.begin;
    tensors_.emplace(e.name, std::move(item));
  }
  files_.push_back(path);
  mappings_.push_back(std::move(bytes_buf));
}

WeightStore WeightStore::open_files(const std::vector<fs::path>& files) {
  WeightStore ws;
  for (const fs::path& path : files) ws.add_file(map_file(path).buffer, path);
  return ws;
}

WeightStore WeightStore::from_buffer(std::shared_ptr<Buffer> bytes, const std::string& label) {
  KVATTN_CHECK(bytes && bytes->device().is_cpu(), "{}: safetensors bytes must be a CPU buffer", label);
  WeightStore ws;
  ws.add_file(std::move(bytes), label);
  return ws;
}

WeightStore WeightStore::open(const fs::path& model_dir) {
  const fs::path index = model_dir / "model.safetensors.index.json";
  const fs::path single = model_dir / "model.safetensors";
  if (!fs::exists(index)) {
    if (!fs::exists(single))
      throw InvalidArgument(fmt::format(
          "'{}' has neither model.safetensors nor model.safetensors.index.json; kvattn loads "
          "safetensors checkpoints (save with safe_serialization=True)",
          model_dir.string()));
    return open_files({single});
  }
  json j;
  try {
    j = json::parse(read_text(index));
  } catch (const json::exception& e) {
    throw InvalidArgument(fmt::format("{}: not valid JSON ({})", index.string(), e.what()));
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw InvalidArgument(fmt::format(
        "{}: needs a \"weight_map\" object mapping tensor names to shard file names",
        index.string()));
  std::map<std::string, std::vector<std::string>> by_shard;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string())
      throw InvalidArgument(fmt::format("{}: weight_map['{}'] must be a shard file name, got {}",
                                        index.string(), it.key(), it.value().type_name()));
    const std::string& shard = it.value().get_ref<const std::string&>();
    if (!plain_file_name(shard))
      throw InvalidArgument(fmt::format(
          "{}: weight_map['{}'] = '{}' is not a file name inside the model directory",
          index.string(), it.key(), shard));
    by_shard[shard].push_back(it.key());
  }
  if (by_shard.empty())
    throw InvalidArgument(fmt::format("{}: weight_map is empty", index.string()));
  std::vector<fs::path> files;
  for (const auto& [shard, names] : by_shard) {
    const fs::path p = model_dir / shard;
    if (!fs::exists(p))
      throw InvalidArgument(fmt::format(
          "shard '{}' named by {} (for tensor '{}' and {} more) is missing from '{}'", shard,
          index.filename().string(), names.front(), names.size() - 1, model_dir.string()));
    files.push_back(p);
  }
  WeightStore ws = open_files(files);
  // Every weight_map entry is in the shard it names, and every shard tensor is listed.
  for (const auto& [shard, names] : by_shard)
    for (const std::string& n : names) {
      auto it = ws.tensors_.find(n);
      if (it == ws.tensors_.end() || ws.files_[it->second.file].filename() != shard)
        throw InvalidArgument(fmt::format(
            "{}: tensor '{}' is mapped to '{}' but {}", index.string(), n, shard,
            it == ws.tensors_.end()
                ? std::string("no shard holds it")
                : fmt::format("it is in '{}'", ws.files_[it->second.file].filename().string())));
    }
  size_t listed = 0;
  for (const auto& [shard, names] : by_shard) listed += names.size();
  if (listed != ws.tensors_.size())
    for (const auto& [name, item] : ws.tensors_)
      if (!j["weight_map"].contains(name))
        throw InvalidArgument(fmt::format(
            "{}: tensor '{}' in '{}' is not listed in weight_map; the index and the shards "
            "disagree",
            index.string(), name, ws.files_[item.file].filename().string()));
  return ws;
}

bool WeightStore::has(std::string_view name) const { return tensors_.find(name) != tensors_.end(); }

const Tensor& WeightStore::get(std::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    // Suggest names sharing the longest common prefix.
    std::vector<std::string> close;
    size_t best = 0;
    for (const auto& [n, item] : tensors_) {
      size_t k = 0;
      while (k < n.size() && k < name.size() && n[k] == name[k]) ++k;
      if (k > best) {
        best = k;
        close.clear();
      }
      if (k == best && k > 0 && close.size() < 3) close.push_back(n);
    }
    throw InvalidArgument(fmt::format(
        "the checkpoint has no tensor '{}' ({} tensors{}{}); the checkpoint does not match the "
        "architecture in config.json",
        name, tensors_.size(), close.empty() ? "" : "; closest: ", fmt::join(close, ", ")));
  }
  {
    std::lock_guard<std::mutex> lock(*claim_mutex_);
    claimed_[std::string(name)] = true;
  }
  return it->second.tensor;
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [n, item] : tensors_) out.push_back(n);
  return out;
}

const fs::path& WeightStore::file_of(std::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) (void)get(name);  // throws the named error
  return files_[it->second.file];
}

const Tensor& WeightStore::expect(std::string_view name, const Dims& shape) const {
  const Tensor& t = get(name);
  if (!(t.shape() == shape))
    throw InvalidArgument(fmt::format(
        "tensor '{}' in '{}' has shape {} but config.json implies {}; the checkpoint and "
        "config.json disagree",
        name, file_of(name).filename().string(), t.shape().str(), shape.str()));
  return t;
}

const Tensor& WeightStore::expect(std::string_view name, const Dims& shape, DType dtype) const {
  const Tensor& t = expect(name, shape);
  if (t.dtype() != dtype)
    throw InvalidArgument(fmt::format("tensor '{}' in '{}' has dtype {} but {} is expected", name,
                                      file_of(name).filename().string(), dtype_name(t.dtype()),
                                      dtype_name(dtype)));
  return t;
}

std::vector<std::string> WeightStore::unclaimed() const {
  std::vector<std::string> out;
  std::lock_guard<std::mutex> lock(*claim_mutex_);
  for (const auto& [n, item] : tensors_)
    if (!claimed_.count(n)) out.push_back(n);
  return out;
}

}  // namespace kvattn::model
