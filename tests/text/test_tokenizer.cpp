// Tokenizer and Detokenizer vs HF `tokenizers` goldens (tools/gen_text_goldens.py).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "text/detokenizer.h"
#include "text/tokenizer.h"
#include "text_test_paths.h"

using v4::text::Detokenizer;
using v4::text::DetokenizerOptions;
using v4::text::TokenId;
using v4::text::Tokenizer;

namespace {

std::string tokenizer_path() { return v4test::dsv3_tokenizer_json(); }

const Tokenizer* tok_v3() {
  static std::unique_ptr<Tokenizer> t = []() -> std::unique_ptr<Tokenizer> {
    if (tokenizer_path().empty()) return std::unique_ptr<Tokenizer>();
    auto r = Tokenizer::from_file(tokenizer_path());
    return r.ok() ? std::make_unique<Tokenizer>(*r) : nullptr;
  }();
  return t.get();
}

const Tokenizer* tok_v4() {
  static std::unique_ptr<Tokenizer> t = []() -> std::unique_ptr<Tokenizer> {
    if (!tok_v3()) return nullptr;
    auto r = tok_v3()->with_added_tokens(Tokenizer::dsv4_added_tokens());
    return r.ok() ? std::make_unique<Tokenizer>(*r) : nullptr;
  }();
  return t.get();
}

std::string b64decode(const std::string& in) {
  static const std::string chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  int val = 0, bits = -8;
  for (char c : in) {
    auto pos = chars.find(c);
    if (pos == std::string::npos) break;
    val = (val << 6) + static_cast<int>(pos);
    bits += 6;
    if (bits >= 0) {
      out.push_back(static_cast<char>((val >> bits) & 0xFF));
      bits -= 8;
    }
  }
  return out;
}

std::vector<nlohmann::json> goldens() {
  std::ifstream f(std::string(V4_SOURCE_DIR) + "/tests/data/text/tokenizer_goldens.jsonl");
  std::vector<nlohmann::json> v;
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) v.push_back(nlohmann::json::parse(line));
  return v;
}

#define REQUIRE_TOKENIZER() \
  if (!tok_v3()) GTEST_SKIP() << "DeepSeek tokenizer.json not found at " << tokenizer_path()

}  // namespace

TEST(Tokenizer, LoadsV3) {
  REQUIRE_TOKENIZER();
  EXPECT_EQ(tok_v3()->vocab_size(), 128815u);
  EXPECT_EQ(tok_v3()->bos_id(), 0);
  EXPECT_EQ(tok_v3()->eos_id(), 1);
  EXPECT_EQ(tok_v3()->token_to_id("<｜User｜>"), 128803);
  EXPECT_EQ(tok_v3()->token_to_id("Ġ"), 223);
  EXPECT_EQ(tok_v3()->id_to_token(223), "Ġ");
  EXPECT_EQ(tok_v3()->token_bytes(223), " ");
  EXPECT_TRUE(tok_v3()->is_special(0));
  EXPECT_FALSE(tok_v3()->is_special(128803));
  EXPECT_TRUE(tok_v3()->is_added(128803));
  EXPECT_FALSE(tok_v3()->token_to_id("<think>").has_value());
}

TEST(Tokenizer, V4TableAndDirectory) {
  REQUIRE_TOKENIZER();
  EXPECT_EQ(tok_v4()->vocab_size(), 129280u);
  EXPECT_EQ(tok_v4()->token_to_id("<think>"), 128821);
  EXPECT_EQ(tok_v4()->token_to_id("｜DSML｜"), 128825);
  EXPECT_EQ(tok_v4()->token_to_id("<｜image｜>"), 129279);
  // Directory form: a model dir with tokenizer.json (+ tokenizer_config.json for BOS/EOS).
  auto t = Tokenizer::from_file(v4test::dsv3_tokenizer_dir());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->encode("Hello"), std::vector<TokenId>{19923});
}

