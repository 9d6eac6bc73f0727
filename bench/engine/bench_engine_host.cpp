// Host time between decode steps with the server's output path in the loop: the engine and
// OpenAiApi (real tokenizer, detokenizer, output parser, SSE chunks) over an executor whose forward
// sleeps --step-us to stand in for the GPU. The gap between one
// forward's end and the next one's start is what the device waits for the host (the /metrics
// counter v4serve_gpu_decode_idle_seconds_total measures the same gap on the GPU).
//
// Usage: bench_engine_host [--concurrency 1,16,64,256] [--tokens 256] [--step-us 3000]
//                          [--tokenizer models/default/tokenizer.json] [--out DIR]
// Writes DIR/engine-host.md (default bench/results) with one row per (concurrency, output
// delivery mode): EngineConfig::output_thread off (callbacks on the scheduler thread, the
// behaviour before session 26) and on.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/executor.h"
#include "server/openai_api.h"
#include "text/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
/// A stand-in for the GPU model: every forward sleeps `step_us`, then "samples on the device"
/// a token that is a fixed function of (sequence, position) among `text_ids` (the tokenizer's
/// ids that are not added / special tokens), or returns a one-hot logits row when the slice cannot be
/// sampled on the backend. Records when each forward starts and ends and its batch shape.
class SleepExecutor : public v4::engine::Executor {
 public:
  SleepExecutor(int64_t vocab, std::vector<int32_t> text_ids, int64_t step_us)
      : vocab_(vocab), text_ids_(std::move(text_ids)), step_us_(step_us) {}
  int64_t vocab_size() const override { return vocab_; }
  int64_t max_context() const override { return 1 << 20; }
  std::vector<v4::engine::PoolSpec> pools() const override { return {{"kv", 1 << 20, 256}}; }
  std::vector<int64_t> pages_for(int64_t n) const override { return {(n + 255) / 256}; }
  std::vector<v4::engine::PoolUsage> pool_usage() const override { return {{"kv", 0, 1 << 20}}; }
  v4::Result<int32_t> create_sequence() override { return next_++; }
  void free_sequence(int32_t) override {}

  struct Step {
    Clock::time_point begin, end;
    int64_t rows = 0, tokens = 0;
  };
  v4::Result<v4::model::ForwardOutput> forward(const v4::model::ForwardBatch& b) override {
    Step st;
    st.begin = Clock::now();
    st.rows = int64_t(b.slices.size());
    v4::model::ForwardOutput o;
    o.vocab = vocab_;
    o.row_begin.assign(b.slices.size() + 1, 0);
    o.tokens.assign(b.slices.size(), -1);
    int64_t rows = 0;
    for (size_t i = 0; i < b.slices.size(); ++i) {
      const auto& sl = b.slices[i];
      st.tokens += int64_t(sl.tokens.size());
      const int64_t pos = sl.start_pos + int64_t(sl.tokens.size());
      const int32_t tok = text_ids_[(uint64_t(pos) * 2654435761ull + uint64_t(sl.seq) * 40503ull) %
                                    text_ids_.size()];
      o.row_begin[i] = rows;
      if (sl.sample && !sl.logits_all) {
        o.tokens[i] = tok;
      } else {
        const int64_t n = sl.logits_all ? int64_t(sl.tokens.size()) : 1;
        o.logits.resize(size_t((rows + n) * vocab_), 0.0f);
        for (int64_t r = 0; r < n; ++r) o.logits[size_t((rows + r) * vocab_ + tok)] = 10.0f;
        rows += n;
      }
    }
    o.row_begin[b.slices.size()] = rows;
    std::this_thread::sleep_for(std::chrono::microseconds(step_us_));
    st.end = Clock::now();
    std::lock_guard<std::mutex> lk(mu);
    steps.push_back(st);
    return o;
  }
  std::mutex mu;
  std::vector<Step> steps;

 private:
  int64_t vocab_;
  std::vector<int32_t> text_ids_;
  int64_t step_us_;
  int32_t next_ = 0;
};

/// A client that reads everything at once: counts bytes, signals the end of the response.
class NullWriter : public v4::server::ResponseWriter {
 public:
  void respond(int status, std::string, std::string body,
               std::vector<std::pair<std::string, std::string>>) override {
    std::lock_guard<std::mutex> lk(mu);
    this->status = status;
    bytes += int64_t(body.size());
    done = true;
    cv.notify_all();
  }
  void start_stream(int status, std::string) override { this->status = status; }
  void write(std::string chunk) override {
    std::lock_guard<std::mutex> lk(mu);
    bytes += int64_t(chunk.size());
  }
  void end() override {
    std::lock_guard<std::mutex> lk(mu);
    done = true;
    cv.notify_all();
  }
  bool closed() const override { return false; }
  void on_close(std::function<void()>) override {}
  void set_log_info(std::string) override {}
  void wait() {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return done; });
  }
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  int status = 0;
  int64_t bytes = 0;
};

