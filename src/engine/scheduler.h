// The scheduler: all request state, one step at a time. Not thread-safe; `Engine` runs it on its
// own thread and feeds it submissions and cancellations between steps. Tests drive it directly.
//
// Policy (docs/engine.md):
// - Token budget: one step carries at most `chunked_prefill_size` tokens in total.
// - Running requests first, in admission order: every decode row (1 token) first, then each
//   prefill (or recompute after preemption) takes min(remaining, budget left) tokens — a chunk.
// - Then waiting requests in FCFS order (strictly: the head blocks the rest) while budget,
//   `max_running_requests` and every pool's free pages allow; the watermark keeps a little room
//   for running requests to grow. No admission in a step that preempted.
// - Memory: a sequence of n tokens reserves `Executor::pages_for(n)` pages per pool. When a
//   running request cannot grow, the most recently admitted running request is preempted: its
//   pages are freed and it goes back to the front of the queue; later it recomputes its prompt
//   and the tokens generated so far (recompute preemption) and continues.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"

namespace v4::engine {

/// Shape of one executed step (for tests and debugging).
struct StepRecord {
  int64_t n_tokens = 0;          // tokens in the batch
  int32_t n_slices = 0;          // sequences in the batch
  int32_t n_decode_rows = 0;     // slices that were one-token decode rows
  int32_t n_sampled = 0;         // slices that produced a token
  int32_t n_preempted = 0;       // requests preempted while planning this step
  int32_t n_decode_skipped = 0;  // decoding requests left out (budget < running decodes)
};

class Scheduler {
 public:
  /// `exec` must outlive the scheduler.
  Scheduler(Executor& exec, EngineConfig config);
  /// Frees every sequence still held (no callbacks).
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  /// Static admission check of a request: could it ever run? Uses only the executor's pure
  /// functions (vocab_size, max_context, pools, pages_for), so it is safe from any thread.
  /// Errors: kInvalidArgument with a message naming the limit.
  static Status check_request(const Executor& exec, const Request& req);

  /// Queues an accepted request at the back of the waiting queue. `seed` is the resolved seed.
  void add(RequestId id, Request req, OutputCallback cb, Clock::time_point arrival, uint64_t seed);
  /// Cancels: frees pages at once and emits a final output with `reason` (kAbort: counted as
  /// aborted; kStop, the caller's stop string: as finished). Unknown ids are ignored.
  void cancel(RequestId id, FinishReason reason = FinishReason::kAbort);
  /// Aborts everything (shutdown): final outputs with `reason` / `error`.
  void abort_all(FinishReason reason, const Status& error);

  /// Plans and runs one step, samples, and emits outputs (callbacks run after all state is
  /// updated, so a callback may call cancel()). Returns the executor's error if the step failed;
  /// the requests in that batch are then finished with kError.
  Status step();

  bool idle() const { return running_.empty() && waiting_.empty(); }
  int64_t n_running() const { return int64_t(running_.size()); }
  int64_t n_waiting() const { return int64_t(waiting_.size()); }
  /// Pages reserved by the scheduler per pool (same order as Executor::pools()).
  const std::vector<int64_t>& reserved_pages() const { return reserved_total_; }
  const StepRecord& last_step() const { return last_step_; }
  /// Cumulative counters (running/waiting/pools/rates are filled by Engine).
  const EngineStats& counters() const { return counters_; }
  /// Called (on the scheduler's thread) after the state update and before the callbacks of
  /// outputs that finish a request run: the finished requests are out of running/waiting, their
  /// pages freed and counted. Engine publishes its stats here, so a client that reads /metrics
  /// right after its response sees them (they were published after the callbacks).
  void set_before_final_outputs(std::function<void()> f) { before_final_ = std::move(f); }

 private:
  struct Seq {
    RequestId id = 0;
    Request req;
    std::shared_ptr<const OutputCallback> cb;
    std::vector<int32_t> tokens;  // prompt + generated
    int64_t n_prompt = 0;
    int64_t n_generated = 0;
    int64_t n_computed = 0;  // tokens in the executor's cache
    int32_t exec_seq = -1;
    std::vector<int64_t> reserved;  // pages per pool
    uint64_t seed = 0;
    PenaltyState penalties;
    Clock::time_point arrival, first_token;
    int64_t cached_tokens = 0;
    int32_t n_preemptions = 0;
    bool logged_wait = false;
    bool in_plan = false;                  // scheduled in the step being planned
    bool cached_reported = false;          // usage.cached_tokens fixed at first admission
    std::vector<int64_t> snapshot_points;  // from Executor::start_sequence, ascending
    // SamplingParams::prompt_logprobs: the next prompt token whose logprob is owed (from 1) and
    // those computed so far (delivered with the first generated token).
    int64_t prompt_lp_next = 1;
    std::vector<TokenLogprobs> prompt_lps;
  };
  struct Pending {  // an output to deliver after the step's state update
    std::shared_ptr<const OutputCallback> cb;
    StepOutput out;
  };

  bool fits(const std::vector<int64_t>& delta, double watermark) const;
  std::vector<int64_t> delta_for(const Seq& s, int64_t n_tokens) const;
  void reserve(Seq& s, const std::vector<int64_t>& delta);
  void release(Seq& s, SequenceEnd how);
  void preempt(Seq* s);
  /// `cancelled`: ended by cancel() (the executor is told kCancelled whatever `reason` says).
  void finish(Seq* s, FinishReason reason, const Status& error, std::vector<Pending>* out,
              bool cancelled = false);
  int64_t chunk_for(const Seq& s, int64_t budget) const;
  /// Whether `s` still owes prompt logprobs (SamplingParams::prompt_logprobs).
  static bool owes_prompt_lps(const Seq& s) {
    return s.req.sampling.prompt_logprobs >= 0 && s.prompt_lp_next < s.n_prompt;
  }
  StepOutput make_output(const Seq& s) const;
  void remove_running(Seq* s);
  void deliver(std::vector<Pending>& pending);

  Executor& exec_;
  EngineConfig config_;
  std::function<void()> before_final_;  // set_before_final_outputs
  // The running step's phase clock (EngineStats::step_*_s), flushed before its outputs are
  // delivered so that the stats published for a final output already hold the step's times.
  struct PhaseClock;
  PhaseClock* phase_clock_ = nullptr;
  std::vector<PoolSpec> pools_;
  int64_t vocab_ = 0;
  std::unordered_map<RequestId, std::unique_ptr<Seq>> seqs_;
  std::vector<Seq*> running_;  // admission order
  std::deque<Seq*> waiting_;   // FCFS; preempted requests go to the front
  std::vector<int64_t> reserved_total_;
  // The queue head that could not be admitted for memory in the last step with a reserve
  // (EngineConfig::reserve_for_waiting): no budget is reserved for it again until a running
  // request ends. 0 = none.
  RequestId blocked_head_ = 0;
  StepRecord last_step_;
  EngineStats counters_;
};

}  // namespace v4::engine