TEST(Tokenizer, SanityIdsFromChatEncodingDoc) {
  REQUIRE_TOKENIZER();
  EXPECT_EQ(tok_v4()->encode("The capital of France is"), (std::vector<TokenId>{671, 6102, 294, 8760, 344}));
  EXPECT_EQ(tok_v4()->encode("1234567"), (std::vector<TokenId>{6895, 18009, 25}));
  EXPECT_EQ(tok_v4()->encode("你好，世界"), (std::vector<TokenId>{30594, 303, 3427}));
  EXPECT_EQ(tok_v4()->encode("\r\n\r\n"), (std::vector<TokenId>{204, 201, 204, 201}));
  EXPECT_EQ(tok_v4()->encode(std::string("x\0y", 3)), (std::vector<TokenId>{90, 191, 91}));
  EXPECT_EQ(tok_v4()->encode("<｜System｜>"), (std::vector<TokenId>{30, 28217, 8375, 28217, 32}));
  EXPECT_EQ(tok_v4()->encode("<｜User｜><tool_result>{\"temp\": 21}</tool_result><｜Assistant｜><think>"),
            (std::vector<TokenId>{128803, 30, 72461, 46148, 32, 24313, 26343, 3362, 223, 1602, 24568, 72461,
                                  46148, 32, 128804, 128821}));
}

TEST(Tokenizer, EqualsHfOnCorpus) {
  REQUIRE_TOKENIZER();
  auto gs = goldens();
  ASSERT_GE(gs.size(), 50u);
  int checked = 0;
  for (auto& g : gs) {
    const Tokenizer& t = g["table"] == "v4" ? *tok_v4() : *tok_v3();
    std::string text = g.contains("bytes_b64") ? b64decode(g["bytes_b64"]) : g["text"].get<std::string>();
    auto want = g["ids"].get<std::vector<TokenId>>();
    EXPECT_EQ(t.encode(text), want) << g["name"];
    EXPECT_EQ(t.encode(text, true), g["ids_special"].get<std::vector<TokenId>>()) << g["name"];
    EXPECT_EQ(t.decode(want), g["decoded"].get<std::string>()) << g["name"];
    EXPECT_EQ(t.decode(want, true), g["decoded_skip"].get<std::string>()) << g["name"];
    if (!g.contains("bytes_b64")) {
      EXPECT_EQ(t.decode(want), text) << "round trip " << g["name"];
    }
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(gs.size()));
}

TEST(Detokenizer, StreamingEqualsDecodeAndNeverSplitsCharacters) {
  REQUIRE_TOKENIZER();
  for (auto& g : goldens()) {
    const Tokenizer& t = g["table"] == "v4" ? *tok_v4() : *tok_v3();
    auto ids = g["ids"].get<std::vector<TokenId>>();
    for (bool skip : {false, true}) {
      Detokenizer d(t, DetokenizerOptions{skip});
      std::string all;
      for (TokenId id : ids) {
        std::string delta = d.push(id);
        EXPECT_EQ(v4::text::utf8_lossy(delta), delta) << "delta not whole UTF-8 in " << g["name"];
        all += delta;
      }
      all += d.finish();
      EXPECT_EQ(all, t.decode(ids, skip)) << g["name"];
    }
  }
}