struct Row {
  int concurrency = 0;
  bool output_thread = false;
  int64_t decode_steps = 0;
  double gap_mean_us = 0, gap_p50_us = 0, gap_p99_us = 0;
  double wall_s = 0;
  int64_t bytes = 0;
  int bad_status = 0;
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5))];
}

Row run(const v4::text::Tokenizer& tok, const std::vector<int32_t>& text_ids, int concurrency, int tokens, int64_t step_us,
        bool output_thread) {
  const int64_t vocab = int64_t(tok.vocab_size());
  auto exec = std::make_unique<SleepExecutor>(vocab, text_ids, step_us);
  SleepExecutor* timed = exec.get();
  v4::engine::EngineConfig ec;
  ec.chunked_prefill_size = 1 << 16;
  ec.max_running_requests = concurrency;
  ec.stats_interval_s = 0;
  ec.output_thread = output_thread;
  auto eng = v4::engine::Engine::create(std::move(exec), ec);
  if (!eng.ok()) {
    std::fprintf(stderr, "engine: %s\n", eng.status().message().c_str());
    std::exit(1);
  }
  v4::server::ApiConfig ac;
  ac.served_model_name = "bench";
  v4::server::OpenAiApi api(eng->get(), tok, ac);

  nlohmann::json body = {
      {"model", "bench"},
      {"messages", {{{"role", "user"}, {"content", "Write a long story about a lighthouse keeper."}}}},
      {"max_tokens", tokens},
      {"ignore_eos", true},
      {"temperature", 0},
      {"stream", true},
      {"stream_options", {{"include_usage", true}}}};
  std::vector<std::shared_ptr<NullWriter>> writers;
  const auto t0 = Clock::now();
  for (int i = 0; i < concurrency; ++i) {
    v4::server::HttpRequest req;
    req.method = "POST";
    req.target = req.path = "/v1/chat/completions";
    req.headers["content-type"] = "application/json";
    body["seed"] = i;
    body["messages"][0]["content"] = "Write a long story about lighthouse keeper " + std::to_string(i) + ".";
    req.body = body.dump();
    req.remote = "127.0.0.1:1";
    auto w = std::make_shared<NullWriter>();
    writers.push_back(w);
    api.handle(std::move(req), w);
  }
  Row row;
  for (auto& w : writers) {
    w->wait();
    row.bytes += w->bytes;
    row.bad_status += w->status != 200;
  }
  row.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  // A writer ends inside its request's final callback, which may still be running: stop the
  // engine (its threads deliver and join) before the API it calls into goes, as serve does.
  std::vector<SleepExecutor::Step> steps;
  {
    std::lock_guard<std::mutex> lk(timed->mu);
    steps = timed->steps;
  }
  eng->reset();  // the executor (`timed`) goes with it
  row.concurrency = concurrency;
  row.output_thread = output_thread;
  // Gaps before the steps in which every running request decoded one token (all `concurrency`
  // requests admitted and prefilled): the steady state of a decode batch.
  std::vector<double> gaps;
  for (size_t i = 1; i < steps.size(); ++i)
    if (steps[i].rows == concurrency && steps[i].tokens == concurrency &&
        steps[i - 1].tokens == concurrency)
      gaps.push_back(std::chrono::duration<double, std::micro>(steps[i].begin - steps[i - 1].end).count());
  row.decode_steps = int64_t(gaps.size());
  double sum = 0;
  for (double g : gaps) sum += g;
  row.gap_mean_us = gaps.empty() ? 0 : sum / double(gaps.size());
  row.gap_p50_us = percentile(gaps, 0.5);
  row.gap_p99_us = percentile(gaps, 0.99);
  return row;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  size_t p = 0;
  while (p <= s.size()) {
    size_t e = s.find(',', p);
    if (e == std::string::npos) e = s.size();
    if (e > p) v.push_back(std::stoi(s.substr(p, e - p)));
    p = e + 1;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> conc = {1, 16, 64, 256};
  int tokens = 256;
  int64_t step_us = 3000;
  std::string tok_path = std::string(V4_SOURCE_DIR) + "/models/default/tokenizer.json";
  std::string out_dir = std::string(V4_SOURCE_DIR) + "/bench/results";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "error: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--concurrency") conc = parse_list(next());
    else if (a == "--tokens") tokens = std::stoi(next());
    else if (a == "--step-us") step_us = std::stoll(next());
    else if (a == "--tokenizer") tok_path = next();
    else if (a == "--out") out_dir = next();
    else {
      std::fprintf(stderr, "error: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  auto tok = v4::text::Tokenizer::from_file(tok_path);
  if (!tok.ok()) {
    std::fprintf(stderr, "error: %s\n", tok.status().message().c_str());
    return 1;
  }
  // The ids the fake model writes: every id but the added (special / control) tokens, which a
  // real model rarely writes mid-text.
  std::vector<int32_t> text_ids;
  {
    std::ifstream tf(tok_path);
    const auto tj = nlohmann::json::parse(tf, nullptr, false);
    std::vector<bool> added(tok->vocab_size(), false);
    if (tj.is_object() && tj.contains("added_tokens"))
      for (const auto& a : tj["added_tokens"])
        if (a.contains("id") && a["id"].is_number_integer() && a["id"].get<int64_t>() >= 0 &&
            a["id"].get<size_t>() < added.size())
          added[a["id"].get<size_t>()] = true;
    for (size_t i = 0; i < added.size(); ++i)
      if (!added[i]) text_ids.push_back(int32_t(i));
  }
  std::vector<Row> rows;
  for (int c : conc)
    for (bool ot : {false, true}) {
      rows.push_back(run(*tok, text_ids, c, tokens, step_us, ot));
      const Row& r = rows.back();
      std::printf("concurrency %d, output thread %s: %lld decode steps, gap mean %.1f us (p50 %.1f, p99 %.1f), %.2f s\n",
                  c, ot ? "on" : "off", (long long)r.decode_steps, r.gap_mean_us, r.gap_p50_us,
                  r.gap_p99_us, r.wall_s);
      std::fflush(stdout);
    }
  std::string commit = "unknown";
  if (FILE* g = popen(("git -C '" + std::string(V4_SOURCE_DIR) + "' rev-parse --short HEAD 2>/dev/null").c_str(), "r")) {
    char line[64] = {0};
    if (std::fgets(line, sizeof line, g)) {
      commit = line;
      while (!commit.empty() && (commit.back() == '\n' || commit.back() == '\r')) commit.pop_back();
    }
    pclose(g);
  }
  std::string cmd;
  for (int i = 0; i < argc; ++i) cmd += (i ? " " : "") + std::string(argv[i]);
  char date[64];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  const std::string path = out_dir + "/engine-host.md";
  std::ofstream f(path);
  f << "# Host time between decode steps (engine + OpenAI API output path, fake executor)\n\n"
    << "- commit: " << commit << "\n- command: `" << cmd << "`\n- date: " << date
    << "\n- GPU / CUDA: none (host-side measurement)\n- machine: "
    << std::thread::hardware_concurrency() << " hardware threads (CPU only; the forward sleeps "
    << step_us << " us in place of the GPU)\n"
    << "- workload: `concurrency` streaming chat requests (tokenizer " << tok_path << "), "
    << tokens << " tokens each (ignore_eos), include_usage; the fake model's tokens run through "
       "the real detokenizer, output parser and SSE chunk writer.\n"
    << "- gap = next forward's start − this forward's end, over the steps where every running "
       "request decoded one token: the time a GPU would sit idle between decode steps.\n"
    << "- output thread off: every request's output callback (detokenize, parse, SSE JSON) "
       "runs on the scheduler thread between steps; on: EngineConfig::output_thread delivers "
       "them on the engine's output thread while the next step runs.\n\n"
    << "| concurrency | output thread | decode steps | gap mean (µs) | gap p50 (µs) | gap p99 (µs) | "
       "wall (s) | SSE bytes | non-200 |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|\n";
  char buf[512];
  for (const Row& r : rows) {
    std::snprintf(buf, sizeof buf, "| %d | %s | %lld | %.1f | %.1f | %.1f | %.2f | %lld | %d |\n",
                  r.concurrency, r.output_thread ? "on" : "off", (long long)r.decode_steps,
                  r.gap_mean_us, r.gap_p50_us, r.gap_p99_us, r.wall_s, (long long)r.bytes,
                  r.bad_status);
    f << buf;
  }
  std::printf("wrote %s\n", path.c_str());
  return 0;
}
