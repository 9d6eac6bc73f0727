#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
#include "ops/cuda/fill.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstring>

#include "ops/cuda/device_util.cuh"

namespace v4::cuda {
namespace {

__global__ void fill_random_kernel(void* dst, int64_t n, ops::fill::FillParams p) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    ops::fill::fill_one(dst, uint64_t(i), p);
}

// Driver version from the kernel module's line in /proc/driver/nvidia/version ("NVRM version:
// NVIDIA UNIX [Open Kernel Module for] x86_64  580.159.04  ..."): the first token made of digits
// and dots with at least one dot; empty if absent.
std::string driver_string() {
  FILE* f = std::fopen("/proc/driver/nvidia/version", "r");
  if (!f) return {};
  char line[512] = {};
  std::string out;
  if (std::fgets(line, sizeof line, f)) {
    const char* p = line;
    while (*p && out.empty()) {
      while (*p == ' ' || *p == '\t') ++p;
      const char* e = p;
      bool digits_dots = true, dot = false;
      while (*e && *e != ' ' && *e != '\t' && *e != '\n') {
        digits_dots &= (*e >= '0' && *e <= '9') || *e == '.';
        dot |= *e == '.';
        ++e;
      }
      if (e > p && digits_dots && dot && *p != '.') out.assign(p, e);
      p = e;
    }
  }
  std::fclose(f);
  return out;
}

}  // namespace

Status fill_random(void* dst, int64_t n, const ops::fill::FillParams& p, cudaStream_t stream) {
  if (n <= 0) return Status::Ok();
  fill_random_kernel<<<grid_for(n, 256, int64_t(132) * 16), 256, 0, stream>>>(dst, n, p);
  return check_launch("fill_random_kernel");
}

std::string device_info() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return "CUDA device (cudaGetDevice failed)";
  }
  cudaDeviceProp prop{};
  std::string name = "CUDA device";
  int sms = 0;
  double mem_gib = 0;
  if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess) {
    name = prop.name;
    sms = prop.multiProcessorCount;
    mem_gib = double(prop.totalGlobalMem) / double(1ull << 30);
  } else {
    (void)cudaGetLastError();
  }
  int drv = 0, rt = 0;
  (void)cudaDriverGetVersion(&drv);
  (void)cudaRuntimeGetVersion(&rt);
  const std::string drv_str = driver_string();
  return fmt::format(
      fmt::runtime("{} ({} SMs, {:.1f} GiB), driver {}(API {}.{}), CUDA runtime {}.{}"), name, sms,
      mem_gib, drv_str.empty() ? "" : drv_str + " ", drv / 1000, (drv % 1000) / 10, rt / 1000,
      (rt % 1000) / 10);
}

}  // namespace v4::cuda
