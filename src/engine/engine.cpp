#include "engine/engine.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_set>

#include "base/log.h"
#include "engine/scheduler.h"

namespace v4::engine {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
    case FinishReason::kNone:
      break;
  }
  return "";
}

struct Engine::Impl {
  struct Incoming {
    RequestId id;
    Request req;
    OutputCallback cb;
    Clock::time_point arrival;
    uint64_t seed;
  };

  std::unique_ptr<Executor> exec;
  EngineConfig config;
  std::unique_ptr<Scheduler> sched;

  std::mutex mu;  // guards incoming, cancels, stop, outstanding
  std::condition_variable cv, idle_cv;
  std::vector<Incoming> incoming;
  std::vector<std::pair<RequestId, FinishReason>> cancels;
  bool stop = false;
  int64_t outstanding = 0;  // accepted, final output not yet delivered
  bool quiescent = true;    // scheduler idle and its stats published
  std::atomic<uint64_t> next_id{1};
  std::atomic<int64_t> rejected{0};
  std::atomic<int64_t> waiting_now{0};  // scheduler's queue length after the last step
  uint64_t seed_base = 0;

  mutable std::mutex stats_mu;
  EngineStats stats;

  // Rate window (scheduler thread only).
  Clock::time_point window_start;
  int64_t window_prompt = 0, window_gen = 0;
  Clock::time_point last_status;
  bool status_dirty = false;

  std::thread thread;

  // Output delivery on its own thread (EngineConfig::output_thread): the scheduler thread queues
  // each output; the output thread calls the callbacks in queue order.
  struct Delivery {
    std::shared_ptr<const OutputCallback> cb;
    StepOutput out;
  };
  std::mutex out_mu;                    // guards out_queue, out_pending, out_stop
  std::condition_variable out_cv;       // the output thread: outputs queued, or stop
  std::condition_variable out_room_cv;  // the scheduler: room below max_pending_outputs
  std::vector<Delivery> out_queue;
  int64_t out_pending = 0;  // queued + being delivered
  bool out_stop = false;
  std::thread out_thread;
  // Requests whose callback threw (deliver): no further calls; erased at their final output.
  std::unordered_set<RequestId> failed_callbacks;
  std::atomic<int64_t> callback_errors{0};

  // Scheduler thread only: the end of the last step when the loop went straight on to another,
  // and the summed gaps between such steps (EngineStats::step_between_s).
  Clock::time_point step_ended{};
  double step_between_s = 0;
  void loop();
  void output_loop();
  void publish_stats(Clock::time_point now);
  /// Calls the callback, then counts a final output as delivered (wait_idle).
  void deliver(const OutputCallback& cb, const StepOutput& o);
  /// Hands an output to the output thread, or delivers it here with output_thread off.
  void emit(const std::shared_ptr<const OutputCallback>& cb, const StepOutput& o);
  /// Blocks the scheduler while max_pending_outputs outputs wait for delivery.
  void wait_output_room();
};

void Engine::Impl::deliver(const OutputCallback& cb, const StepOutput& o) {
  // A callback that throws loses its own request, never the process or another request's
  // outputs: the exception is logged, the request is cancelled (kAbort) and its callback is not
  // called again; its final output is still counted (wait_idle). Only the delivering thread
  // (the output thread, or the scheduler thread with output_thread off) touches failed_callbacks.
  const bool failed_before = !failed_callbacks.empty() && failed_callbacks.count(o.id) > 0;
  if (cb && !failed_before) {
    std::string what;
    try {
      cb(o);
    } catch (const std::exception& e) {
      what = e.what();
      if (what.empty()) what = "std::exception";
    } catch (...) {
      what = "an exception not derived from std::exception";
    }
    if (!what.empty()) {
      V4_LOG_ERROR("output callback of request {} threw ({}); {}", o.id, log_escape(what),
                   o.finished ? "it had finished" : "the request is cancelled");
      callback_errors.fetch_add(1, std::memory_order_relaxed);
      if (!o.finished) {
        failed_callbacks.insert(o.id);
        {
          std::lock_guard<std::mutex> lk(mu);
          cancels.emplace_back(o.id, FinishReason::kAbort);
        }
        cv.notify_one();
      }
    }
  }
  if (o.finished && failed_before) failed_callbacks.erase(o.id);
  if (o.finished) {
    std::lock_guard<std::mutex> lk(mu);
    --outstanding;
    idle_cv.notify_all();
  }
}

