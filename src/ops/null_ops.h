// NullOps: an ops::Ops whose every op does nothing (alloc returns nullptr, downloads leave the
// destination untouched). A base for backends that only need part of the interface: the
// shape-only backend of `v4serve info` (model/weights.cpp) and test doubles that report memory
// or claim formats. Override what you need; nothing here computes.
#pragma once
#include <string>

#include "ops/ops.h"

namespace v4::ops {

class NullOps : public Ops {
 public:
  std::string name() const override { return "null"; }
  void* alloc(size_t) override { return nullptr; }
  void free(void*) override {}
  void upload(void*, const void*, size_t) override {}
  void download(void*, const void*, size_t) override {}
  void synchronize() override {}
  void linear(const float*, int64_t, const float*, int64_t, int64_t, int64_t, float*,
              int64_t) override {}
  void add(float*, const float*, int64_t) override {}
  void gather_rows(const float*, const int32_t*, int64_t, int64_t, float*) override {}
  void store_rows(float*, const int32_t*, int64_t, int64_t, const float*) override {}
  void store_rows_kv(void*, KvDtype, const int32_t*, int64_t, int64_t, const float*,
                     int) override {}
  void embed(const float*, const int32_t*, int64_t, int, int, float*) override {}
  void rms_norm(const float*, const float*, int64_t, int, float, float*) override {}
  void rope(float*, int64_t, int, int, int, const int64_t*, const float*, float, bool) override {}
  void hc_pre(const HcArgs&) override {}
  void hc_post(float*, const float*, const float*, const float*, int64_t, int, int) override {}
  void hc_head(const float*, const float*, const float*, const float*, int64_t, int, int, float,
               float, float*) override {}
  void compress_pool(const CompressArgs&) override {}
  void indexer_topk(const IndexerArgs&) override {}
  void sparse_attention(const AttentionArgs&) override {}
  void route(const RouteArgs&) override {}
  void moe_experts(const MoeArgs&) override {}
  void build_decode_plan(const DecodePlanArgs&) override {}
};

}  // namespace v4::ops