TEST(Detokenizer, HoldsSplitCharacterUntilComplete) {
  REQUIRE_TOKENIZER();
  // "🤖" is 4 bytes; byte-level tokens may carry them separately. Feed raw byte tokens.
  std::string robot = "\xF0\x9F\xA4\x96";
  std::vector<TokenId> byte_ids;
  for (unsigned char c : robot) {
    auto ids = tok_v3()->encode_ordinary(std::string(1, static_cast<char>(c)));
    // single invalid bytes are replaced before BPE; take the byte token by its bytes instead
    (void)ids;
  }
  for (TokenId id = 0; id < 256 && byte_ids.size() < 4; ++id) {}
  // find tokens whose bytes are exactly each byte
  for (unsigned char c : robot) {
    for (TokenId id = 0; id < 1000; ++id)
      if (tok_v3()->token_bytes(id) == std::string(1, static_cast<char>(c))) {
        byte_ids.push_back(id);
        break;
      }
  }
  ASSERT_EQ(byte_ids.size(), 4u);
  Detokenizer d(*tok_v3());
  EXPECT_EQ(d.push(byte_ids[0]), "");
  EXPECT_EQ(d.push(byte_ids[1]), "");
  EXPECT_EQ(d.push(byte_ids[2]), "");
  EXPECT_EQ(d.pending_bytes(), 3u);
  EXPECT_EQ(d.push(byte_ids[3]), robot);
  Detokenizer d2(*tok_v3());
  EXPECT_EQ(d2.push(byte_ids[0]), "");
  EXPECT_EQ(d2.finish(), "\xEF\xBF\xBD");  // incomplete at end -> U+FFFD
}