void Engine::Impl::emit(const std::shared_ptr<const OutputCallback>& cb, const StepOutput& o) {
  if (!config.output_thread) return deliver(*cb, o);
  bool was_empty;
  {
    std::lock_guard<std::mutex> lk(out_mu);
    was_empty = out_queue.empty();
    out_queue.push_back({cb, o});
    ++out_pending;
  }
  if (was_empty) out_cv.notify_one();  // the output thread waits only on an empty queue
}

void Engine::Impl::output_loop() {
  std::vector<Delivery> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(out_mu);
      out_cv.wait(lk, [&] { return out_stop || !out_queue.empty(); });
      if (out_queue.empty()) break;  // stopping, and everything was delivered
      batch.swap(out_queue);
    }
    for (const Delivery& d : batch) deliver(*d.cb, d.out);
    {
      std::lock_guard<std::mutex> lk(out_mu);
      out_pending -= int64_t(batch.size());
    }
    out_room_cv.notify_all();
    batch.clear();
  }
}

void Engine::Impl::wait_output_room() {
  if (!config.output_thread) return;
  std::unique_lock<std::mutex> lk(out_mu);
  out_room_cv.wait(lk, [&] { return out_pending < config.max_pending_outputs; });
}

void Engine::Impl::publish_stats(Clock::time_point now) {
  const EngineStats& c = sched->counters();
  EngineStats s = c;
  s.running = sched->n_running();
  s.waiting = sched->n_waiting();
  waiting_now.store(s.waiting);
  s.requests_rejected_total = rejected.load();
  s.callback_errors_total = callback_errors.load();
  s.step_between_s = step_between_s;
  for (const auto& u : exec->pool_usage())
    s.pools.push_back({u.name, u.used_pages, u.capacity_pages, u.bytes_per_page});
  s.device = exec->device_timing();
  const double window_s = std::max(1.0, config.stats_interval_s);
  const double dt = std::chrono::duration<double>(now - window_start).count();
  {
    std::lock_guard<std::mutex> lk(stats_mu);
    s.prompt_tokens_per_s = stats.prompt_tokens_per_s;
    s.generation_tokens_per_s = stats.generation_tokens_per_s;
    if (dt >= window_s) {
      s.prompt_tokens_per_s = double(c.prompt_tokens_total - window_prompt) / dt;
      s.generation_tokens_per_s = double(c.generation_tokens_total - window_gen) / dt;
    }
    stats = s;
  }
  if (dt >= window_s) {
    window_start = now;
    window_prompt = c.prompt_tokens_total;
    window_gen = c.generation_tokens_total;
  }
  if (config.stats_interval_s > 0 && status_dirty &&
      std::chrono::duration<double>(now - last_status).count() >= config.stats_interval_s) {
    last_status = now;
    status_dirty = s.running > 0 || s.waiting > 0;
    std::string pools;
    for (const auto& p : s.pools)
      pools += fmt::format(
          ", {} {:.1f}%", p.name,
          p.capacity_pages ? 100.0 * double(p.used_pages) / double(p.capacity_pages) : 0.0);
    std::string extra;
    if (s.prefix_query_tokens_total > 0)
      extra += fmt::format(", prefix hits {:.1f}%", 100.0 * double(s.prefix_hit_tokens_total) /
                                                        double(s.prefix_query_tokens_total));
    if (s.preemptions_total > 0) extra += fmt::format(", preemptions {}", s.preemptions_total);
    V4_LOG_INFO("running {}, waiting {}, in {:.1f} tok/s, out {:.1f} tok/s{}{}", s.running,
                s.waiting, s.prompt_tokens_per_s, s.generation_tokens_per_s, pools, extra);
  }
}

