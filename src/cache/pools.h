// Paged physical pools for DeepSeek-V4's per-request state (cache.md), built from a declarative
// per-layer table. For now every sequence owns its pages (no prefix sharing yet: the radix tree
// in src/cache/radix* will hand out shared virtual pages later).
//
// Address spaces
// - Virtual slots: token position p of a sequence lives in virtual page `pages[p / page_size]`,
//   slot = page · page_size + p % page_size. page_size is a multiple of 128 and of every
//   compression rate, so no compression group straddles a page.
// - C4 KV and indexer keys (CSA layers) and C128 KV (HCA layers) are "shadow" pools addressed by
//   slot / ratio: compressed entry e of a sequence is row `pages[e·m / page_size]·(page_size/m)
//   + (e·m % page_size)/m`. They are allocated and freed with the virtual page.
// - SWA KV (every layer) lives in its own paged pool; each sequence maps its virtual pages to SWA
//   pages. SWA pages whose tokens can no longer be read (all < length − (W − 1)) are freed at once.
// - Compressor-state rings: per sequence and compressor, c·m rows of raw projected kv and gate
//   (fp32, width c·d); token p sits in ring row p % (c·m). One ring slot per sequence.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/copy_segment.h"
#include "base/dtype.h"
#include "base/status.h"

namespace v4::cache {

/// Attention kind of a layer, as far as the cache is concerned.
enum class AttnKind { kSliding, kCsa, kHca };

/// One row of the declarative layer table (derived from config.json by the model).
struct LayerCacheSpec {
  AttnKind kind = AttnKind::kSliding;
  int ratio = 0;      // m (0 for sliding layers)
  int kv_dim = 0;     // hd: SWA row and compressed row width
  int index_dim = 0;  // dI (CSA only)
};

struct CacheSpec {
  std::vector<LayerCacheSpec> layers;
  int sliding_window = 128;  // W (tokens incl. self)
  /// Element type of the KV pools (SWA, C4/C128, indexer keys unless index_cache_dtype says
  /// otherwise); rings stay f32. Every byte count below (page bytes, budgets, bytes_per_token)
  /// uses the row sizes below.
  KvDtype kv_dtype = KvDtype::kF32;
  /// --index-cache-dtype: kAuto = indexer keys follow kv_dtype (kv_index_dtype); kFp8 =
  /// kFp8Index indexer-key rows whatever kv_dtype is.
  IndexCacheDtype index_cache_dtype = IndexCacheDtype::kAuto;
  /// Trailing RoPE channels of an attention row (qk_rope_head_dim): kFp8 rows keep them bf16.
  int rope_dim = 0;
  /// Bytes of one SWA / compressed row of layer `l` (kv_row_bytes(kv_dtype, kv_dim, rope_dim)).
  int64_t attn_row_bytes(const LayerCacheSpec& l) const {
    return kv_row_bytes(kv_dtype, l.kv_dim, rope_dim);
  }
  /// Element type of the indexer-key pools: kv_index_dtype(kv_dtype, index_cache_dtype).
  KvDtype index_dtype() const { return kv_index_dtype(kv_dtype, index_cache_dtype); }
  /// Bytes of one indexer-key row of layer `l` in index_dtype() (kFp8Index: rows of index_dim
  /// e4m3 codes + one f32 scale, padded to 16 bytes: 144 for V4).
  int64_t index_row_bytes(const LayerCacheSpec& l) const {
    return kv_row_bytes(index_dtype(), l.index_dim, 0);
  }
};

/// Pool sizes. All counts; bytes follow CacheSpec::kv_dtype and index_dtype() (rings: f32).
struct KvCacheOptions {
  int page_size = 256;      // tokens per virtual page (multiple of 128 and of every ratio)
  int64_t n_pages = 0;      // virtual pages (C4 / indexer / C128 shadows)
  int64_t n_swa_pages = 0;  // SWA pages
  int max_seqs = 0;         // compressor-state ring slots (= live sequences)
};

/// Usage of one pool, for the engine (admission) and /metrics.
struct PoolUsage {
  std::string name;  // "virtual_pages", "swa_pages", "state_slots"
  int64_t used = 0, total = 0;
  int64_t bytes_per_unit = 0;
};

class KvCache {
 public:
  using AllocFn = std::function<void*(size_t)>;
  using FreeFn = std::function<void(void*)>;

