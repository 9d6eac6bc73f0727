#include "engine/scheduler.h"

#include <algorithm>
#include <optional>

#include "base/log.h"
#include "base/thread_pool.h"

namespace v4::engine {

namespace {

/// What a slice asks the executor to sample on the backend (model::DeviceSampling, used when
/// the backend can): the request's own parameters when the slice ends its sequence's computed
/// tokens (a token is drawn from it) and the request has no penalties (those need the token
/// history, which stays on the host); when the slice does not end its sequence (a prefill chunk)
/// nothing of its output is used, so a greedy draw spares the download of its logits row.
std::optional<model::DeviceSampling> device_sampling(const SamplingParams& sp, uint64_t seed,
                                                     int64_t step, bool draws) {
  if (!draws) return model::DeviceSampling{};
  if (sp.repetition_penalty != 1.0f || sp.presence_penalty != 0.0f ||
      sp.frequency_penalty != 0.0f || !sp.logit_bias.empty())
    return std::nullopt;
  model::DeviceSampling d;
  d.temperature = sp.temperature;
  d.top_k = sp.top_k;
  d.top_p = sp.top_p;
  d.min_p = sp.min_p;
  d.seed = seed;
  d.step = step;
  d.top_logprobs = sp.logprobs ? sp.top_logprobs : -1;
  return d;
}

/// The device-sampled logprobs of slice i (ForwardOutput's logprob fields).
TokenLogprobs device_logprobs(const model::ForwardOutput& out, size_t i, int32_t token,
                              int32_t top_logprobs) {
  TokenLogprobs lp;
  lp.token = token;
  if (i < out.token_logprob.size()) lp.logprob = out.token_logprob[i];
  const int32_t n = std::min(top_logprobs, out.top_n);
  for (int32_t j = 0; j < n; ++j) {
    const size_t o = i * size_t(out.top_n) + size_t(j);
    if (o >= out.top_tokens.size() || out.top_tokens[o] < 0) break;
    lp.top.push_back({out.top_tokens[o], out.top_logprobs[o]});
  }
  return lp;
}

/// Every slice that draws a token must get a sampled token or at least one logits row.
Status check_output(const model::ForwardOutput& out, size_t n_slices, int64_t vocab,
                    const std::vector<bool>& draws) {
  if (out.row_begin.size() != n_slices + 1 ||
      (!out.tokens.empty() && out.tokens.size() != n_slices))
    return make_error(ErrorCode::kInternal,
                      "forward returned {} row offsets and {} tokens for {} slices",
                      out.row_begin.size(), out.tokens.size(), n_slices);
  if (out.vocab != vocab || int64_t(out.logits.size()) < out.row_begin.back() * vocab)
    return make_error(ErrorCode::kInternal,
                      "forward returned {} logits of vocab {} for {} rows (vocab {})",
                      out.logits.size(), out.vocab, out.row_begin.back(), vocab);
  for (size_t i = 0; i < n_slices; ++i) {
    const int32_t t = out.tokens.empty() ? -1 : out.tokens[i];
    if (t >= vocab)
      return make_error(ErrorCode::kInternal, "forward sampled token {} outside [0, {})", t, vocab);
    if (draws[i] && t < 0 && out.row_begin[i + 1] <= out.row_begin[i])
      return make_error(ErrorCode::kInternal,
                        "forward returned neither a token nor logits for slice {}", i);
  }
  return Status::Ok();
}

}  // namespace

Scheduler::Scheduler(Executor& exec, EngineConfig config)
    : exec_(exec), config_(std::move(config)), pools_(exec.pools()), vocab_(exec.vocab_size()) {
  reserved_total_.assign(pools_.size(), 0);
}

Scheduler::~Scheduler() {
  for (auto& [id, s] : seqs_)
    if (s->exec_seq >= 0)
      exec_.end_sequence(s->exec_seq, SequenceEnd::kCancelled,
                         std::span<const int32_t>(s->tokens.data(), size_t(s->n_computed)));
}

Status Scheduler::check_request(const Executor& exec, const Request& req) {
  const int64_t n_prompt = int64_t(req.prompt_tokens.size());
  if (n_prompt == 0) return make_error(ErrorCode::kInvalidArgument, "the prompt is empty");
  const int64_t vocab = exec.vocab_size();
  for (size_t i = 0; i < req.prompt_tokens.size(); ++i) {
    const int32_t t = req.prompt_tokens[i];
    if (t < 0 || t >= vocab)
      return make_error(ErrorCode::kInvalidArgument,
                        "prompt token {} at position {} is outside the vocabulary [0, {})", t, i,
                        vocab);
  }
  V4_RETURN_IF_ERROR(validate_sampling(req.sampling, vocab));
  const int64_t total = n_prompt + req.sampling.max_tokens;
  if (total > exec.max_context())
    return make_error(ErrorCode::kInvalidArgument,
                      "this model's maximum context length is {} tokens; the request needs {} "
                      "({} prompt + {} max_tokens)",
                      exec.max_context(), total, n_prompt, req.sampling.max_tokens);
  const auto pools = exec.pools();
  const auto need = exec.pages_for(total);
  for (size_t p = 0; p < pools.size() && p < need.size(); ++p) {
    if (need[p] > pools[p].capacity_pages)
      return make_error(ErrorCode::kInvalidArgument,
                        "the request can never fit: {} tokens ({} prompt + {} max_tokens) need {} "
                        "pages of pool '{}', which has {} pages in total",
                        total, n_prompt, req.sampling.max_tokens, need[p], pools[p].name,
                        pools[p].capacity_pages);
  }
  return Status::Ok();
}

void Scheduler::add(RequestId id, Request req, OutputCallback cb, Clock::time_point arrival,
                    uint64_t seed) {
  auto s = std::make_unique<Seq>();
  s->id = id;
  s->tokens = req.prompt_tokens;
  s->n_prompt = int64_t(req.prompt_tokens.size());
  if (req.sampling.repetition_penalty != 1.0f) {
    auto& u = s->penalties.prompt_tokens_unique;
    u = req.prompt_tokens;
    std::sort(u.begin(), u.end());
    u.erase(std::unique(u.begin(), u.end()), u.end());
  }
  s->req = std::move(req);
  s->cb = std::make_shared<const OutputCallback>(std::move(cb));
  s->arrival = arrival;
  s->seed = seed;
  s->reserved.assign(pools_.size(), 0);
  waiting_.push_back(s.get());
  seqs_[id] = std::move(s);
}

StepOutput Scheduler::make_output(const Seq& s) const {
  StepOutput o;
  o.id = s.id;
  o.usage.prompt_tokens = s.n_prompt;
  o.usage.completion_tokens = s.n_generated;
  o.usage.cached_tokens = s.cached_tokens;
  o.arrival_time = s.arrival;
  o.first_token_time = s.first_token;
  o.now = Clock::now();
  o.n_preemptions = s.n_preemptions;
  return o;
}

void Scheduler::release(Seq& s, SequenceEnd how) {
  for (size_t p = 0; p < pools_.size(); ++p) {
    reserved_total_[p] -= s.reserved[p];
    s.reserved[p] = 0;
  }
  if (s.exec_seq >= 0) {
    exec_.end_sequence(s.exec_seq, how,
                       std::span<const int32_t>(s.tokens.data(), size_t(s.n_computed)));
    s.exec_seq = -1;
  }
  s.n_computed = 0;
  s.snapshot_points.clear();
}

int64_t Scheduler::chunk_for(const Seq& s, int64_t budget) const {
  int64_t n = std::min(int64_t(s.tokens.size()) - s.n_computed, budget);
  for (int64_t p : s.snapshot_points)
    if (p > s.n_computed) {
      n = std::min(n, p - s.n_computed);
      break;
    }
  return n;
}

void Scheduler::remove_running(Seq* s) {
  auto it = std::find(running_.begin(), running_.end(), s);
  if (it != running_.end()) {
    running_.erase(it);
    blocked_head_ = 0;  // memory was freed: the queue head may fit now
  }
}

void Scheduler::finish(Seq* s, FinishReason reason, const Status& error,
                       std::vector<Pending>* out, bool cancelled) {
  release(*s, cancelled || reason == FinishReason::kAbort ? SequenceEnd::kCancelled
              : reason == FinishReason::kError ? SequenceEnd::kError
                                               : SequenceEnd::kFinished);
  remove_running(s);
  auto wit = std::find(waiting_.begin(), waiting_.end(), s);
  if (wit != waiting_.end()) waiting_.erase(wit);
  if (reason == FinishReason::kAbort)
    ++counters_.requests_aborted_total;
  else
    ++counters_.requests_finished_total;
  Pending p;
  p.cb = std::move(s->cb);
  p.out = make_output(*s);
  p.out.finished = true;
  p.out.finish_reason = reason;
  p.out.error = error;
  out->push_back(std::move(p));
  seqs_.erase(s->id);  // s is dangling from here
}

struct Scheduler::PhaseClock {
  EngineStats& c;
  Clock::time_point t0 = Clock::now(), planned{}, fwd0{}, fwd1{};
  bool done = false;
  void finish() {
    if (done) return;
    done = true;
    const Clock::time_point end = Clock::now();
    auto sec = [](Clock::time_point a, Clock::time_point b) {
      return std::chrono::duration<double>(b - a).count();
    };
    const Clock::time_point p = planned == Clock::time_point{} ? end : planned;
    c.step_schedule_s += sec(t0, p);
    if (fwd0 == Clock::time_point{}) return;
    c.step_batch_s += sec(p, fwd0);
    const Clock::time_point f1 = fwd1 == Clock::time_point{} ? end : fwd1;
    c.step_forward_s += sec(fwd0, f1);
    c.step_post_s += sec(f1, end);
  }
  ~PhaseClock() { finish(); }
};

void Scheduler::deliver(std::vector<Pending>& pending) {
  if (phase_clock_) phase_clock_->finish();
  if (before_final_ &&
      std::any_of(pending.begin(), pending.end(), [](const Pending& p) { return p.out.finished; }))
    before_final_();
  for (auto& p : pending)
    if (p.cb && *p.cb) (*p.cb)(p.out);
  pending.clear();
}

void Scheduler::cancel(RequestId id, FinishReason reason) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  std::vector<Pending> out;
  finish(it->second.get(), reason == FinishReason::kStop ? reason : FinishReason::kAbort,
         Status::Ok(), &out, /*cancelled=*/true);
  deliver(out);
}

