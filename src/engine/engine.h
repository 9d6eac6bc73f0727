// The engine API the server (and the `generate` CLI) code against.
//
// Contract (details in docs/engine.md):
// - `Engine::submit` is thread-safe and returns at once: either an error (the request can never
//   run: empty prompt, prompt + max_tokens longer than the context or than any pool's total
//   capacity, bad sampling values) or the request's id. Accepted requests are queued FCFS.
// - Outputs stream through the request's callback, called on the engine's output thread
//   (EngineConfig::output_thread, the default; else on the scheduler thread), one call per step
//   in which the request produced tokens, in order, never two at once. Exactly one call has
//   `finished == true` and it is the last call for that id (also after `cancel`, with
//   FinishReason::kAbort). The callback must not block and must not call back into the engine
//   synchronously with a lock the engine could wait on; post the output to your own I/O loop.
//   `cancel` from inside a callback is allowed. A callback that throws loses only its request:
//   the engine logs the exception, cancels the request (kAbort) and calls that callback no more
//   (EngineStats::callback_errors_total counts them).
// - Stop *strings* are text-level and belong to the server (which owns the detokenizer): when it
//   sees one it calls `cancel(id, FinishReason::kStop)` and reports finish_reason "stop" to its
//   client itself. The
//   engine handles stop *token ids* (and EOS unless `ignore_eos`).
// - `n > 1` is the server's job: it submits n requests with the same prompt (seed + i when a
//   seed is given). With prefix caching they share the prompt's pages.
// - `cancel(id)` frees the request's pages before the next step runs; unknown or finished ids
//   are ignored.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/executor.h"

namespace v4::engine {

using RequestId = uint64_t;
using Clock = std::chrono::steady_clock;

/// Per-request sampling and stopping. Defaults are greedy-equivalent only when temperature == 0;
/// the server maps OpenAI defaults (temperature 1, top_p 1) explicitly.
struct SamplingParams {
  int64_t max_tokens = 16;              // generated tokens at most (>= 1)
  float temperature = 1.0f;             // 0 = greedy (argmax); > 0 scales logits by 1/temperature
  float top_p = 1.0f;                   // nucleus mass in (0, 1]; 1 = off
  int32_t top_k = 0;                    // keep the k most likely tokens; 0 or < 0 = off
  float min_p = 0.0f;                   // drop tokens with p < min_p * p_max; 0 = off, in [0, 1]
  std::optional<uint64_t> seed;         // unset = a random seed chosen at submit
  std::vector<int32_t> stop_token_ids;  // finishing token ids (besides EOS); the token is output
  bool ignore_eos = false;              // true: EOS ids do not finish the request
  float presence_penalty = 0.0f;        // OpenAI semantics, in [-2, 2], over generated tokens
  float frequency_penalty = 0.0f;       // OpenAI semantics, in [-2, 2], over generated tokens
  float repetition_penalty = 1.0f;      // vLLM/HF semantics (> 0; 1 = off), over prompt + generated
  /// OpenAI logit_bias: (token id, bias in [-100, 100]) added to that token's raw logit before the
  /// penalties, temperature and truncation (vLLM's order); ids unique. Sampled on the host.
  std::vector<std::pair<int32_t, float>> logit_bias;
  bool logprobs = false;                // return the sampled token's logprob
  int32_t top_logprobs = 0;             // also the n most likely tokens (0..20), needs logprobs
  /// -1 = off; 0..20: also the logprob of every prompt token after the first under the model
  /// (with that many most likely alternatives), as StepOutput::prompt_logprobs. The prompt is
  /// then computed in full (no prefix-cache hit) with logits at every position.
  int32_t prompt_logprobs = -1;
};

/// One request as submitted: prompt token ids and sampling. `tag` is free text for logs.
struct Request {
  std::vector<int32_t> prompt_tokens;
  SamplingParams sampling;
  std::string tag;  // e.g. the server's "chatcmpl-..." id, printed in engine logs
};

/// Why a request finished. kStop: EOS or a stop token id; kLength: max_tokens or context end;
/// kAbort: cancelled; kError: the engine failed (see `StepOutput::error`).
enum class FinishReason { kNone = 0, kStop, kLength, kAbort, kError };

/// "stop", "length", "abort", "error", or "" for kNone (OpenAI finish_reason strings).
const char* finish_reason_name(FinishReason r);

/// One candidate in a logprobs list: token id and natural-log probability.
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

/// Logprob information for one generated token. Values are log-softmax of the RAW model logits
/// (before temperature, penalties and top-k/p/min-p), like OpenAI and vLLM's default.
struct TokenLogprobs {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;  // `top_logprobs` most likely, descending
};

/// Token counts for `usage`. cached_tokens = prompt tokens served from the prefix cache.
struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
};