  /// Bytes of one virtual page's shadows (all layers), one SWA page, one state slot.
  static int64_t virtual_page_bytes(const CacheSpec& spec, int page_size);
  static int64_t swa_page_bytes(const CacheSpec& spec, int page_size);
  static int64_t state_slot_bytes(const CacheSpec& spec);
  /// KV bytes per token by pool: {"c4_kv", "c4_index", "c128_kv", "swa"} (spec.kv_dtype values;
  /// c4_index: spec.index_dtype()).
  static std::vector<std::pair<std::string, double>> bytes_per_token(const CacheSpec& spec);
  /// Sizes the pools from a byte budget: `max_seqs` state slots first; then, if
  /// `max_chunk_tokens` > 0, SWA pages for what live sequences can hold at once
  /// (max_seqs · (ceil((max_chunk_tokens + W − 1) / page_size) + 1), since SWA pages leave with
  /// the window) and the rest as virtual pages; otherwise equal numbers of virtual and SWA
  /// pages. Error (kResourceExhausted) if not even one page fits.
  static Result<KvCacheOptions> options_from_budget(const CacheSpec& spec, int64_t budget_bytes,
                                                    int page_size, int max_seqs,
                                                    int64_t max_chunk_tokens = 0);

  /// Allocates every pool with `alloc` (backend memory). Errors: invalid page size.
  static Result<std::unique_ptr<KvCache>> create(const CacheSpec& spec, const KvCacheOptions& opt,
                                                 AllocFn alloc, FreeFn free);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // ---- sequences (engine API) ------------------------------------------------------------
  /// A new empty sequence. Error kResourceExhausted when all state slots are taken.
  Result<int32_t> create_sequence();
  /// Returns all pages and the state slot of `seq` at once. Unknown seq: no-op.
  void free_sequence(int32_t seq);
  bool valid(int32_t seq) const;
  /// Tokens stored for `seq`.
  int64_t length(int32_t seq) const;
  /// Makes positions [0, n_tokens) addressable (allocates virtual and SWA pages). Error
  /// kResourceExhausted (nothing allocated) if a pool is full.
  Status reserve(int32_t seq, int64_t n_tokens);
  /// Records that positions [0, new_length) are written; frees SWA pages out of the window.
  void commit(int32_t seq, int64_t new_length);
  /// Brings the empty sequence `seq` to length n_tokens without computing anything (benchmarks:
  /// `v4serve bench` decodes at 1M context without a 1M-token prefill): reserves the virtual
  /// pages of [0, n_tokens) and SWA pages only for the pages holding the last W − 1 positions
  /// (exactly what a computed sequence holds after commit), then sets the length. The rows keep
  /// whatever they hold (fill the pools first, e.g. buffers() + Ops::fill_random). Errors:
  /// kInvalidArgument (unknown or non-empty sequence, n_tokens < 0), kResourceExhausted when a
  /// pool is short (nothing allocated).
  Status fast_forward(int32_t seq, int64_t n_tokens);
  /// Virtual and SWA pages fast_forward(seq, n_tokens) takes.
  std::pair<int64_t, int64_t> fast_forward_pages(int64_t n_tokens) const;
  /// Pages still needed to grow `seq` to n_tokens (virtual, swa), for admission checks.
  std::pair<int64_t, int64_t> pages_needed(int32_t seq, int64_t n_tokens) const;
  std::vector<PoolUsage> usage() const;

  // ---- addressing (model) -----------------------------------------------------------------
  const CacheSpec& spec() const { return spec_; }
  const KvCacheOptions& options() const { return opt_; }
  /// Physical SWA row of token `pos` (reserved, inside the window).
  int32_t swa_row(int32_t seq, int64_t pos) const;
  /// Physical row of compressed entry `entry` in a pool of ratio m (C4 / indexer / C128).
  int32_t compressed_row(int32_t seq, int64_t entry, int ratio) const;
  /// Physical ring row of token `pos` for a compressor with `ring_rows` = c·m rows per sequence.
  int32_t ring_row(int32_t seq, int64_t pos, int ring_rows) const;

  /// KV pool buffers of layer `l` (nullptr where the layer has none): rows of kv_dim (SWA,
  /// compressed; attn_row_bytes(l) bytes each, kv_dtype()) or index_dim (indexer keys;
  /// index_row_bytes(l) bytes each, index_dtype()). Untyped on purpose: readers pass the dtype
  /// to the ops.
  void* swa_pool(int l) const { return layers_[l].swa; }
  void* comp_pool(int l) const { return layers_[l].comp; }
  void* index_pool(int l) const { return layers_[l].index; }
  /// Element type of the SWA / compressed pools and of the indexer-key pools.
  KvDtype kv_dtype() const { return spec_.kv_dtype; }
  KvDtype index_dtype() const { return spec_.index_dtype(); }
  /// Bytes per value of the SWA / compressed pools (kv_dtype_size; kFp8: 1, see attn_row_bytes).
  int64_t kv_value_bytes() const { return kv_dtype_size(spec_.kv_dtype); }
  /// Bytes of one SWA / compressed row, one indexer-key row of layer `l`.
  int64_t attn_row_bytes(int l) const { return spec_.attn_row_bytes(spec_.layers[size_t(l)]); }
  int64_t index_row_bytes(int l) const { return spec_.index_row_bytes(spec_.layers[size_t(l)]); }
  /// Byte address of row `row` of a KV pool buffer whose rows are `row_bytes` long.
  static char* kv_row(void* pool, int64_t row, int64_t row_bytes) {
    return static_cast<char*>(pool) + row * row_bytes;
  }
  /// Compressor-state rings: which = 0 main compressor, 1 indexer compressor.
  float* ring_kv(int l, int which) const { return layers_[l].ring_kv[which]; }
  float* ring_gate(int l, int which) const { return layers_[l].ring_gate[which]; }
  /// Ring rows per sequence of layer l's compressor `which` (c·m).
  int ring_rows(int l, int which) const;

