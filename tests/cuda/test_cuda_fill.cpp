// Ops::fill_random / memory_info / device_info / copy on the CUDA backend. fill_random must write
// exactly the bytes the CPU backend writes for the same (kind, scale, seed) (the counter-based
// generator of src/ops/fill_random.h), for every kind, odd sizes and sizes beyond one grid pass;
// the first differing unit is printed.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "cuda_test_util.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/ops.h"

namespace v4::ops {
namespace {

Ops* cpu() {
  static auto o = make_cpu_ops();
  return o.get();
}
Ops* gpu() {
  static std::unique_ptr<Ops> o = [] {
    auto r = make_cuda_ops();
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? std::move(r).value() : nullptr;
  }();
  return o.get();
}

int unit_bytes(RandomFill k) {
  switch (k) {
    case RandomFill::kF32Normal:
    case RandomFill::kF32Constant:
    case RandomFill::kI32Uniform:
      return 4;
    case RandomFill::kBF16Normal:
      return 2;
    default:
      return 1;
  }
}

std::vector<uint8_t> fill_bytes(Ops* o, int64_t n, RandomFill k, float scale, uint64_t seed) {
  const size_t bytes = size_t(n) * unit_bytes(k);
  void* d = o->alloc(bytes);
  std::vector<uint8_t> poison(bytes, 0xa5);
  o->upload(d, poison.data(), bytes);
  o->fill_random(d, n, k, scale, seed);
  std::vector<uint8_t> out(bytes);
  o->download(out.data(), d, bytes);
  o->free(d);
  return out;
}

TEST(CudaFill, SameBytesAsTheCpuBackend) {
  V4_REQUIRE_GPU();
  ASSERT_NE(gpu(), nullptr);
  const uint64_t seed = cuda::testing::test_seed();
  for (RandomFill k : {RandomFill::kF32Normal, RandomFill::kF32Constant, RandomFill::kBF16Normal,
                       RandomFill::kE4M3Normal, RandomFill::kE2M1Packed, RandomFill::kUe8m0,
                       RandomFill::kI32Uniform}) {
    for (int64_t n : {int64_t(1), int64_t(1000003), int64_t(37) << 20}) {
      for (float scale : {1.f, 0.0123f, 300.f}) {
        const float s = k == RandomFill::kI32Uniform ? 256.f : scale;
        auto c = fill_bytes(cpu(), n, k, s, seed + n);
        auto g = fill_bytes(gpu(), n, k, s, seed + n);
        ASSERT_EQ(c.size(), g.size());
        size_t diff = 0;
        while (diff < c.size() && c[diff] == g[diff]) ++diff;
        EXPECT_EQ(diff, c.size()) << "kind " << int(k) << " n " << n << " scale " << s
                                  << ": first differing byte " << diff << " (unit "
                                  << diff / unit_bytes(k) << "): cpu " << int(c[diff]) << " gpu "
                                  << int(g[diff]);
      }
    }
  }
}

TEST(CudaFill, MemoryInfoDeviceInfoAndCopy) {
  V4_REQUIRE_GPU();
  ASSERT_NE(gpu(), nullptr);
  const MemoryInfo m = gpu()->memory_info();
  EXPECT_GT(m.total_bytes, int64_t(1) << 30);
  EXPECT_GT(m.free_bytes, 0);
  EXPECT_LE(m.free_bytes, m.total_bytes);
  const std::string info = gpu()->device_info();
  std::printf("device_info: %s\n", info.c_str());
  EXPECT_NE(info.find("CUDA runtime"), std::string::npos) << info;
  const size_t bytes = (size_t(64) << 20) + 3;
  auto src = fill_bytes(gpu(), int64_t(bytes), RandomFill::kE2M1Packed, 1.f, 5);
  void* a = gpu()->alloc(bytes);
  void* b = gpu()->alloc(bytes);
  gpu()->upload(a, src.data(), bytes);
  gpu()->copy(b, a, bytes);
  gpu()->synchronize();
  std::vector<uint8_t> back(bytes);
  gpu()->download(back.data(), b, bytes);
  EXPECT_EQ(std::memcmp(back.data(), src.data(), bytes), 0);
  gpu()->free(a);
  gpu()->free(b);
}

}  // namespace
}  // namespace v4::ops