/// What one callback carries: the tokens a request produced in one step (usually one), plus
/// state. `usage` and times are always filled; times are steady_clock points for TTFT/ITL/E2E.
struct StepOutput {
  RequestId id = 0;
  std::vector<int32_t> new_tokens;
  std::vector<TokenLogprobs> logprobs;  // one per new token when SamplingParams::logprobs
  /// SamplingParams::prompt_logprobs >= 0: in the output carrying the first generated token,
  /// prompt tokens 1 .. n-1 in order (token i scored by the logits at position i - 1).
  std::vector<TokenLogprobs> prompt_logprobs;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  Status error;                        // set when finish_reason == kError
  Usage usage;                         // cumulative so far
  Clock::time_point arrival_time;      // when submit() accepted the request
  Clock::time_point first_token_time;  // when the first token was produced (epoch if none yet)
  Clock::time_point now;               // when this output was produced
  int32_t n_preemptions = 0;           // times this request was preempted so far
};

/// Called on the engine's output thread (or its scheduler thread with
/// EngineConfig::output_thread off); see the contract at the top of this file.
using OutputCallback = std::function<void(const StepOutput&)>;

/// Scheduler knobs. Token budget counts every token in a step's batch (prefill + decode).
struct EngineConfig {
  int64_t chunked_prefill_size = 2048;     // max tokens per step (and per prefill chunk); >= 1
  int32_t max_running_requests = 256;      // max sequences in a batch
  std::vector<int32_t> eos_token_ids;      // finish unless ignore_eos
  int64_t max_waiting_requests = 1 << 20;  // submit fails with kResourceExhausted beyond this
  double stats_interval_s = 5.0;           // status-line period in the log; 0 = no status line
  /// Free pages kept in reserve when admitting a new request (fraction of each pool), so running
  /// requests can keep decoding before preemption kicks in. In [0, 1).
  double admission_watermark = 0.01;
  /// While requests wait (and one more may run), running prefill chunks take at most half of a
  /// step's budget, leaving min(the queue head's prompt, half) for its admission: a short request
  /// is not stuck behind a long prompt's whole prefill (vLLM's long-prefill threshold, applied
  /// only while someone waits). Not reserved for a head that could not be admitted (memory or a
  /// sequence slot) until a running request ends. Outputs do not depend on it (chunking is
  /// batch-invariant).
  bool reserve_for_waiting = true;
  /// Deliver outputs on the engine's output thread (in order, one request's outputs never
  /// concurrently), so the scheduler plans and runs the next step while the callbacks of the
  /// last one run (the server's detokenizer, output parser and SSE chunks: ~1 ms a step at 256
  /// streams, time the GPU sat idle). Off: callbacks run on the scheduler thread between steps.
  /// Callbacks' effects (cancel) then reach the scheduler a step or two later; outputs do not
  /// change. At most `max_pending_outputs` outputs wait for delivery: past that the scheduler
  /// waits for the output thread before the next step.
  bool output_thread = true;
  int64_t max_pending_outputs = 1 << 16;
};

/// Usage of one pool for /metrics and the status line.
struct PoolStats {
  std::string name;
  int64_t used_pages = 0;
  int64_t capacity_pages = 0;
  int64_t bytes_per_page = 0;  // backend memory of one page / slot (0 = not known)
};

