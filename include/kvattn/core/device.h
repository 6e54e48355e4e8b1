// kvattn/core/device.h — where memory lives.  Host code never includes CUDA headers; the
// CUDA runtime is reached through kvattn/core/cuda_runtime_api.h, whose functions throw
// Unsupported in builds without CUDA.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kvattn {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;  // CUDA ordinal; 0 for CPU

  static constexpr Device cpu() { return Device{DeviceType::CPU, 0}; }
  static constexpr Device cuda(int i = 0) { return Device{DeviceType::CUDA, i}; }
  constexpr bool is_cpu() const { return type == DeviceType::CPU; }
  constexpr bool is_cuda() const { return type == DeviceType::CUDA; }
  friend constexpr bool operator==(const Device&, const Device&) = default;

  // "cpu" or "cuda:N".
  std::string str() const;
  // Parses "cpu", "cuda", "cuda:N"; throws InvalidArgument otherwise.
  static Device parse(std::string_view s);
};

}  // namespace kvattn
