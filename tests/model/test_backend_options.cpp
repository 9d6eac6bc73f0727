// model::make_backend: device and precision names (BackendOptions), on any build.
#include <gtest/gtest.h>

#include "model/backend.h"

namespace v4::model {
namespace {

TEST(Backend, CpuPrecisionOptions) {
  for (const char* p : {"fp32", "auto"}) {
    auto b = make_backend("cpu", nullptr, BackendOptions{p});
    ASSERT_TRUE(b.ok()) << p << ": " << b.status().to_string();
    EXPECT_EQ((*b)->name(), "cpu");
  }
  auto bf = make_backend("cpu", nullptr, BackendOptions{"bf16"});
  ASSERT_FALSE(bf.ok());
  EXPECT_EQ(bf.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bf.status().message().find("bf16"), std::string::npos);
  EXPECT_EQ(bf.status().message().find('\n'), std::string::npos) << "one-line message";
  auto bad = make_backend("cpu", nullptr, BackendOptions{"fp16"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("fp16"), std::string::npos);
  auto dev = make_backend("tpu");
  ASSERT_FALSE(dev.ok());
  EXPECT_EQ(dev.status().code(), ErrorCode::kInvalidArgument);
  // Default options keep the previous behaviour on cpu.
  auto def = make_backend("cpu");
  ASSERT_TRUE(def.ok());
}

TEST(Backend, CudaPrecisionNamesChecked) {
  // Without CUDA support or without a GPU "cuda" is kUnsupported; a bad precision name is
  // rejected before the device is touched.
  auto bad = make_backend("cuda", nullptr, BackendOptions{"int8"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace v4::model