TEST(Utf8, LossyMatchesMaximalSubpart) {
  using v4::text::utf8_lossy;
  EXPECT_EQ(utf8_lossy("a\xff" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(utf8_lossy("\xe4\xbd"), "\xEF\xBF\xBD");
  EXPECT_EQ(utf8_lossy("\xe0\x80\xaf"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8_lossy("\xed\xa0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8_lossy("\xf0\x9f\x98" "x"), "\xEF\xBF\xBD" "x");
  EXPECT_EQ(v4::text::utf8_complete_prefix("ab\xf0\x9f\x98"), 2u);
  EXPECT_EQ(v4::text::utf8_complete_prefix("ab\xff"), 3u);
  EXPECT_EQ(v4::text::utf8_complete_prefix("ab\xe4\xbd"), 2u);
  EXPECT_EQ(v4::text::utf8_complete_prefix("\xe0\x80"), 2u);  // already invalid
}

TEST(Tokenizer, BadFilesGiveErrors) {
  auto r = Tokenizer::from_file("/nonexistent/dir/tokenizer.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("/nonexistent/dir/tokenizer.json"), std::string::npos);
  auto j = Tokenizer::from_json_text("{not json", "x.json");
  ASSERT_FALSE(j.ok());
  EXPECT_NE(j.status().message().find("x.json"), std::string::npos);
  auto u = Tokenizer::from_json_text(R"({"model":{"type":"Unigram","vocab":[]}})", "u.json");
  ASSERT_FALSE(u.ok());
  EXPECT_EQ(u.status().code(), v4::ErrorCode::kUnsupported);
}

TEST(Tokenizer, TinyTokenizerWithTemplateBos) {
  // A small hand-written tokenizer.json: merges "a b"->"ab", "ab c"->"abc"; template adds BOS.
  // (Mixed string/pair merges: HF needs one form per file; we accept both.)
  const char* js = R"({
    "added_tokens":[{"id":0,"content":"<s>","special":true,"normalized":false,"lstrip":false,"rstrip":false,"single_word":false}],
    "normalizer":null,
    "pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"use_regex":true},
    "post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],
                      "pair":[],"special_tokens":{"<s>":{"id":"<s>","ids":[0],"tokens":["<s>"]}}},
    "decoder":{"type":"ByteLevel"},
    "model":{"type":"BPE","vocab":{"<s>":0,"a":1,"b":2,"c":3,"ab":4,"abc":5,"Ġ":6},"merges":[["a","b"],"ab c"]}})";
  auto t = Tokenizer::from_json_text(js, "tiny");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->encode("abc"), (std::vector<TokenId>{5}));
  EXPECT_EQ(t->encode("abc", true), (std::vector<TokenId>{0, 5}));
  EXPECT_EQ(t->encode("ab<s>cab"), (std::vector<TokenId>{4, 0, 3, 4}));  // values from HF 0.23.3
  EXPECT_EQ(t->encode("ab c"), (std::vector<TokenId>{4, 6, 3}));
  EXPECT_EQ(t->decode(std::vector<TokenId>{0, 5, 6, 4}, true), "abc ab");
}

// The embedded default model's own tokenizer (models/default, trained with HF tokenizers) equals HF.
// The committed goldens record the tokenizer's sha256. After a retrain (sha differs) the test
// regenerates them with HF `tokenizers` (tools/gen_text_goldens.py --embedded) into a temp file;
// without Python `tokenizers` it skips. Commit refreshed goldens after a retrain.
TEST(Tokenizer, EmbeddedModelTokenizerEqualsHf) {
  std::string dir = std::string(V4_SOURCE_DIR) + "/models/default";
  std::string gpath = std::string(V4_SOURCE_DIR) + "/tests/data/text/embedded_tokenizer_goldens.jsonl";
  if (!std::ifstream(dir + "/tokenizer.json") || !std::ifstream(gpath)) GTEST_SKIP() << "no embedded tokenizer or goldens";
  auto t = Tokenizer::from_file(dir);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  auto sh = [](const std::string& cmd) {
    std::string out;
    if (FILE* p = popen(cmd.c_str(), "r")) {
      char buf[256];
      while (fgets(buf, sizeof(buf), p)) out += buf;
      if (pclose(p) != 0) return std::string();
    }
    return out;
  };
  std::string sha = sh("sha256sum " + dir + "/tokenizer.json").substr(0, 64);
  std::string line;
  {
    std::ifstream gf(gpath);
    std::getline(gf, line);
  }
  if (sha != nlohmann::json::parse(line)["meta"]["sha256"].get<std::string>()) {
    std::string tmp = ::testing::TempDir() + "/embedded_tokenizer_goldens.jsonl";
    if (sh("python3 " + std::string(V4_SOURCE_DIR) + "/tools/gen_text_goldens.py --embedded --out " + tmp +
           " 2>/dev/null && echo ok").empty())
      GTEST_SKIP() << "models/default/tokenizer.json changed and Python tokenizers is unavailable: "
                      "run python3 tools/gen_text_goldens.py --embedded";
    gpath = tmp;
  }
  std::ifstream gf(gpath);
  std::getline(gf, line);  // meta
  int n = 0;
  while (std::getline(gf, line)) {
    auto g = nlohmann::json::parse(line);
    std::string text = g.contains("bytes_b64") ? b64decode(g["bytes_b64"]) : g["text"].get<std::string>();
    auto want = g["ids"].get<std::vector<TokenId>>();
    EXPECT_EQ(t->encode(text), want) << g["name"];
    EXPECT_EQ(t->encode(text, true), g["ids_special"].get<std::vector<TokenId>>()) << g["name"];
    EXPECT_EQ(t->decode(want), g["decoded"].get<std::string>()) << g["name"];
    EXPECT_EQ(t->decode(want, true), g["decoded_skip"].get<std::string>()) << g["name"];
    ++n;
  }
  EXPECT_GE(n, 30);
}

TEST(Tokenizer, EmptyTokenizerIsSafe) {
  Tokenizer t;
  EXPECT_TRUE(t.encode("abc").empty());
  EXPECT_EQ(t.decode(std::vector<TokenId>{1, 2}), "");
  EXPECT_EQ(t.vocab_size(), 0u);
  EXPECT_FALSE(t.bos_id().has_value());
  EXPECT_FALSE(t.with_added_tokens({}).ok());
}

// Token ids in a tokenizer.json index the tables the loader sizes by the largest id. An id out
// of int32 (4294967295 became -1: a write before the table, heap corruption — `serve
// --tokenizer` aborted with "munmap_chunk(): invalid pointer"), a negative one ("vector::
// _M_default_append") or one far beyond the file's tokens (99999999: GBs allocated, minutes)
// is a one-line error naming the file and the entry; so is a post-processor id the vocabulary
// does not have (it would be put in front of every prompt).
TEST(Tokenizer, OutOfRangeIdsAreErrorsNotCrashes) {
  auto with = [](const std::string& vocab, const std::string& added, const std::string& post = "null") {
    return R"({"model":{"type":"BPE","vocab":)" + vocab + R"(,"merges":[]},"added_tokens":)" + added +
           R"(,"post_processor":)" + post + "}";
  };
  struct Case {
    std::string json, want;
  };
  const std::vector<Case> cases = {
      {with(R"({"a":0})", R"([{"id":4294967295,"content":"xyz"}])"), "added_tokens[0]"},
      {with(R"({"a":0})", R"([{"id":-5,"content":"xyz"}])"), "added_tokens[0]"},
      {with(R"({"a":0})", R"([{"id":99999999,"content":"xyz"}])"), "added_tokens[0]"},
      {with(R"({"a":0})", R"([{"id":"7","content":"xyz"}])"), "added_tokens[0]"},
      {with(R"({"a":0,"b":4294967301})", "[]"), "model.vocab['b']"},
      {with(R"({"a":0,"b":2000000000})", "[]"), "model.vocab['b']"},
      {with(R"({"a":0})", "[]",
            R"({"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"X","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],"pair":[],"special_tokens":{"X":{"id":"X","ids":[99999],"tokens":["X"]}}})"),
       "post_processor"},
      {with(R"({"a":0})", "[]",
            R"({"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"X","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],"pair":[],"special_tokens":{"X":{"id":"X","ids":[-7],"tokens":["X"]}}})"),
       "post_processor"},
  };
  for (const auto& c : cases) {
    auto t = Tokenizer::from_json_text(c.json, "bad.json");
    ASSERT_FALSE(t.ok()) << c.json;
    EXPECT_NE(t.status().message().find("bad.json"), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find(c.want), std::string::npos) << t.status().message();
    EXPECT_EQ(t.status().message().find("_M_"), std::string::npos) << t.status().message();
    EXPECT_EQ(t.status().message().find("bad_alloc"), std::string::npos) << t.status().message();
  }
  // Sparse but sane ids still load: added tokens just past the vocabulary, a gap of a few ids.
  auto ok = Tokenizer::from_json_text(with(R"({"a":0,"b":1})", R"([{"id":40,"content":"<x>","special":true}])"),
                                      "ok.json");
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->encode("<x>"), (std::vector<TokenId>{40}));
}

// tokenizer_config.json's bos_token / eos_token must be tokens of tokenizer.json: a string that is
// not one used to turn BOS off silently (every prompt served without it).
TEST(Tokenizer, ConfigBosAndEosMustBeTokens) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("v4-tokcfg-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(std::string(V4_SOURCE_DIR) + "/models/default/tokenizer.json", dir / "tokenizer.json",
                fs::copy_options::overwrite_existing);
  auto write_cfg = [&](const std::string& text) { std::ofstream(dir / "tokenizer_config.json") << text; };
  write_cfg(R"({"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": {"content": "<｜end▁of▁sentence｜>"}})");
  auto good = Tokenizer::from_file(dir.string());
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  EXPECT_EQ(good->bos_id(), good->token_to_id("<｜begin▁of▁sentence｜>"));
  EXPECT_TRUE(good->bos_id().has_value());
  write_cfg(R"({"bos_token": "<s>"})");
  auto bad = Tokenizer::from_file(dir.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bos_token \"<s>\" is not a token of"), std::string::npos)
      << bad.status().message();
  EXPECT_NE(bad.status().message().find("tokenizer_config.json"), std::string::npos);
  write_cfg(R"({"eos_token": {"content": "</s>\n"}})");
  auto bad_eos = Tokenizer::from_file(dir.string());
  ASSERT_FALSE(bad_eos.ok());
  EXPECT_NE(bad_eos.status().message().find("eos_token \"</s>\\n\""), std::string::npos)
      << bad_eos.status().message();
  fs::remove_all(dir);
}
