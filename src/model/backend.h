// Backend selection: the op backend a model runs on, by name ("cpu" or "cuda"), and its precision.
#pragma once
#include <memory>
#include <string>

#include "base/status.h"
#include "ops/ops.h"

namespace v4::model {

/// Options of `make_backend`.
struct BackendOptions {
  /// Arithmetic of the weight GEMMs and MoE experts: "fp32" (reference: fp32 FMA chains over
  /// dequantized weights; the CPU backend's only mode), "bf16" (CUDA only: native-byte GEMV for
  /// decode-sized calls, bf16 tensor cores for prefill-sized ones; docs/cuda.md) or "auto"
  /// (fp32 on cpu, bf16 on cuda).
  std::string precision = "auto";
};

/// Creates the op backend named `device`: "cpu" (threads from `pool`, nullptr = global pool) or
/// "cuda" (current CUDA device; only in binaries built with -DV4_CUDA=ON).
/// Errors: kInvalidArgument for another device or precision name, or precision "bf16" on cpu;
/// kUnsupported for "cuda" without CUDA support or without a GPU.
Result<std::unique_ptr<ops::Ops>> make_backend(const std::string& device,
                                               ThreadPool* pool = nullptr,
                                               const BackendOptions& options = {});

}  // namespace v4::model