/// Snapshot of engine counters; totals are since start, rates over the last stats interval.
struct EngineStats {
  int64_t running = 0;                  // requests in the batch (prefilling or decoding)
  int64_t waiting = 0;                  // queued (including preempted ones)
  int64_t prompt_tokens_total = 0;      // prompt tokens computed (recomputes included)
  int64_t generation_tokens_total = 0;  // tokens sampled
  int64_t requests_finished_total = 0;
  int64_t requests_aborted_total = 0;
  int64_t requests_rejected_total = 0;  // refused by submit
  int64_t callback_errors_total = 0;    // output callbacks that threw (their requests aborted)
  int64_t preemptions_total = 0;
  int64_t steps_total = 0;
  int64_t prefix_query_tokens_total = 0;  // prompt tokens looked up in the prefix cache
  int64_t prefix_hit_tokens_total = 0;    // of which served from the cache
  // The scheduler thread's wall time per phase of the steps that ran a batch (seconds, summed):
  // schedule = admission / preemption planning, batch = building the ForwardBatch, forward =
  // Executor::forward (the model's host work, the device step and the readback), post = host
  // sampling, stop checks and queueing the outputs; between = the engine loop from one step's
  // end to the next step's start (incoming requests, cancels, stats, output back-pressure).
  // With the device's idle time (DeviceTiming) they say where a decode step's gap goes.
  double step_schedule_s = 0, step_batch_s = 0, step_forward_s = 0, step_post_s = 0;
  double step_between_s = 0;
  double prompt_tokens_per_s = 0;         // input throughput, last interval
  double generation_tokens_per_s = 0;     // output throughput, last interval
  std::vector<PoolStats> pools;
  DeviceTiming device;  // GPU busy/idle around steps (Executor::device_timing)
};

/// The engine: one scheduler thread owning the executor and all request state, and (by
/// default) one output thread calling the requests' callbacks.
class Engine {
 public:
  /// Starts the threads. Errors: kInvalidArgument on a bad config.
  static Result<std::unique_ptr<Engine>> create(std::unique_ptr<Executor> executor,
                                                EngineConfig config);
  /// Stops the threads; unfinished requests get a final kAbort output, and every output is
  /// delivered before it returns.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Queues a request (thread-safe). The callback may run before submit returns.
  /// Errors (nothing queued, no callback): kInvalidArgument for an empty prompt, a token id
  /// outside the vocabulary, bad sampling values, or prompt + max_tokens > max_context() or than
  /// some pool's whole capacity; kResourceExhausted when the waiting queue is full or the engine
  /// is stopping.
  Result<RequestId> submit(Request request, OutputCallback callback);

  /// Cancels a request (thread-safe): it gets a final kAbort output and its pages are freed
  /// before the next step. Unknown or already finished ids are ignored. `reason` kStop: the
  /// caller ends a request whose output is complete (the server's stop strings) — the final
  /// output says kStop and it counts as finished, not aborted (EngineStats).
  void cancel(RequestId id, FinishReason reason = FinishReason::kAbort);

  /// Counters snapshot (thread-safe, cheap: a copy under a mutex, refreshed every step).
  EngineStats stats() const;

  /// Convenience for tests and the CLI: submits and blocks until finished; returns all tokens.
  /// `out_logprobs` (optional) receives logprobs per token.
  Result<std::vector<int32_t>> generate(Request request, FinishReason* out_reason = nullptr,
                                        std::vector<TokenLogprobs>* out_logprobs = nullptr);

  /// The largest `max_tokens` that submit() accepts for a prompt of `n_prompt` tokens (bounded by
  /// the context and by every pool's whole capacity); 0 if the prompt alone can never fit.
  /// Thread-safe. Use it for a defaulted max_tokens instead of retrying submit.
  int64_t max_tokens_limit(int64_t n_prompt) const;

  int64_t vocab_size() const { return vocab_size_; }
  int64_t max_context() const { return max_context_; }
  const EngineConfig& config() const { return config_; }

  /// Blocks until no request is running or waiting (tests, shutdown).
  void wait_idle();

 private:
  struct Impl;
  Engine() = default;
  std::unique_ptr<Impl> impl_;
  EngineConfig config_;
  int64_t vocab_size_ = 0;
  int64_t max_context_ = 0;
};

}  // namespace v4::engine
