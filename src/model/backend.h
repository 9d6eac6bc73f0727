// Backend selection: the op backend a model runs on, by name ("cpu" or "cuda").
#pragma once
#include <memory>
#include <string>

#include "base/status.h"
#include "ops/ops.h"

namespace v4::model {

/// Creates the op backend named `device`: "cpu" (threads from `pool`, nullptr = global pool) or
/// "cuda" (current CUDA device; only in binaries built with -DV4_CUDA=ON).
/// Errors: kInvalidArgument for another name, kUnsupported for "cuda" without CUDA support or
/// without a GPU.
Result<std::unique_ptr<ops::Ops>> make_backend(const std::string& device, ThreadPool* pool = nullptr);

}  // namespace v4::model
