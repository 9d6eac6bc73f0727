// The Executor: what the scheduler needs from a model + KV cache, and nothing more.
// One step is a ragged `model::ForwardBatch` (prefill chunks and decode rows of many sequences)
// in, logits out. Sequences are created and freed through the executor; the memory they hold is
// described as a set of pools (pages of fixed capacity) so the scheduler can admit, grow and
// preempt without knowing how the model lays out its state.
//
// Implementations: `ModelExecutor` (model_executor.h, the real DeepseekV4 + KV cache) and a
// deterministic fake that lives only under tests/engine/ (never linked into the CLI).
// All methods are called from the scheduler thread only, except vocab_size, max_context, pools and
// pages_for, which Engine::submit also calls from request threads: keep those pure (const, no
// mutable state). Pool budgets cover running sequences only; a prefix cache whose tree shares
// the pools must make room itself (evict) inside start_sequence / forward.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/forward_batch.h"

namespace v4::engine {

/// One memory pool as the scheduler budgets it. `capacity_pages` is the total number of pages;
/// the scheduler's reservation for a sequence of n tokens is `Executor::pages_for(n)[pool]`.
struct PoolSpec {
  std::string name;            // "kv", "swa", "c4", "c128", "state", ... (for /metrics)
  int64_t capacity_pages = 0;  // total pages in the pool
  int64_t page_tokens = 0;     // tokens one page covers (informational; 0 if not per-token)
};

/// Current use of one pool, in pages, as the executor itself counts it (for /metrics and tests).
struct PoolUsage {
  std::string name;
  int64_t used_pages = 0;
  int64_t capacity_pages = 0;
  int64_t bytes_per_page = 0;  // backend memory of one page / slot (0 = not known)
};

/// What a sequence starts with (see Executor::start_sequence).
struct SequenceStart {
  int32_t seq = -1;           // handle for SeqSlice::seq
  int64_t cached_tokens = 0;  // leading tokens already in the cache (prefix hit), < n tokens
  /// Ascending sequence lengths at which a step must end (e.g. prefix-cache snapshot
  /// boundaries); the scheduler never plans a chunk across one.
  std::vector<int64_t> snapshot_points;
};

/// Device time around model steps (from ops::Ops::step_timing; zero on the CPU backend):
/// busy = device time inside steps, idle = device time between a step's end and the next
/// step's start (what host scheduling costs the GPU); decode_* = between consecutive decode-only
/// steps. Seconds.
struct DeviceTiming {
  int64_t steps = 0;
  double busy_s = 0, idle_s = 0;
  int64_t decode_steps = 0;
  double decode_busy_s = 0, decode_idle_s = 0;
  double decode_host_prep_s = 0;  // of decode_idle_s: the model's host time before those steps
  double decode_host_gap_s = 0;   // host wall time from the previous step's end to their begin
};

/// Why a sequence ends (see Executor::end_sequence).
enum class SequenceEnd { kFinished, kCancelled, kPreempted, kError };

/// Model + cache as seen by the scheduler. Not thread-safe: the scheduler thread owns it.
class Executor {
 public:
  virtual ~Executor() = default;

  /// Vocabulary size (number of logits per row).
  virtual int64_t vocab_size() const = 0;
  /// Longest sequence (prompt + generated tokens) the model supports, in tokens.
  virtual int64_t max_context() const = 0;

  /// Pools the scheduler must budget; order is fixed for the executor's lifetime.
  virtual std::vector<PoolSpec> pools() const = 0;
  /// Pages that one sequence of `n_tokens` tokens holds in each pool (same order as `pools()`).
  /// Must be non-decreasing in n_tokens and an upper bound of what `forward` really allocates,
  /// so that a step the scheduler admitted never runs out of memory.
  virtual std::vector<int64_t> pages_for(int64_t n_tokens) const = 0;
  /// Device timing totals (thread-safe; default: none).
  virtual DeviceTiming device_timing() const { return {}; }
  /// Pages in use right now, per pool (what the cache really holds).
  virtual std::vector<PoolUsage> pool_usage() const = 0;

  /// Creates an empty sequence (0 tokens cached) and returns its handle (`SeqSlice::seq`).
  /// Errors: kResourceExhausted when no sequence slot is left.
  virtual Result<int32_t> create_sequence() = 0;
  /// Frees a sequence and all pages it holds, at once. Unknown handles are ignored.
  virtual void free_sequence(int32_t seq) = 0;

  /// Starts a sequence for a request whose tokens (prompt, plus generated tokens when it is
  /// recomputed after preemption) are `tokens`. A prefix cache returns the sequence already
  /// holding the longest usable cached prefix (`cached_tokens` < tokens.size()). The scheduler
  /// then computes tokens[cached_tokens..]; `max_cached` caps cached_tokens (0: compute every
  /// token, e.g. for prompt logprobs). Default: create_sequence(), nothing cached.
  /// Errors: kResourceExhausted (no slot or pages now; the scheduler retries later).
  virtual Result<SequenceStart> start_sequence(std::span<const int32_t> tokens,
                                               int64_t max_cached) {
    (void)max_cached;
    auto s = create_sequence();
    if (!s.ok()) return s.status();
    SequenceStart st;
    st.seq = *s;
    return st;
  }
  /// Ends a sequence: `computed` are the tokens its cache holds (a prefix cache may keep them
  /// for later requests, e.g. on kFinished or kPreempted). Its pages leave the scheduler's
  /// budget at once. Default: free_sequence(seq).
  virtual void end_sequence(int32_t seq, SequenceEnd how, std::span<const int32_t> computed) {
    free_sequence(seq);
  }

  /// Runs one step. Every slice's `start_pos` equals the tokens already cached for its sequence;
  /// the executor appends the slice's tokens to the cache. Returns f32 logits, one row per slice
  /// (the last new position) unless `logits_all`. Errors: kInvalidArgument on a malformed batch,
  /// kResourceExhausted if a pool overflows (a scheduler accounting bug), kInternal otherwise.
  virtual Result<model::ForwardOutput> forward(const model::ForwardBatch& batch) = 0;
};

}  // namespace v4::engine
