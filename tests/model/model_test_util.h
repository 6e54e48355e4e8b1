// Test helpers for the model layer: temporary directories and an independent safetensors
// writer (the format written byte by byte here, not through kvattn).
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace kvattn::model::test {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() /
           ("kvattn_model_test_" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

inline void write_file(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

struct StTensor {
  std::string name, dtype;  // "F32", "F16", "BF16", ...
  std::vector<int64_t> shape;
  std::string data;          // raw little-endian bytes
};

// f32 values as raw bytes in the given safetensors dtype (F32, F16 via a simple
// round-to-nearest conversion of exactly representable values, BF16 by truncation of exact
// values).  Tests use values exactly representable in every dtype.
inline std::string encode_values(const std::vector<float>& v, const std::string& dtype) {
  std::string out;
  for (float x : v) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    if (dtype == "F32") {
      out.append(reinterpret_cast<const char*>(&bits), 4);
    } else if (dtype == "BF16") {
      const uint16_t h = static_cast<uint16_t>(bits >> 16);
      out.append(reinterpret_cast<const char*>(&h), 2);
    } else {  // F16 for small exact values
      const uint32_t sign = (bits >> 31) & 1, exp = (bits >> 23) & 0xFF, man = bits & 0x7FFFFF;
      uint16_t h = 0;
      if (exp != 0) h = static_cast<uint16_t>((sign << 15) | ((exp - 127 + 15) << 10) | (man >> 13));
      else h = static_cast<uint16_t>(sign << 15);
      out.append(reinterpret_cast<const char*>(&h), 2);
    }
  }
  return out;
}

inline std::string safetensors_bytes(const std::vector<StTensor>& ts, std::string metadata = {}) {
  std::string header = "{";
  if (!metadata.empty()) header += "\"__metadata__\":" + metadata + ",";
  std::string data;
  for (size_t i = 0; i < ts.size(); ++i) {
    const auto& t = ts[i];
    header += "\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
    for (size_t k = 0; k < t.shape.size(); ++k) {
      if (k) header += ',';
      header += std::to_string(t.shape[k]);
    }
    header += "],\"data_offsets\":[" + std::to_string(data.size()) + "," +
              std::to_string(data.size() + t.data.size()) + "]}";
    header += i + 1 < ts.size() ? "," : "";
    data += t.data;
  }
  header += "}";
  while (header.size() % 8) header += ' ';
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  out += header;
  out += data;
  return out;
}

}  // namespace kvattn::model::test
