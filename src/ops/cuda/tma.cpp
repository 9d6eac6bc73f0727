#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
#include "ops/cuda/tma.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <mutex>

namespace v4::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    // Asked once per process; a missing entry point stays missing (a driver older than CUDA 12).
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    else
      (void)cudaGetLastError();  // clear only this query's error, not a caller's pending one
  });
  return fn;
}

CUtensorMapL2promotion promotion(int bytes) {
  switch (bytes) {
    case 64: return CU_TENSOR_MAP_L2_PROMOTION_L2_64B;
    case 128: return CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
    case 256: return CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
    default: return CU_TENSOR_MAP_L2_PROMOTION_NONE;
  }
}

Status encode(CUtensorMap* map, const void* pool, cuuint32_t rank, const cuuint64_t* dims,
              const cuuint64_t* strides, const cuuint32_t* box, const PoolMapOptions& o,
              const char* what) {
  if (!map || (reinterpret_cast<uintptr_t>(map) & 63u) != 0)
    return errorf(ErrorCode::kInvalidArgument, "{}: the tensor map must be 64-byte aligned", what);
  if (!pool || (reinterpret_cast<uintptr_t>(pool) & 15u) != 0)
    return errorf(ErrorCode::kInvalidArgument, "{}: pool must be a 16-byte aligned pointer", what);
  if (o.l2_promotion != 0 && o.l2_promotion != 64 && o.l2_promotion != 128 &&
      o.l2_promotion != 256)
    return errorf(ErrorCode::kInvalidArgument, "{}: L2 promotion {} bytes (0, 64, 128, 256)", what,
                  o.l2_promotion);
  const auto fn = encode_fn();
  if (!fn)
    return errorf(ErrorCode::kInternal, "{}: the driver has no cuTensorMapEncodeTiled", what);
  const cuuint32_t estr[3] = {1, 1, 1};
  const CUresult r = fn(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, const_cast<void*>(pool), dims,
                        strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        o.swizzle128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                        promotion(o.l2_promotion), CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return errorf(ErrorCode::kInternal, "{}: cuTensorMapEncodeTiled failed (CUresult {})", what,
                  int(r));
  return Status::Ok();
}

}  // namespace

Status encode_pool_map_2d(CUtensorMap* map, const void* pool, int64_t rows, int row_elems,
                          int box_elems, const PoolMapOptions& o) {
  if (rows < 1 || rows > (int64_t(1) << 32) || row_elems < 8 || row_elems % 8 != 0 ||
      box_elems < 8 || box_elems % 8 != 0 || box_elems > 256 || box_elems > row_elems ||
      (o.swizzle128 && box_elems * 2 > 128))
    return errorf(ErrorCode::kInvalidArgument,
                  "encode_pool_map_2d: rows {} × {} elements, box {} (swizzle {})", rows,
                  row_elems, box_elems, o.swizzle128 ? "128B" : "none");
  const cuuint64_t dims[2] = {cuuint64_t(row_elems), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(row_elems) * 2};
  const cuuint32_t box[2] = {cuuint32_t(box_elems), 1};
  return encode(map, pool, 2, dims, strides, box, o, "encode_pool_map_2d");
}

Status encode_pool_map_rows(CUtensorMap* map, const void* pool, int64_t rows, int row_elems,
                            const PoolMapOptions& o) {
  if (rows < 1 || rows > (int64_t(1) << 32) || row_elems < 64 || row_elems % 64 != 0 ||
      row_elems / 64 > 256)
    return errorf(ErrorCode::kInvalidArgument, "encode_pool_map_rows: rows {} × {} elements",
                  rows, row_elems);
  const cuuint64_t dims[3] = {64, cuuint64_t(row_elems / 64), cuuint64_t(rows)};
  const cuuint64_t strides[2] = {128, cuuint64_t(row_elems) * 2};
  const cuuint32_t box[3] = {64, cuuint32_t(row_elems / 64), 1};
  return encode(map, pool, 3, dims, strides, box, o, "encode_pool_map_rows");
}

}  // namespace v4::cuda
