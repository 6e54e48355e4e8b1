// Fuzz target for safetensors parsing (kvattn::model::WeightStore::from_buffer and
// parse_safetensors_header): arbitrary bytes, mutations of a valid file, and arbitrary values
// spliced into one header field must never crash or read out of bounds; every rejection is a
// kvattn error with a message.  Accepted files must expose tensors that lie inside the
// buffer (each is read in full).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "kvattn/core/buffer.h"
#include "kvattn/core/error.h"
#include "kvattn/model/safetensors.h"

namespace {

using kvattn::model::WeightStore;

void require(bool ok) {
  if (!ok) std::abort();
}

// Opens `bytes` as a safetensors file; on success reads every tensor element.
void open_bytes(const std::string& bytes) {
  auto buf = kvattn::Buffer::allocate(bytes.size() == 0 ? 1 : bytes.size());
  std::memcpy(buf->data(), bytes.data(), bytes.size());
  auto view = kvattn::Buffer::wrap(buf->data(), bytes.size(), kvattn::Device::cpu(), [buf] {});
  try {
    WeightStore ws = WeightStore::from_buffer(view, "fuzz.safetensors");
    double sum = 0;
    for (const std::string& name : ws.names()) {
      const kvattn::Tensor& t = ws.get(name);
      const auto [lo, hi] = t.byte_extent();
      require(lo >= 0 && hi <= static_cast<int64_t>(bytes.size()));
      for (double v : t.to_double_vector()) sum += v == v ? 0 : 1;  // touch every element
    }
    (void)sum;
  } catch (const kvattn::Error& e) {
    require(!e.message().empty());
  }
}

std::string with_prefix(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  out += header;
  out += data;
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string raw(reinterpret_cast<const char*>(data), size);
  // 1. The bytes as a whole file.
  open_bytes(raw);

  // 2. A valid file with bytes overwritten at fuzz-chosen positions (header and length).
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
      R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]},"c":{"dtype":"F16","shape":[1,1],"data_offsets":[22,24]}})";
  std::string file = with_prefix(header, std::string(24, '\x3c'));
  for (size_t i = 0; i + 1 < size && i < 64; i += 2)
    file[static_cast<size_t>(data[i]) * 257 % file.size()] = static_cast<char>(data[i + 1]);
  open_bytes(file);

  // 3. The input spliced into one field of a valid header, with the data length declared by
  // the first byte.
  if (size > 0) {
    const std::string value(raw.substr(1, 200));
    static const char* templates[] = {
        R"({"w":{"dtype":"F32","shape":%,"data_offsets":[0,16]}})",
        R"({"w":{"dtype":%,"shape":[4],"data_offsets":[0,16]}})",
        R"({"w":{"dtype":"F32","shape":[4],"data_offsets":%}})",
        R"({"w":%})",
        R"({"__metadata__":%,"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
        R"({%:{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
    };
    std::string h = templates[data[0] % 6];
    h.replace(h.find('%'), 1, value);
    try {
      (void)kvattn::model::parse_safetensors_header(h, data[0] % 3 == 0 ? 16 : data[0], "fuzz");
    } catch (const kvattn::Error& e) {
      require(!e.message().empty());
    }
    open_bytes(with_prefix(h, std::string(data[0] % 3 == 0 ? 16 : data[0], '\0')));
  }
  return 0;
}