void Scheduler::abort_all(FinishReason reason, const Status& error) {
  std::vector<Pending> out;
  std::vector<Seq*> all;
  for (Seq* s : running_) all.push_back(s);
  for (Seq* s : waiting_) all.push_back(s);
  for (Seq* s : all) finish(s, reason, error, &out);
  deliver(out);
}

std::vector<int64_t> Scheduler::delta_for(const Seq& s, int64_t n_tokens) const {
  std::vector<int64_t> need = exec_.pages_for(s.n_computed + n_tokens);
  need.resize(pools_.size(), 0);
  for (size_t p = 0; p < pools_.size(); ++p)
    need[p] = std::max<int64_t>(0, need[p] - s.reserved[p]);
  return need;
}

bool Scheduler::fits(const std::vector<int64_t>& delta, double watermark) const {
  for (size_t p = 0; p < pools_.size(); ++p) {
    const int64_t cap = pools_[p].capacity_pages;
    const int64_t keep = int64_t(watermark * double(cap));
    if (reserved_total_[p] + delta[p] + keep > cap) return false;
  }
  return true;
}

void Scheduler::reserve(Seq& s, const std::vector<int64_t>& delta) {
  for (size_t p = 0; p < pools_.size(); ++p) {
    s.reserved[p] += delta[p];
    reserved_total_[p] += delta[p];
  }
}

