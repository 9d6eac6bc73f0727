// `v4serve generate`: load a checkpoint, run a prompt through the CPU forward, and decode
// greedily (temperature 0) or by sampling. `--dump-logits FILE` writes a safetensors file with
// prompt_ids I64 [n_prompt], prefill_logits F32 [n_prompt, vocab], tokens I64 [N] and
// decode_logits F32 [N, vocab] where row 0 = last prefill row and row i = logits after feeding
// tokens[i-1] (the fixtures' convention, tests/fixtures/*/golden.safetensors).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <random>
#include <sstream>

#include "base/log.h"
#include "base/thread_pool.h"
#include "cli/command.h"
#include "cli/model_args.h"
#include "cli/validators.h"
#include "engine/model_executor.h"
#include "model/deepseek_v4.h"
#include "model/safetensors_writer.h"
#include "ops/ops.h"
#include "text/tokenizer.h"

namespace {

struct GenerateOptions {
  v4::cli::ModelArgs m;
  std::string prompt;
  std::string prompt_ids;
  int max_new_tokens = 16;
  double temperature = 0.0;
  uint64_t seed = 0;
  std::string dump_logits;
  bool ignore_eos = false;
  bool no_bos = false;
  int threads = 0;
  int64_t kv_budget_mb = 1024;
  double mem_fraction = 0;  // > 0: KV budget from device memory (overrides --kv-budget-mb)
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int32_t pick(const float* logits, int64_t V, double temperature, std::mt19937_64& rng) {
  if (temperature <= 0) return int32_t(std::max_element(logits, logits + V) - logits);
  const float mx = *std::max_element(logits, logits + V);
  std::vector<double> p(static_cast<size_t>(V));
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += (p[i] = std::exp(double(logits[i] - mx) / temperature));
  std::uniform_real_distribution<double> u(0, sum);
  double r = u(rng);
  for (int64_t i = 0; i < V; ++i)
    if ((r -= p[i]) <= 0) return int32_t(i);
  return int32_t(V - 1);
}

int run_generate(const GenerateOptions& o) {
  using namespace v4;
  if (o.prompt.empty() && o.prompt_ids.empty()) {
    std::fprintf(stderr, "error: give a non-empty --prompt TEXT or --prompt-ids IDS\n");
    return 2;
  }
  if (!o.prompt.empty() && !o.prompt_ids.empty()) {
    std::fprintf(stderr, "error: give only one of --prompt or --prompt-ids\n");
    return 2;
  }
  if (!o.dump_logits.empty()) {  // checked before the model loads, not after generating
    const auto dir = std::filesystem::path(o.dump_logits).parent_path();
    if (!dir.empty() && !std::filesystem::is_directory(dir)) {
      std::fprintf(stderr, "error: --dump-logits %s: directory %s does not exist\n",
                   o.dump_logits.c_str(), dir.string().c_str());
      return 2;
    }
  }
  // The tokenizer before the weights: a missing or broken tokenizer.json is reported at once,
  // not after a model load of minutes.
  const std::string model_dir = cli::model_dir_of(o.m.model);
  std::optional<text::Tokenizer> tok;
  if (std::filesystem::exists(model_dir + "/tokenizer.json")) {
    auto t = text::Tokenizer::from_file(model_dir);
    if (!t.ok()) {
      std::fprintf(stderr, "error: %s\n", t.status().message().c_str());
      return 1;
    }
    tok = std::move(t).value();
  }
  if (std::error_code ec; o.prompt_ids.empty() && !tok && std::filesystem::exists(o.m.model, ec)) {
    // (A model path that does not exist is load_model's error, below.)
    std::fprintf(stderr, "error: --prompt needs %s/tokenizer.json (or use --prompt-ids)\n",
                 model_dir.c_str());
    return 1;
  }
  std::unique_ptr<ThreadPool> pool;
  if (o.threads > 0) pool = std::make_unique<ThreadPool>(o.threads);
  const double t_load = now_s();
  auto lm = cli::load_model(o.m, pool.get());
  if (!lm.ok()) {
    std::fprintf(stderr, "error: %s\n", lm.status().message().c_str());
    return lm.status().code() == ErrorCode::kInvalidArgument ? 2 : 1;
  }
  auto& model = *lm->model;
  const auto& cfg = model.config();
  V4_LOG_INFO("loaded {} in {:.2f} s (KV cache {}, indexer keys {})", o.m.model,
              now_s() - t_load, v4::kv_dtype_name(o.m.kv_dtype()),
              v4::index_key_dtype_name(o.m.index_dtype()));

  std::vector<int32_t> prompt;
  if (!o.prompt_ids.empty()) {
    std::stringstream ss(o.prompt_ids);
    std::string item;
    while (std::getline(ss, item, ',')) {
      try {
        size_t used = 0;
        const long long v = std::stoll(item, &used);
        if (used != item.size()) throw std::invalid_argument(item);
        prompt.push_back(int32_t(v));
      } catch (const std::exception&) {
        std::fprintf(stderr, "error: --prompt-ids: '%s' is not an integer\n", item.c_str());
        return 2;
      }
    }
  } else {
    if (!tok) {
      std::fprintf(stderr, "error: --prompt needs %s/tokenizer.json (or use --prompt-ids)\n",
                   model_dir.c_str());
      return 1;
    }
    // A sequence starts with BOS, as the model was trained (DeepSeek's tokenizer files add none
    // themselves: add_bos_token false, ByteLevel post-processor); --no-bos leaves it out.
    // A prompt that already begins with the BOS text gets no second one.
    const auto ids = tok->encode(o.prompt, true);
    const auto bos = tok->bos_id();
    if (bos && !o.no_bos && (ids.empty() || ids.front() != *bos)) prompt.push_back(*bos);
    prompt.insert(prompt.end(), ids.begin(), ids.end());
  }
  if (prompt.empty()) {
    std::fprintf(stderr, "error: the prompt is empty\n");
    return 2;
  }
  for (int32_t id : prompt)
    if (id < 0 || id >= cfg.vocab_size) {
      std::fprintf(stderr, "error: prompt token id %d outside the vocabulary [0, %lld)\n", id,
                   (long long)cfg.vocab_size);
      return 2;
    }

  // The whole request must fit the model's context, as the server checks (context_length_exceeded).
  const int64_t total = int64_t(prompt.size()) + o.max_new_tokens;
  if (total > cfg.max_position_embeddings) {
    std::fprintf(stderr,
                 "error: --max-new-tokens %d: the prompt's %zu tokens plus %d new ones exceed the "
                 "model's context of %lld tokens\n",
                 o.max_new_tokens, prompt.size(), o.max_new_tokens,
                 (long long)cfg.max_position_embeddings);
    return 2;
  }

  int64_t kv_budget = o.kv_budget_mb << 20;
  if (o.mem_fraction > 0) {
    std::string why;
    auto b = engine::kv_budget_from_mem_fraction(
        *lm->ops, o.mem_fraction,
        engine::workspace_reserve_bytes(cfg, int64_t(prompt.size()),
                                        int64_t(prompt.size()) + o.max_new_tokens),
        &why);
    if (!b.ok()) {
      std::fprintf(stderr, "error: %s\n", b.status().message().c_str());
      return 1;
    }
    V4_LOG_INFO("{}", why);
    kv_budget = *b;
  }
  if (o.mem_fraction <= 0) {
    if (Status st = engine::check_kv_budget(*lm->ops, kv_budget, 0); !st.ok()) {
      std::fprintf(stderr, "error: %s\n", st.message().c_str());
      return 1;
    }
  }
  auto kv_r = model.make_cache(kv_budget, 1, 0, 0, o.m.kv_dtype(), o.m.index_cache());
  if (!kv_r.ok()) {
    std::fprintf(stderr, "error: %s\n", kv_r.status().message().c_str());
    return 1;
  }
  auto& kv = *kv_r.value();
  // The cache holds the prompt and every new token but the last (it is not fed back): refuse a
  // request the pools cannot hold now, instead of failing after decoding part of it.
  const int64_t cache_tokens = kv.options().n_pages * kv.options().page_size;
  if (total - 1 > cache_tokens) {
    std::fprintf(stderr,
                 "error: --max-new-tokens %d: the prompt's %zu tokens plus %d new ones need %lld "
                 "cached tokens, and the KV cache (--kv-budget-mb / --mem-fraction) holds %lld\n",
                 o.max_new_tokens, prompt.size(), o.max_new_tokens, (long long)(total - 1),
                 (long long)cache_tokens);
    return 2;
  }
  auto seq = kv.create_sequence();
  if (!seq.ok()) {
    std::fprintf(stderr, "error: %s\n", seq.status().message().c_str());
    return 1;
  }
  const int64_t V = cfg.vocab_size;
  const bool dump = !o.dump_logits.empty();
  model::ForwardBatch b;
  b.slices.push_back({*seq, 0, prompt, dump});
  const double t0 = now_s();
  auto out = model.forward(b, kv);
  if (!out.ok()) {
    std::fprintf(stderr, "error: %s\n", out.status().message().c_str());
    return 1;
  }
  const double t_prefill = now_s() - t0;
  std::vector<float> prefill_logits = out->logits;
  std::vector<float> last(out->logits.end() - V, out->logits.end());
  std::vector<float> decode_logits;
  std::vector<int64_t> tokens;
  std::mt19937_64 rng(o.seed);
  int64_t pos = int64_t(prompt.size());
  const double t1 = now_s();
  int n_decode_steps = 0;
  std::string decode_error;
  for (int i = 0; i < o.max_new_tokens; ++i) {
    if (dump) decode_logits.insert(decode_logits.end(), last.begin(), last.end());
    const int32_t next = pick(last.data(), V, o.temperature, rng);
    tokens.push_back(next);
    const bool eos = std::find(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end(), next) !=
                     cfg.eos_token_ids.end();
    if ((eos && !o.ignore_eos) || i + 1 == o.max_new_tokens) break;
    model::ForwardBatch d;
    d.slices.push_back({*seq, pos, {next}, false});
    out = model.forward(d, kv);
    if (!out.ok()) {  // print what was generated, then the error
      decode_error = out.status().message();
      break;
    }
    last = out->logits;
    ++pos;
    ++n_decode_steps;
  }
  const double t_decode = now_s() - t1;

  std::string ids_str;
  for (auto t : tokens) ids_str += (ids_str.empty() ? "" : ",") + std::to_string(t);
  if (tok) {
    std::vector<text::TokenId> ids(tokens.begin(), tokens.end());
    std::printf("%s\n", tok->decode(ids).c_str());
  }
  std::printf("tokens: %s\n", ids_str.c_str());
  std::fprintf(
      stderr,
      "prefill: %zu tokens in %.3f s (%.1f tok/s); decode: %d steps in %.3f s (%.1f tok/s)\n",
      prompt.size(), t_prefill, prompt.size() / std::max(t_prefill, 1e-9), n_decode_steps, t_decode,
      n_decode_steps / std::max(t_decode, 1e-9));
  if (!decode_error.empty()) {
    std::fprintf(stderr, "error: %s (after %zu generated tokens)\n", decode_error.c_str(),
                 tokens.size());
    return 1;
  }
  if (dump) {
    std::vector<int64_t> pids(prompt.begin(), prompt.end());
    const int64_t N = int64_t(tokens.size());
    auto st = model::write_safetensors(
        o.dump_logits,
        {model::make_i64_tensor("prompt_ids", pids),
         model::make_f32_tensor("prefill_logits", {int64_t(prompt.size()), V}, prefill_logits),
         model::make_i64_tensor("tokens", tokens),
         model::make_f32_tensor("decode_logits", {N, V}, decode_logits)});
    if (!st.ok()) {
      std::fprintf(stderr, "error: %s\n", st.message().c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace

V4_REGISTER_COMMAND(
    generate, "generate", "run a prompt through the model (CPU, or CUDA with --device cuda) and decode",
    [](CLI::App& app) {
      auto o = std::make_shared<GenerateOptions>();
      app.add_option("--model", o->m.model,
                     "checkpoint directory (config.json + *.safetensors); with --load-format "
                     "dummy also a config.json file")
          ->required();
      app.add_option("--prompt", o->prompt,
                     "prompt text (needs tokenizer.json in the model directory)");
      app.add_option("--prompt-ids", o->prompt_ids, "prompt token ids, comma-separated");
      app.add_option("--max-new-tokens", o->max_new_tokens, "tokens to generate")
          ->check(v4::cli::int_at_least(1, INT32_MAX));
      app.add_option("--temperature", o->temperature, "0 = greedy")
          ->check(v4::cli::number_at_least(0.0));
      app.add_option("--seed", o->seed, "sampling seed (temperature > 0)")
          ->check(v4::cli::int_at_least(0));
      app.add_option("--dump-logits", o->dump_logits,
                     "write prompt/prefill/decode logits to this safetensors file");
      app.add_flag("--ignore-eos", o->ignore_eos, "keep generating after an EOS token");
      app.add_flag("--no-bos", o->no_bos, "--prompt: do not start the prompt with the BOS token");
      app.add_option("--threads", o->threads,
                     "CPU threads (default 0: V4_NUM_THREADS or all cores)")
          ->check(v4::cli::int_range(0, 4096));
      app.add_option("--device", o->m.device, "op backend: cpu (default) or cuda")
          ->check(CLI::IsMember({"cpu", "cuda"}));
      app.add_option("--kv-budget-mb", o->kv_budget_mb, "KV cache budget in MiB")
          ->check(v4::cli::int_at_least(1, int64_t(1) << 40));
      app.add_option("--mem-fraction", o->mem_fraction,
                     "size the KV cache from device memory: fraction x total - in use - "
                     "workspace reserve (overrides --kv-budget-mb)")
          ->check(v4::cli::number_range(0.0, 1.0));
      v4::cli::add_model_options(app, &o->m);
      return std::function<int()>([o] { return run_generate(*o); });
    });
