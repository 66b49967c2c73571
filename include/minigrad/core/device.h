// Where a tensor lives. The CPU is device 0 of kind cpu; CUDA devices are numbered by the driver.
#pragma once

#include <cstdint>
#include <string>

namespace mg {

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::cuda, index}; }
  // "cpu", "cuda", "cuda:1"; throws mg::Error on anything else.
  static Device parse(const std::string& s);

  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

// Waits until every kernel queued on `d` has finished (nothing to wait for on the CPU), then
// reports any error a kernel flagged. Time a GPU step with it:
//   auto t0 = clock::now(); step(); mg::synchronize(d); auto t1 = clock::now();
void synchronize(Device d);

// True when this build has CUDA and a device is present at run time.
bool cuda_available();
int cuda_device_count();
// Why cuda_available() is false ("" when it is true): a build without CUDA, or the CUDA runtime's
// answer to the device count with the driver's and the runtime's versions (an old driver under a
// newer toolkit says so here).
std::string cuda_unavailable_reason();

}  // namespace mg