void Engine::Impl::loop() {
  window_start = last_status = Clock::now();
  std::vector<Incoming> in;
  std::vector<std::pair<RequestId, FinishReason>> cn;
  // While idle the loop still wakes once per stats window, so the throughput gauges of stats()
  // (and /metrics) fall to 0 instead of keeping the last busy window's rate.
  const auto idle_tick = std::chrono::duration<double>(std::max(1.0, config.stats_interval_s));
  for (;;) {
    bool tick = false;
    {
      std::unique_lock<std::mutex> lk(mu);
      tick = !cv.wait_for(lk, idle_tick, [&] {
        return stop || !incoming.empty() || !cancels.empty() || !sched->idle();
      });
      if (stop) break;
      if (!tick) {
        in.swap(incoming);
        cn.swap(cancels);
      }
    }
    if (tick) {
      publish_stats(Clock::now());
      continue;
    }
    for (auto& r : in) sched->add(r.id, std::move(r.req), std::move(r.cb), r.arrival, r.seed);
    in.clear();
    for (auto [id, reason] : cn) sched->cancel(id, reason);
    cn.clear();
    if (!sched->idle()) {
      status_dirty = true;
      wait_output_room();
      const Clock::time_point t_step = Clock::now();
      if (step_ended != Clock::time_point{})
        step_between_s += std::chrono::duration<double>(t_step - step_ended).count();
      Status st = sched->step();
      (void)st;  // already logged and reported to the requests of the failed batch
      // A gap counts only when work was left after this step: an engine that drained then
      // waits for new requests, which is not time the next step spent waiting on the host.
      step_ended = sched->idle() ? Clock::time_point{} : Clock::now();
    } else {
      step_ended = Clock::time_point{};
    }
    publish_stats(Clock::now());
    if (sched->idle()) {
      std::lock_guard<std::mutex> lk(mu);
      if (incoming.empty()) {
        quiescent = true;
        idle_cv.notify_all();
      }
    }
  }
  sched->abort_all(FinishReason::kAbort, Status::Ok());
  publish_stats(Clock::now());
}

Result<std::unique_ptr<Engine>> Engine::create(std::unique_ptr<Executor> executor,
                                               EngineConfig config) {
  if (!executor) return make_error(ErrorCode::kInvalidArgument, "engine: no executor");
  if (config.chunked_prefill_size < 1)
    return make_error(ErrorCode::kInvalidArgument, "chunked_prefill_size must be >= 1, got {}",
                      config.chunked_prefill_size);
  if (config.max_running_requests < 1)
    return make_error(ErrorCode::kInvalidArgument, "max_running_requests must be >= 1, got {}",
                      config.max_running_requests);
  if (config.max_pending_outputs < 1)
    return make_error(ErrorCode::kInvalidArgument, "max_pending_outputs must be >= 1, got {}",
                      config.max_pending_outputs);
  if (!(config.admission_watermark >= 0.0 && config.admission_watermark < 1.0))
    return make_error(ErrorCode::kInvalidArgument, "admission_watermark must be in [0, 1), got {}",
                      config.admission_watermark);
  const int64_t vocab = executor->vocab_size();
  for (int32_t t : config.eos_token_ids)
    if (t < 0 || t >= vocab)
      return make_error(ErrorCode::kInvalidArgument, "eos token id {} outside vocabulary [0, {})",
                        t, vocab);
  std::unique_ptr<Engine> e(new Engine());
  e->config_ = config;
  e->vocab_size_ = vocab;
  e->max_context_ = executor->max_context();
  e->impl_ = std::make_unique<Impl>();
  Impl& im = *e->impl_;
  im.exec = std::move(executor);
  im.config = config;
  im.sched = std::make_unique<Scheduler>(*im.exec, config);
  im.sched->set_before_final_outputs([&im] { im.publish_stats(Clock::now()); });
  im.seed_base = (uint64_t(std::random_device{}()) << 32) ^ uint64_t(std::random_device{}());
  im.publish_stats(Clock::now());
  if (config.output_thread) im.out_thread = std::thread([&im] { im.output_loop(); });
  im.thread = std::thread([&im] { im.loop(); });
  return e;
}

Engine::~Engine() {
  if (!impl_) return;
  std::vector<Impl::Incoming> leftover;
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->stop = true;
    leftover.swap(impl_->incoming);
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
  // Requests never handed to the scheduler get their final output here (through the output
  // thread, after the outputs queued before them).
  for (auto& r : leftover) {
    StepOutput o;
    o.id = r.id;
    o.finished = true;
    o.finish_reason = FinishReason::kAbort;
    o.usage.prompt_tokens = int64_t(r.req.prompt_tokens.size());
    o.arrival_time = r.arrival;
    o.now = Clock::now();
    if (r.cb) r.cb(o);
  }
  {
    std::lock_guard<std::mutex> lk(impl_->out_mu);
    impl_->out_stop = true;
  }
  impl_->out_cv.notify_all();
  if (impl_->out_thread.joinable()) impl_->out_thread.join();
}