  /// One allocated pool buffer: what it holds, where, its element type (KV pools: kv_dtype() /
  /// index_dtype(); rings: kF32) and its size in values (kFp8 pools: in bytes, one "value" per
  /// byte; fill them with e4m3 bytes, RandomFill::kE4M3Normal, which keeps scales finite).
  struct PoolBuffer {
    std::string name;  // "swa", "c4_kv", "c128_kv", "c4_index", "ring_kv", "ring_gate", ...
    int layer = 0;
    void* data = nullptr;
    int64_t values = 0;
    KvDtype dtype = KvDtype::kF32;
  };
  /// Every buffer the pools allocated (to fill them with random values for benchmarks).
  std::vector<PoolBuffer> buffers() const { return buffers_; }

  // ---- change tracking (device mirrors of the addressing, docs/model.md §Decode graphs) --------
  /// Identity of this cache instance, unique in the process (a mirror built for another cache
  /// must be rebuilt, even if this one reuses its address).
  uint64_t id() const { return id_; }
  /// A number that changes whenever `seq`'s virtual pages, SWA pages or state slot change
  /// (create_sequence, reserve adding pages, commit freeing SWA pages, free_sequence); never 0 and
  /// never repeated in the process, so "mirrored version != addressing_version" means "re-send".
  /// 0 for an unknown sequence.
  uint64_t addressing_version(int32_t seq) const;
  /// Virtual page of each logical page of `seq` (valid seq).
  const std::vector<int32_t>& pages(int32_t seq) const { return seqs_[seq].pages; }
  /// SWA page of each logical page of `seq` (−1 = freed; valid seq).
  const std::vector<int32_t>& swa_pages(int32_t seq) const { return seqs_[seq].swa_pages; }
  /// Compressor-state ring slot of `seq` (valid seq).
  int32_t state_slot(int32_t seq) const { return seqs_[seq].state_slot; }

  // ---- backend memory and copies (prefix cache store, docs/cache.md §6) -------------------
  /// Allocates / frees `bytes` of the pools' memory (the AllocFn / FreeFn given to create:
  /// backend memory, device memory on CUDA). The prefix cache keeps its store there. Callers free
  /// what they allocate before the allocator's owner (the backend) goes.
  void* alloc_bytes(size_t bytes) const { return alloc_(bytes); }
  void free_bytes(void* p) const { free_(p); }
  /// A copy of the free function (for owners that may outlive this KvCache, not the backend).
  FreeFn free_fn() const { return free_; }
  /// Executes a list of copies between pool memory and memory from alloc_bytes (both sides
  /// backend memory): see CopySegment. Segments of one call may run concurrently (no segment's
  /// destination overlaps another's source or destination); calls run in order.
  using CopyBatchFn = std::function<void(const CopySegment* segs, int64_t n)>;
  /// Installs the copy for backend memory (a device backend: ops::Ops::copy_batch, stream-ordered
  /// with the forward). Default: memcpy per segment, right for host memory only.
  void set_copy_batch(CopyBatchFn fn) { copy_ = std::move(fn); }
  bool has_copy_batch() const { return bool(copy_); }
  /// Runs `n` segments with the installed copy (n == 0: nothing).
  void copy_batch(const CopySegment* segs, int64_t n) const;

 private:
  KvCache() = default;
  struct LayerPools {
    void* swa = nullptr;
    void* comp = nullptr;
    void* index = nullptr;
    float* ring_kv[2] = {nullptr, nullptr};
    float* ring_gate[2] = {nullptr, nullptr};
  };
  struct Seq {
    bool live = false;
    int64_t length = 0;
    int32_t state_slot = -1;
    std::vector<int32_t> pages;      // virtual page per logical page
    std::vector<int32_t> swa_pages;  // SWA page per logical page (-1 = freed)
    int64_t swa_freed = 0;           // swa_pages[0, swa_freed) are all −1 (commit's watermark)
    uint64_t version = 0;            // addressing_version()
  };
  uint64_t id_ = 0;
  CacheSpec spec_;
  KvCacheOptions opt_;
  AllocFn alloc_;
  FreeFn free_;
  std::vector<LayerPools> layers_;
  std::vector<void*> allocations_;
  std::vector<PoolBuffer> buffers_;
  std::vector<int32_t> free_pages_, free_swa_pages_, free_slots_;
  std::vector<Seq> seqs_;
  CopyBatchFn copy_;
};

}  // namespace v4::cache