void Scheduler::preempt(Seq* s) {
  release(*s, SequenceEnd::kPreempted);
  remove_running(s);
  waiting_.push_front(s);
  ++s->n_preemptions;
  ++counters_.preemptions_total;
  V4_LOG_INFO(
      "preempted request {}{}{} ({} tokens, {} generated): out of pages; it will be "
      "recomputed",
      s->id, s->req.tag.empty() ? "" : " ", s->req.tag, s->tokens.size(), s->n_generated);
}

Status Scheduler::step() {
  last_step_ = StepRecord{};
  // Phase clock (EngineStats::step_*_s): marks set as the step passes them, summed once, when
  // its outputs are delivered or on any return.
  PhaseClock clock{counters_};
  phase_clock_ = &clock;
  struct Unset {
    PhaseClock*& p;
    ~Unset() { p = nullptr; }
  } unset{phase_clock_};
  struct Planned {
    Seq* s;
    int64_t n;
    bool decode;
  };
  std::vector<Planned> plan;
  std::vector<Pending> pending;
  int64_t budget = config_.chunked_prefill_size;
  bool preempted = false;

  // 1. Running requests, in admission order: first every decode row (one token each, so a long
  //    prefill never starves decoding requests), then prefill chunks. A request that cannot
  //    grow preempts the most recently admitted running request (possibly one planned above,
  //    or itself).
  auto try_schedule = [&](Seq* s, int64_t n) -> bool {
    auto delta = delta_for(*s, n);
    while (!fits(delta, 0.0)) {
      Seq* victim = running_.back();
      if (victim->in_plan) {
        auto it =
            std::find_if(plan.begin(), plan.end(), [&](const Planned& p) { return p.s == victim; });
        budget += it->n;
        plan.erase(it);
        victim->in_plan = false;
      }
      preempt(victim);
      preempted = true;
      ++last_step_.n_preempted;
      if (victim == s) return false;
    }
    reserve(*s, delta);
    const bool decode = s->n_generated > 0 && int64_t(s->tokens.size()) - s->n_computed == 1;
    plan.push_back({s, n, decode});
    s->in_plan = true;
    budget -= n;
    return true;
  };
  for (size_t i = 0; i < running_.size(); ++i) {
    Seq* s = running_[i];
    if (int64_t(s->tokens.size()) - s->n_computed != 1) continue;
    if (budget <= 0) {
      ++last_step_.n_decode_skipped;
      continue;
    }
    if (!try_schedule(s, 1)) break;
  }
  // Part of the budget stays for the queue head while requests wait (reserve_for_waiting).
  int64_t head_share = 0;
  if (config_.reserve_for_waiting && !waiting_.empty() &&
      int64_t(running_.size()) < config_.max_running_requests &&
      waiting_.front()->id != blocked_head_)
    head_share = std::min<int64_t>(int64_t(waiting_.front()->tokens.size()), budget / 2);
  for (size_t i = 0; i < running_.size() && budget - head_share > 0; ++i) {
    Seq* s = running_[i];
    if (s->in_plan) continue;
    if (!try_schedule(s, chunk_for(*s, budget - head_share))) break;
  }

  // 2. Waiting requests, FCFS. The pre-check assumes no prefix hit (the least a start can
  //    need); after start_sequence the real need (cached prefix + first chunk) is checked again.
  while (!preempted && !waiting_.empty() && budget > 0 &&
         int64_t(running_.size()) < config_.max_running_requests) {
    Seq* s = waiting_.front();
    const double wm = running_.empty() ? 0.0 : config_.admission_watermark;
    auto log_wait = [&](const std::vector<int64_t>& delta) {
      if (s->logged_wait) return;
      s->logged_wait = true;
      std::string why;
      for (size_t p = 0; p < pools_.size(); ++p)
        why += fmt::format("{}{} {}/{} used, needs {}", p ? "; " : "", pools_[p].name,
                           reserved_total_[p], pools_[p].capacity_pages, delta[p]);
      V4_LOG_INFO("request {}{}{} waits for memory ({} running): {}", s->id,
                  s->req.tag.empty() ? "" : " ", s->req.tag, running_.size(), why);
    };
    auto pre = delta_for(*s, std::min<int64_t>(int64_t(s->tokens.size()), budget));
    if (!fits(pre, wm)) {
      if (running_.empty()) {
        // Nothing holds pages the scheduler could wait for: refuse instead of parking forever.
        finish(s, FinishReason::kError,
               make_error(ErrorCode::kResourceExhausted,
                          "request {} cannot be scheduled even with nothing else running "
                          "(its first {} tokens do not fit the pools)",
                          s->id, std::min<int64_t>(int64_t(s->tokens.size()), budget)),
               &pending);
        continue;
      }
      log_wait(pre);
      if (head_share > 0) blocked_head_ = s->id;
      break;
    }
    // A request owing prompt logprobs computes the positions that score them (no cache hit there).
    auto start = exec_.start_sequence(s->tokens, owes_prompt_lps(*s) ? s->prompt_lp_next - 1
                                                                      : INT64_MAX);
    if (!start.ok()) {
      if (running_.empty()) {
        finish(s, FinishReason::kError, start.status(), &pending);
        continue;
      }
      if (head_share > 0) blocked_head_ = s->id;
      break;  // wait for a sequence slot
    }
    s->exec_seq = start->seq;
    s->n_computed = std::clamp<int64_t>(start->cached_tokens, 0, int64_t(s->tokens.size()) - 1);
    s->snapshot_points = std::move(start->snapshot_points);
    if (!s->cached_reported) {
      s->cached_reported = true;
      s->cached_tokens = std::min(s->n_computed, s->n_prompt);
      counters_.prefix_query_tokens_total += s->n_prompt;
      counters_.prefix_hit_tokens_total += s->cached_tokens;
    }
    const int64_t n = chunk_for(*s, budget);
    // The cached prefix's pages are held by the new sequence: budget them too.
    const int64_t n_cached = s->n_computed;
    s->n_computed = 0;
    auto delta = delta_for(*s, n_cached + n);
    s->n_computed = n_cached;
    if (!fits(delta, wm) && !running_.empty()) {
      release(*s, SequenceEnd::kPreempted);  // keeps what it had in the prefix cache
      log_wait(delta);
      if (head_share > 0) blocked_head_ = s->id;
      break;
    }
    waiting_.pop_front();
    running_.push_back(s);
    reserve(*s, delta);
    plan.push_back({s, n, false});
    s->in_plan = true;
    budget -= n;
  }
  for (auto& pl : plan) pl.s->in_plan = false;
  clock.planned = Clock::now();

  if (plan.empty()) {
    deliver(pending);
    return Status::Ok();
  }

  // 3. Run.
  model::ForwardBatch batch;
  batch.slices.resize(plan.size());
  std::vector<bool> draws(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    auto& sl = batch.slices[i];
    const Seq& s = *plan[i].s;
    sl.seq = s.exec_seq;
    sl.start_pos = s.n_computed;
    sl.tokens.assign(s.tokens.begin() + s.n_computed, s.tokens.begin() + s.n_computed + plan[i].n);
    draws[i] = s.n_computed + plan[i].n == int64_t(s.tokens.size());
    // Logits at every position when the slice holds one that scores an owed prompt token
    // (position p scores token p + 1); the last row still draws the next token on the host.
    sl.logits_all = owes_prompt_lps(s) && s.n_computed <= s.n_prompt - 2 &&
                    s.n_computed + plan[i].n >= s.prompt_lp_next;
    sl.sample = sl.logits_all ? std::nullopt
                              : device_sampling(s.req.sampling, s.seed, s.n_generated, draws[i]);
    last_step_.n_tokens += plan[i].n;
    if (plan[i].decode) ++last_step_.n_decode_rows;
  }
  last_step_.n_slices = int32_t(plan.size());
  ++counters_.steps_total;
  clock.fwd0 = Clock::now();
  auto fwd = exec_.forward(batch);
  clock.fwd1 = Clock::now();
  const Status fwd_status =
      fwd.ok() ? check_output(*fwd, plan.size(), vocab_, draws) : fwd.status();
  if (!fwd_status.ok()) {
    V4_LOG_ERROR("step failed ({} sequences, {} tokens): {}", plan.size(), last_step_.n_tokens,
                 fwd_status.to_string());
    for (auto& pl : plan) finish(pl.s, FinishReason::kError, fwd_status, &pending);
    deliver(pending);
    return fwd_status;
  }
  const model::ForwardOutput& out = *fwd;

  // 3b. Prompt logprobs of the slices that asked for every row (parallel over rows).
  for (size_t i = 0; i < plan.size(); ++i) {
    const auto& sl = batch.slices[i];
    if (!sl.logits_all) continue;
    Seq& s = *plan[i].s;
    const int64_t rows = out.row_begin[i + 1] - out.row_begin[i];
    // Position p = start_pos + r scores prompt token p + 1: those in [prompt_lp_next, n_prompt).
    const int64_t r0 = std::max<int64_t>(0, s.prompt_lp_next - 1 - sl.start_pos);
    const int64_t r1 = std::min<int64_t>(rows, s.n_prompt - 1 - sl.start_pos);
    if (rows != int64_t(sl.tokens.size()) || r1 <= r0) continue;
    const size_t base = s.prompt_lps.size();
    s.prompt_lps.resize(base + size_t(r1 - r0));
    const int32_t top_n = s.req.sampling.prompt_logprobs;
    ThreadPool::global().parallel_for(
        r1 - r0,
        [&](int64_t b, int64_t e) {
          std::vector<int32_t> idx;
          for (int64_t k = b; k < e; ++k) {
            const int64_t r = r0 + k;
            const float* row = out.logits.data() + (out.row_begin[i] + r) * out.vocab;
            token_logprobs(row, out.vocab, s.tokens[size_t(sl.start_pos + r + 1)], top_n,
                           &s.prompt_lps[base + size_t(k)], &idx);
          }
        },
        std::max<int64_t>(1, int64_t(65536) / std::max<int64_t>(1, out.vocab)));
    s.prompt_lp_next = sl.start_pos + r1 + 1;
  }

  // 4. Sample the rows whose sequence is fully computed: the token the backend sampled when
  //    it did (same rules, ops.h SampleArgs), else on the host from the logits row (parallel
  //    over rows; each row's draw depends only on its own logits, seed and step index).
  std::vector<size_t> sample_rows;
  for (size_t i = 0; i < plan.size(); ++i) {
    Seq& s = *plan[i].s;
    s.n_computed += plan[i].n;
    if (!plan[i].decode) counters_.prompt_tokens_total += plan[i].n;
    if (s.n_computed == int64_t(s.tokens.size())) sample_rows.push_back(i);
  }
  std::vector<int32_t> sampled(sample_rows.size());
  std::vector<TokenLogprobs> lps(sample_rows.size());
  std::vector<size_t> host_rows;  // indices into sample_rows drawn on the host
  for (size_t k = 0; k < sample_rows.size(); ++k) {
    const size_t i = sample_rows[k];
    const int32_t t = out.tokens.empty() ? -1 : out.tokens[i];
    if (t < 0) {
      host_rows.push_back(k);
      continue;
    }
    sampled[k] = t;
    const SamplingParams& sp = plan[i].s->req.sampling;
    if (sp.logprobs) lps[k] = device_logprobs(out, i, t, sp.top_logprobs);
  }
  const int64_t vocab = out.vocab;
  ThreadPool::global().parallel_for(
      int64_t(host_rows.size()),
      [&](int64_t b, int64_t e) {
        std::vector<float> scratch;
        std::vector<int32_t> scratch_idx;
        for (int64_t h = b; h < e; ++h) {
          const size_t k = host_rows[size_t(h)];
          const size_t i = sample_rows[k];
          const Seq& s = *plan[i].s;
          const float* row = out.logits.data() + (out.row_begin[i + 1] - 1) * vocab;
          sampled[k] = sample_token(row, vocab, s.req.sampling, s.seed, s.n_generated, s.penalties,
                                    &lps[k], &scratch, &scratch_idx);
        }
      },
      // Rows of a small vocabulary are not worth a thread wake-up each.
      std::max<int64_t>(1, int64_t(65536) / std::max<int64_t>(1, vocab)));

  // 5. Append, check stops, emit.
  const Clock::time_point now = Clock::now();
  std::vector<Seq*> done;
  std::vector<FinishReason> done_reason;
  for (size_t k = 0; k < sample_rows.size(); ++k) {
    Seq& s = *plan[sample_rows[k]].s;
    const int32_t tok = sampled[k];
    const SamplingParams& sp = s.req.sampling;
    s.tokens.push_back(tok);
    ++s.n_generated;
    ++counters_.generation_tokens_total;
    // Output counts feed the penalties only (a hash-map insert per token, ~5% of the process's
    // CPU time in bench_engine at 256 streams); requests without penalties skip it.
    if (sp.repetition_penalty != 1.0f || sp.presence_penalty != 0.0f || sp.frequency_penalty != 0.0f)
      ++s.penalties.output_counts[tok];
    if (s.n_generated == 1) s.first_token = now;
    FinishReason reason = FinishReason::kNone;
    if (std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), tok) !=
        sp.stop_token_ids.end())
      reason = FinishReason::kStop;
    else if (!sp.ignore_eos && std::find(config_.eos_token_ids.begin(), config_.eos_token_ids.end(),
                                         tok) != config_.eos_token_ids.end())
      reason = FinishReason::kStop;
    else if (s.n_generated >= sp.max_tokens || int64_t(s.tokens.size()) >= exec_.max_context())
      reason = FinishReason::kLength;
    if (reason != FinishReason::kNone) {
      done.push_back(&s);
      done_reason.push_back(reason);
      continue;
    }
    Pending p;
    p.cb = s.cb;
    p.out = make_output(s);
    p.out.now = now;
    p.out.new_tokens.push_back(tok);
    if (sp.logprobs) p.out.logprobs.push_back(std::move(lps[k]));
    if (s.n_generated == 1) p.out.prompt_logprobs = std::move(s.prompt_lps);
    pending.push_back(std::move(p));
  }
  last_step_.n_sampled = int32_t(sample_rows.size());
  // Finished requests: their final output carries the last token.
  for (size_t d = 0; d < done.size(); ++d) {
    Seq* s = done[d];
    const int32_t tok = s->tokens.back();
    size_t k = 0;
    while (plan[sample_rows[k]].s != s) ++k;
    const bool want_lp = s->req.sampling.logprobs;
    auto prompt_lps = s->n_generated == 1 ? std::move(s->prompt_lps) : std::vector<TokenLogprobs>{};
    finish(s, done_reason[d], Status::Ok(), &pending);
    pending.back().out.prompt_logprobs = std::move(prompt_lps);
    pending.back().out.new_tokens.push_back(tok);
    pending.back().out.now = now;
    if (want_lp) pending.back().out.logprobs.push_back(std::move(lps[k]));
  }
  deliver(pending);
  return Status::Ok();
}

}  // namespace v4::engine