Result<RequestId> Engine::submit(Request request, OutputCallback callback) {
  normalize_sampling(&request.sampling);  // a temperature below 1e-5 is greedy (vLLM's rule)
  Status st = Scheduler::check_request(*impl_->exec, request);
  if (!st.ok()) {
    ++impl_->rejected;
    V4_LOG_DEBUG("rejected request{}{}: {}", request.tag.empty() ? "" : " ", request.tag,
                 st.message());
    return st;
  }
  Impl& im = *impl_;
  const RequestId id = im.next_id.fetch_add(1);
  uint64_t seed =
      request.sampling.seed ? *request.sampling.seed : im.seed_base ^ (id * 0x9E3779B97F4A7C15ull);
  auto cb = std::make_shared<const OutputCallback>(std::move(callback));
  OutputCallback wrapped = [&im, cb](const StepOutput& o) { im.emit(cb, o); };
  {
    std::lock_guard<std::mutex> lk(im.mu);
    if (im.stop) return make_error(ErrorCode::kResourceExhausted, "the engine is shutting down");
    const int64_t queued = im.waiting_now.load() + int64_t(im.incoming.size());
    if (queued >= config_.max_waiting_requests) {
      ++im.rejected;
      return make_error(ErrorCode::kResourceExhausted,
                        "too many waiting requests ({}); try again later", queued);
    }
    ++im.outstanding;
    im.quiescent = false;
    im.incoming.push_back({id, std::move(request), std::move(wrapped), Clock::now(), seed});
  }
  im.cv.notify_one();
  return id;
}

int64_t Engine::max_tokens_limit(int64_t n_prompt) const {
  const Executor& ex = *impl_->exec;
  const auto pools = ex.pools();
  auto fits = [&](int64_t total) {
    if (total > ex.max_context()) return false;
    const auto need = ex.pages_for(total);
    for (size_t p = 0; p < pools.size() && p < need.size(); ++p)
      if (need[p] > pools[p].capacity_pages) return false;
    return true;
  };
  if (n_prompt < 1 || !fits(n_prompt + 1)) return 0;
  // pages_for is non-decreasing, so the set of totals that fit is a prefix: binary search.
  int64_t lo = n_prompt + 1, hi = ex.max_context();
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid))
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo - n_prompt;
}

void Engine::cancel(RequestId id, FinishReason reason) {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->cancels.emplace_back(id, reason);
  }
  impl_->cv.notify_one();
}

EngineStats Engine::stats() const {
  EngineStats s;
  {
    std::lock_guard<std::mutex> lk(impl_->stats_mu);
    s = impl_->stats;
  }
  s.requests_rejected_total = impl_->rejected.load();
  s.callback_errors_total = impl_->callback_errors.load();
  return s;
}

void Engine::wait_idle() {
  std::unique_lock<std::mutex> lk(impl_->mu);
  impl_->idle_cv.wait(lk,
                      [&] { return (impl_->outstanding == 0 && impl_->quiescent) || impl_->stop; });
}

Result<std::vector<int32_t>> Engine::generate(Request request, FinishReason* out_reason,
                                              std::vector<TokenLogprobs>* out_logprobs) {
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::vector<int32_t> tokens;
    std::vector<TokenLogprobs> lps;
    FinishReason reason = FinishReason::kNone;
    Status error;
  };
  auto st = std::make_shared<State>();
  auto id = submit(std::move(request), [st](const StepOutput& o) {
    std::lock_guard<std::mutex> lk(st->mu);
    st->tokens.insert(st->tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
    st->lps.insert(st->lps.end(), o.logprobs.begin(), o.logprobs.end());
    if (o.finished) {
      st->done = true;
      st->reason = o.finish_reason;
      st->error = o.error;
      st->cv.notify_all();
    }
  });
  if (!id.ok()) return id.status();
  std::unique_lock<std::mutex> lk(st->mu);
  st->cv.wait(lk, [&] { return st->done; });
  if (!st->error.ok()) return st->error;
  if (out_reason) *out_reason = st->reason;
  if (out_logprobs) *out_logprobs = std::move(st->lps);
  return std::move(st->tokens);
}

}  // namespace v4::engine
