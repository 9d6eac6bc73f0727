// Byte-level BPE tokenizer equal to HF `tokenizers` for tokenizer.json files of the DeepSeek V3/V4
// kind. Pipeline (HF order): added tokens split out (non-normalized pass, then normalized pass) ->
// normalizer (only none/empty Sequence supported) -> pre-tokenizer (Sequence of Split regexes +
// ByteLevel) -> BPE merges by rank -> post-processor. See docs/text.md.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/tokenizer.h"

#include <pcre2.h>

#include <algorithm>
#include <atomic>
#include <array>
#include <cctype>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "base/log.h"
#include "text/detokenizer.h"

namespace v4::text {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// ---- GPT-2 byte <-> unicode mapping -----------------------------------------------------------
struct ByteMap {
  std::array<std::string, 256> byte_to_utf8;  // byte -> UTF-8 of its printable stand-in char
  std::unordered_map<uint32_t, uint8_t> cp_to_byte;
  ByteMap() {
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      uint32_t cp = keep ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + extra++);
      std::string u;
      if (cp < 0x80) {
        u.push_back(static_cast<char>(cp));
      } else {
        u.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        u.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      byte_to_utf8[b] = u;
      cp_to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// Decodes one code point from valid UTF-8 at s[i]; advances i.
inline uint32_t next_cp(std::string_view s, size_t& i) {
  const uint8_t b = static_cast<uint8_t>(s[i]);
  if (b < 0x80) {
    ++i;
    return b;
  }
  int len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
  uint32_t cp = b & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  for (int k = 1; k < len && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  i += len;
  return cp;
}

// ByteLevel decoding of a token string: every char through the byte map, or (HF rule) the token's
// own UTF-8 bytes when any char is outside the map.
std::string bytelevel_decode_token(std::string_view tok) {
  const auto& m = byte_map().cp_to_byte;
  std::string out;
  size_t i = 0;
  while (i < tok.size()) {
    uint32_t cp = next_cp(tok, i);
    auto it = m.find(cp);
    if (it == m.end()) return std::string(tok);
    out.push_back(static_cast<char>(it->second));
  }
  return out;
}

// Unicode White_Space as Oniguruma's `\s` matches it (PCRE2's UCP `\s` lacks U+0085).
constexpr const char* kWs =
    "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

// Rewrites `\s`/`\S` (outside and `\s` inside classes) to explicit Oniguruma-equal classes.
std::string translate_pattern(std::string_view p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char d = p[i + 1];
      ++i;
      if (d == 's') {
        out += in_class ? std::string(kWs) : "[" + std::string(kWs) + "]";
      } else if (d == 'S' && !in_class) {
        out += "[^" + std::string(kWs) + "]";
      } else {
        out.push_back('\\');
        out.push_back(d);
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
      if (i + 1 < p.size() && p[i + 1] == ']') out.push_back(p[++i]);  // literal ']' first
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

// One compiled PCRE2 regex (UTF + UCP, JIT when available).
class Regex {
 public:
  static Result<std::shared_ptr<Regex>> compile(const std::string& pattern, bool literal) {
    auto r = std::shared_ptr<Regex>(new Regex());
    int err = 0;
    PCRE2_SIZE off = 0;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    std::string pat = literal ? pattern : translate_pattern(pattern);
    r->code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.data()), pat.size(), opts, &err, &off, nullptr);
    if (!r->code_) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(err, buf, sizeof(buf));
      return make_error(ErrorCode::kCorruptData, "regex '{}' at offset {}: {}", pattern, off,
                        reinterpret_cast<char*>(buf));
    }
    pcre2_jit_compile(r->code_, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
    return r;
  }
  ~Regex() {
    if (code_) pcre2_code_free(code_);
  }
  // Finds the next match in subject[start..]; returns false when none.
  bool find(std::string_view subject, size_t start, pcre2_match_data* md, pcre2_match_context* mc,
            size_t& ms, size_t& me) const {
    int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), start,
                         PCRE2_NO_UTF_CHECK, md, mc);
    if (rc < 0) return false;
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    ms = ov[0];
    me = ov[1];
    return true;
  }

 private:
  Regex() = default;
  pcre2_code* code_ = nullptr;
};

// Per-thread PCRE2 scratch (match data + a JIT stack large enough for long whitespace runs).
struct Scratch {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mc = nullptr;
  pcre2_jit_stack* js = nullptr;
  Scratch() {
    md = pcre2_match_data_create(16, nullptr);
    mc = pcre2_match_context_create(nullptr);
    js = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    if (js) pcre2_jit_stack_assign(mc, nullptr, js);
  }
  ~Scratch() {
    pcre2_match_data_free(md);
    pcre2_match_context_free(mc);
    if (js) pcre2_jit_stack_free(js);
  }
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreStep {
  enum Kind { kSplit, kByteLevel } kind;
  std::shared_ptr<Regex> regex;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool add_prefix_space = false;  // ByteLevel
  bool use_regex = false;         // ByteLevel (GPT-2 regex)
};

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Open-addressing map (left id, right id) -> (rank, merged id).
class MergeTable {
 public:
  void build(const std::vector<std::array<int32_t, 4>>& merges) {  // {a, b, rank, new}
    size_t cap = 1;
    while (cap < merges.size() * 2 + 16) cap <<= 1;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, {0, 0});
    mask_ = cap - 1;
    for (auto& m : merges) {
      uint64_t k = key(m[0], m[1]);
      size_t h = hash(k) & mask_;
      while (keys_[h] != kEmpty && keys_[h] != k) h = (h + 1) & mask_;
      if (keys_[h] == k) continue;  // first (lowest) rank wins, like HF
      keys_[h] = k;
      vals_[h] = {m[2], m[3]};
    }
  }
  // Returns rank (or -1) and sets merged id.
  inline int32_t find(int32_t a, int32_t b, int32_t& merged) const {
    if (keys_.empty()) return -1;
    uint64_t k = key(a, b);
    size_t h = hash(k) & mask_;
    while (true) {
      uint64_t kk = keys_[h];
      if (kk == k) {
        merged = vals_[h].second;
        return vals_[h].first;
      }
      if (kk == kEmpty) return -1;
      h = (h + 1) & mask_;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  std::vector<uint64_t> keys_;
  std::vector<std::pair<int32_t, int32_t>> vals_;
  size_t mask_ = 0;
};

// Trie over added-token contents for leftmost-longest matching.
class TokenTrie {
 public:
  void clear() {
    nodes_.assign(1, Node{});
    first_.fill(false);
  }
  void add(std::string_view s, int value) {
    if (s.empty()) return;
    first_[static_cast<uint8_t>(s[0])] = true;
    int n = 0;
    for (unsigned char c : s) {
      int nx = child(n, c);
      if (nx < 0) {
        nx = static_cast<int>(nodes_.size());
        nodes_.push_back(Node{});
        nodes_[n].kids.push_back({c, nx});
      }
      n = nx;
    }
    nodes_[n].value = value;
  }
  bool empty() const { return nodes_.size() <= 1; }
  // Longest token starting at s[i]; returns its value (or -1) and length.
  int longest_at(std::string_view s, size_t i, size_t& len) const {
    if (!first_[static_cast<uint8_t>(s[i])]) return -1;
    int n = 0, best = -1;
    for (size_t j = i; j < s.size(); ++j) {
      n = child(n, static_cast<unsigned char>(s[j]));
      if (n < 0) break;
      if (nodes_[n].value >= 0) {
        best = nodes_[n].value;
        len = j + 1 - i;
      }
    }
    return best;
  }
  bool may_start(unsigned char c) const { return first_[c]; }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int>> kids;
    int value = -1;
  };
  int child(int n, unsigned char c) const {
    for (auto& [k, v] : nodes_[n].kids)
      if (k == c) return v;
    return -1;
  }
  std::vector<Node> nodes_{1};
  std::array<bool, 256> first_{};
};

// Post-processor (only what `add_special_tokens=true` adds for a single sequence).
struct PostProcessor {
  std::vector<TokenId> prefix, suffix;  // TemplateProcessing/Bert/Roberta single
};

// Per-thread BPE caches (no locks): a few slots keyed by tokenizer uid, reused round-robin.
struct SvHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};
struct SvEq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
};
using BpeCache = std::unordered_map<std::string, std::vector<TokenId>, SvHash, SvEq>;

BpeCache& thread_cache(uint64_t uid) {
  struct Slot {
    uint64_t owner = 0;
    BpeCache map;
  };
  thread_local std::array<Slot, 4> slots;
  thread_local unsigned next = 0;
  for (auto& s : slots)
    if (s.owner == uid) return s.map;
  Slot& s = slots[next++ % slots.size()];
  s.owner = uid;
  s.map.clear();
  return s.map;
}

std::atomic<uint64_t> g_uid{1};

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    // fast ASCII skip, 8 bytes at a time
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= n) break;
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < n && static_cast<uint8_t>(s[j]) >= 0x80 && j - i < 64) ++j;
    std::string_view chunk = s.substr(i, j - i);
    // a chunk of non-ASCII bytes: valid iff lossy conversion leaves it unchanged
    if (utf8_lossy(chunk) != chunk) return false;
    i = j;
  }
  return true;
}

bool is_unicode_ws(uint32_t cp) {
  return (cp >= 9 && cp <= 13) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

}  // namespace

// ---- shared immutable state ------------------------------------------------------------------
struct Tokenizer::Impl {
  std::string source;
  std::unordered_map<std::string, TokenId> vocab;  // model vocab, token string -> id
  std::vector<std::string> id_to_str;              // token string by id ("" = none)
  std::vector<std::string> id_bytes;               // ByteLevel-decoded bytes by id
  std::vector<uint8_t> has_id;                     // 1 when the id exists
  std::array<TokenId, 256> byte_id{};              // initial BPE symbol of each byte (-1 = none)
  MergeTable merges;
  std::vector<PreStep> pre;
  PostProcessor post;
  std::vector<AddedToken> added;                   // sorted by id
  std::unordered_map<std::string, size_t> added_by_content;
  std::vector<uint8_t> special_flag, added_flag;   // by id
  TokenTrie trie_raw, trie_norm;                   // non-normalized / normalized added tokens
  std::optional<TokenId> bos, eos;
  size_t n_vocab = 0;

  uint64_t uid = 0;  // identifies this table set for the per-thread BPE caches

  void rebuild_added();
  void bpe(std::string_view piece, std::vector<TokenId>& out) const;
  void bpe_uncached(std::string_view piece, std::vector<TokenId>& out) const;
  void encode_text(std::string_view text, std::vector<TokenId>& out) const;
  void split_added(std::string_view text, const TokenTrie& trie, bool use_trie,
                   std::vector<std::pair<std::string_view, int>>& segs) const;
};

void Tokenizer::Impl::rebuild_added() {
  std::sort(added.begin(), added.end(), [](auto& a, auto& b) { return a.id < b.id; });
  added_by_content.clear();
  trie_raw.clear();
  trie_norm.clear();
  size_t max_id = n_vocab;
  for (auto& a : added) max_id = std::max(max_id, static_cast<size_t>(a.id) + 1);
  id_to_str.resize(max_id);
  id_bytes.resize(max_id);
  has_id.resize(max_id, 0);
  special_flag.assign(max_id, 0);
  added_flag.assign(max_id, 0);
  for (size_t i = 0; i < added.size(); ++i) {
    auto& a = added[i];
    added_by_content[a.content] = i;
    (a.normalized ? trie_norm : trie_raw).add(a.content, static_cast<int>(i));
    id_to_str[a.id] = a.content;
    id_bytes[a.id] = bytelevel_decode_token(a.content);
    has_id[a.id] = 1;
    special_flag[a.id] = a.special;
    added_flag[a.id] = 1;
  }
}

void Tokenizer::Impl::bpe_uncached(std::string_view piece, std::vector<TokenId>& out) const {
  // Symbols as a doubly linked list over the piece's bytes; repeatedly merge the lowest-rank
  // adjacent pair, leftmost first on ties (equal to HF's heap order by (rank, position)).
  const int n = static_cast<int>(piece.size());
  struct Sym {
    TokenId id;
    int prev, next;
  };
  thread_local std::vector<Sym> syms;
  syms.resize(n);
  for (int i = 0; i < n; ++i) syms[i] = {byte_id[static_cast<uint8_t>(piece[i])], i - 1, i + 1};
  if (n > 0) syms[n - 1].next = -1;
  if (n <= 64) {
    while (true) {
      int best_rank = INT32_MAX, best_pos = -1;
      TokenId best_new = -1;
      for (int i = 0; i != -1 && syms[i].next != -1; i = syms[i].next) {
        TokenId nw;
        int32_t r = merges.find(syms[i].id, syms[syms[i].next].id, nw);
        if (r >= 0 && r < best_rank) {
          best_rank = r;
          best_pos = i;
          best_new = nw;
        }
      }
      if (best_pos < 0) break;
      int j = syms[best_pos].next;
      syms[best_pos].id = best_new;
      syms[best_pos].next = syms[j].next;
      if (syms[j].next != -1) syms[syms[j].next].prev = best_pos;
    }
  } else {
    // Heap version for long pieces: entries (rank, pos, left id, right id) validated on pop.
    struct E {
      int32_t rank, pos;
      TokenId a, b, nw;
      bool operator>(const E& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::vector<E> heap;
    auto push = [&](int i) {
      if (i < 0 || syms[i].next == -1) return;
      TokenId nw;
      int32_t r = merges.find(syms[i].id, syms[syms[i].next].id, nw);
      if (r >= 0) {
        heap.push_back({r, i, syms[i].id, syms[syms[i].next].id, nw});
        std::push_heap(heap.begin(), heap.end(), std::greater<E>());
      }
    };
    std::vector<uint8_t> alive(n, 1);
    for (int i = 0; i < n - 1; ++i) push(i);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<E>());
      E e = heap.back();
      heap.pop_back();
      int i = e.pos;
      if (!alive[i] || syms[i].id != e.a || syms[i].next == -1 || syms[syms[i].next].id != e.b) continue;
      int j = syms[i].next;
      syms[i].id = e.nw;
      syms[i].next = syms[j].next;
      alive[j] = 0;
      if (syms[j].next != -1) syms[syms[j].next].prev = i;
      push(syms[i].prev);
      push(i);
    }
  }
  for (int i = 0; i != -1 && n > 0; i = syms[i].next)
    if (syms[i].id >= 0) out.push_back(syms[i].id);
}

void Tokenizer::Impl::bpe(std::string_view piece, std::vector<TokenId>& out) const {
  if (piece.size() == 1) {
    TokenId id = byte_id[static_cast<uint8_t>(piece[0])];
    if (id >= 0) out.push_back(id);
    return;
  }
  if (piece.size() > 256) {
    bpe_uncached(piece, out);
    return;
  }
  BpeCache& cache = thread_cache(uid);
  auto it = cache.find(piece);
  if (it != cache.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  size_t start = out.size();
  bpe_uncached(piece, out);
  if (cache.size() > 65536) cache.clear();  // bound memory (~10 MB per slot)
  cache.emplace(std::string(piece), std::vector<TokenId>(out.begin() + start, out.end()));
}

void Tokenizer::Impl::encode_text(std::string_view text, std::vector<TokenId>& out) const {
  if (text.empty()) return;
  Scratch& sc = scratch();
  // Pre-tokenize: each step maps a list of pieces to a new list (pieces are owned strings only
  // when ByteLevel add_prefix_space prepends a space; otherwise views into `text`).
  std::deque<std::string> owned;  // stable addresses for prefixed pieces
  std::vector<std::string_view> pieces{text}, next;
  for (const PreStep& st : pre) {
    if (st.kind == PreStep::kByteLevel) {
      if (!st.add_prefix_space && !st.use_regex) continue;
      next.clear();
      for (auto p : pieces) {
        std::string_view q = p;
        if (st.add_prefix_space && (q.empty() || q[0] != ' ')) {
          owned.push_back(" " + std::string(q));
          q = owned.back();
        }
        if (!st.use_regex) {
          next.push_back(q);
          continue;
        }
        static const auto gpt2 = Regex::compile(kGpt2Pattern, false);
        size_t pos = 0, ms, me;
        while (pos < q.size() && gpt2.value()->find(q, pos, sc.md, sc.mc, ms, me)) {
          if (ms > pos) next.push_back(q.substr(pos, ms - pos));
          if (me > ms) next.push_back(q.substr(ms, me - ms));
          pos = me > ms ? me : ms + 1;
          if (me == ms) break;
        }
        if (pos < q.size()) next.push_back(q.substr(pos));
      }
      pieces.swap(next);
      continue;
    }
    next.clear();
    for (auto p : pieces) {
      size_t pos = 0, ms, me;
      std::string_view pending;  // for MergedWithNext
      size_t last_end = 0;
      std::vector<std::pair<size_t, size_t>> matches;
      while (pos <= p.size() && st.regex->find(p, pos, sc.md, sc.mc, ms, me)) {
        if (me == ms) {  // empty match: step one character forward
          if (ms >= p.size()) break;
          size_t k = ms;
          next_cp(p, k);
          pos = k;
          continue;
        }
        matches.push_back({ms, me});
        pos = me;
      }
      (void)pending;
      // Build (offsets, is_match) in order, then apply the behavior (HF SplitDelimiterBehavior).
      std::vector<std::tuple<size_t, size_t, bool>> parts;
      last_end = 0;
      for (auto [s, e] : matches) {
        if (s > last_end) parts.push_back({last_end, s, false});
        parts.push_back({s, e, true});
        last_end = e;
      }
      if (last_end < p.size()) parts.push_back({last_end, p.size(), false});
      switch (st.behavior) {
        case SplitBehavior::kIsolated:
          for (auto [s, e, m] : parts) next.push_back(p.substr(s, e - s));
          break;
        case SplitBehavior::kRemoved:
          for (auto [s, e, m] : parts)
            if (!m) next.push_back(p.substr(s, e - s));
          break;
        case SplitBehavior::kMergedWithPrevious: {
          size_t start = 0;
          bool have = false;
          for (auto [s, e, m] : parts) {
            if (m) {
              next.push_back(p.substr(start, e - start));
              start = e;
              have = false;
            } else {
              start = have ? start : s;
              have = true;
            }
          }
          if (have) next.push_back(p.substr(start));
          break;
        }
        case SplitBehavior::kMergedWithNext: {
          size_t start = 0;
          bool have = false;
          for (auto [s, e, m] : parts) {
            if (m) {
              if (have) next.push_back(p.substr(start, s - start));
              start = s;
              have = true;
            } else if (!have) {
              start = s;
              have = true;
            }
          }
          if (have) next.push_back(p.substr(start));
          break;
        }
        case SplitBehavior::kContiguous: {
          size_t i = 0;
          while (i < parts.size()) {
            auto [s, e, m] = parts[i];
            size_t j = i + 1;
            size_t end = e;
            while (m && j < parts.size() && std::get<2>(parts[j]) && std::get<0>(parts[j]) == end) {
              end = std::get<1>(parts[j]);
              ++j;
            }
            next.push_back(p.substr(s, end - s));
            i = j;
          }
          break;
        }
      }
    }
    pieces.swap(next);
  }
  for (auto p : pieces)
    if (!p.empty()) bpe(p, out);
}

void Tokenizer::Impl::split_added(std::string_view text, const TokenTrie& trie, bool use_trie,
                                  std::vector<std::pair<std::string_view, int>>& segs) const {
  // segs: (text, added index or -1). Leftmost match wins; at one position the longest.
  if (!use_trie || trie.empty()) {
    segs.push_back({text, -1});
    return;
  }
  size_t gap = 0, i = 0;
  while (i < text.size()) {
    size_t len = 0;
    int v = trie.may_start(static_cast<unsigned char>(text[i])) ? trie.longest_at(text, i, len) : -1;
    if (v < 0) {
      ++i;
      continue;
    }
    const AddedToken& a = added[v];
    size_t s = i, e = i + len;
    if (a.single_word) {
      auto word = [](unsigned char c) { return std::isalnum(c) || c == '_' || c >= 0x80; };
      bool before = s > 0 && word(static_cast<unsigned char>(text[s - 1]));
      bool after = e < text.size() && word(static_cast<unsigned char>(text[e]));
      if (before || after) {
        ++i;
        continue;
      }
    }
    if (a.lstrip) {
      while (s > gap) {
        // step back over one whitespace code point
        size_t k = s - 1;
        while (k > gap && (static_cast<uint8_t>(text[k]) & 0xC0) == 0x80) --k;
        size_t kk = k;
        if (!is_unicode_ws(next_cp(text, kk))) break;
        s = k;
      }
    }
    if (a.rstrip) {
      while (e < text.size()) {
        size_t kk = e;
        if (!is_unicode_ws(next_cp(text, kk))) break;
        e = kk;
      }
    }
    if (s > gap) segs.push_back({text.substr(gap, s - gap), -1});
    segs.push_back({text.substr(s, e - s), v});
    gap = i = e;
  }
  if (gap < text.size()) segs.push_back({text.substr(gap), -1});
}

// ---- loading ---------------------------------------------------------------------------------
namespace {

Result<std::string> read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return make_error(ErrorCode::kNotFound, "cannot open {}", p.string());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::optional<std::string> token_content(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return std::nullopt;
}

Status parse_pre(const json& j, const std::string& src, std::vector<PreStep>& out) {
  if (j.is_null()) return Status::Ok();
  std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (auto& s : j.at("pretokenizers")) V4_RETURN_IF_ERROR(parse_pre(s, src, out));
    return Status::Ok();
  }
  if (type == "Split") {
    PreStep st;
    st.kind = PreStep::kSplit;
    const json& pat = j.at("pattern");
    bool literal = pat.contains("String");
    std::string p = literal ? pat["String"].get<std::string>() : pat.at("Regex").get<std::string>();
    auto r = Regex::compile(p, literal);
    if (!r.ok()) return make_error(ErrorCode::kCorruptData, "{}: pre_tokenizer Split: {}", src, r.status().message());
    st.regex = *r;
    std::string b = j.value("behavior", "Isolated");
    if (b == "Isolated") st.behavior = SplitBehavior::kIsolated;
    else if (b == "Removed") st.behavior = SplitBehavior::kRemoved;
    else if (b == "MergedWithPrevious") st.behavior = SplitBehavior::kMergedWithPrevious;
    else if (b == "MergedWithNext") st.behavior = SplitBehavior::kMergedWithNext;
    else if (b == "Contiguous") st.behavior = SplitBehavior::kContiguous;
    else return make_error(ErrorCode::kUnsupported, "{}: pre_tokenizer Split behavior '{}'", src, b);
    if (j.value("invert", false))
      return make_error(ErrorCode::kUnsupported, "{}: pre_tokenizer Split with invert=true", src);
    out.push_back(st);
    return Status::Ok();
  }
  if (type == "ByteLevel") {
    PreStep st;
    st.kind = PreStep::kByteLevel;
    st.add_prefix_space = j.value("add_prefix_space", false);
    st.use_regex = j.value("use_regex", true);
    out.push_back(st);
    return Status::Ok();
  }
  return make_error(ErrorCode::kUnsupported, "{}: pre_tokenizer type '{}' is not supported", src, type);
}

Status parse_post(const json& j, const std::string& src, const Tokenizer::Impl& im, PostProcessor& pp) {
  if (j.is_null()) return Status::Ok();
  std::string type = j.value("type", "");
  if (type == "ByteLevel") return Status::Ok();
  if (type == "Sequence") {
    for (auto& p : j.at("processors")) V4_RETURN_IF_ERROR(parse_post(p, src, im, pp));
    return Status::Ok();
  }
  if (type == "TemplateProcessing") {
    pp.prefix.clear();
    pp.suffix.clear();
    bool seen_a = false;
    for (auto& piece : j.at("single")) {
      if (piece.contains("Sequence")) {
        seen_a = true;
        continue;
      }
      std::string name = piece.at("SpecialToken").at("id").get<std::string>();
      const json& st = j.at("special_tokens").at(name);
      for (auto& id : st.at("ids")) (seen_a ? pp.suffix : pp.prefix).push_back(id.get<TokenId>());
    }
    return Status::Ok();
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    pp.prefix = {j.at("cls").at(1).get<TokenId>()};
    pp.suffix = {j.at("sep").at(1).get<TokenId>()};
    return Status::Ok();
  }
  return make_error(ErrorCode::kUnsupported, "{}: post_processor type '{}' is not supported", src, type);
}

}  // namespace

Result<Tokenizer> Tokenizer::from_json_text(std::string_view text, const std::string& src) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kCorruptData, "{}: not valid JSON: {}", src, e.what());
  }
  auto im = std::make_shared<Impl>();
  im->uid = g_uid++;
  im->source = src;
  try {
    const json& model = j.at("model");
    std::string mtype = model.value("type", "BPE");
    if (mtype != "BPE") return make_error(ErrorCode::kUnsupported, "{}: model.type '{}' (only BPE)", src, mtype);
    if (model.value("byte_fallback", false))
      return make_error(ErrorCode::kUnsupported, "{}: model.byte_fallback=true is not supported", src);
    if (model.contains("continuing_subword_prefix") && !model["continuing_subword_prefix"].is_null() &&
        !model["continuing_subword_prefix"].get<std::string>().empty())
      return make_error(ErrorCode::kUnsupported, "{}: model.continuing_subword_prefix", src);
    if (model.contains("end_of_word_suffix") && !model["end_of_word_suffix"].is_null() &&
        !model["end_of_word_suffix"].get<std::string>().empty())
      return make_error(ErrorCode::kUnsupported, "{}: model.end_of_word_suffix", src);
    if (model.value("ignore_merges", false))
      return make_error(ErrorCode::kUnsupported, "{}: model.ignore_merges=true", src);
    const json& vocab = model.at("vocab");
    if (!vocab.is_object()) return make_error(ErrorCode::kCorruptData, "{}: model.vocab is not an object", src);
    // Ids index tables sized by the largest id, so they are checked before any is used: an
    // integer in [0, id_limit). A tokenizer's ids are dense (the model's embedding has a row for
    // each), so the limit is twice the tokens the file defines plus 65,536 — a file cannot make
    // the loader allocate GBs for one absurd id — and within int32 (TokenId).
    const json& added_json = j.contains("added_tokens") ? j["added_tokens"] : json::array();
    const int64_t n_defined = int64_t(vocab.size()) + (added_json.is_array() ? int64_t(added_json.size()) : 0);
    const int64_t id_limit = std::min<int64_t>(std::numeric_limits<TokenId>::max(), 2 * n_defined + 65536);
    auto bad_id = [&](const json& v, const std::string& where) -> std::optional<Status> {
      if (v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < id_limit &&
          !(v.is_number_unsigned() && v.get<uint64_t>() >= uint64_t(id_limit)))
        return std::nullopt;
      return make_error(ErrorCode::kCorruptData,
                        "{}: {} is {}, not a token id: ids must be integers in [0, {}) (this file "
                        "defines {} tokens; ids are dense)",
                        src, where, v.dump(), id_limit, n_defined);
    };
    size_t max_id = 0;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (auto e = bad_id(it.value(), "model.vocab['" + it.key() + "']")) return *e;
      max_id = std::max(max_id, static_cast<size_t>(it.value().get<int64_t>()) + 1);
    }
    im->n_vocab = max_id;
    im->id_to_str.resize(max_id);
    im->id_bytes.resize(max_id);
    im->has_id.assign(max_id, 0);
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      TokenId id = it.value().get<TokenId>();
      im->vocab.emplace(it.key(), id);
      im->id_to_str[id] = it.key();
      im->id_bytes[id] = bytelevel_decode_token(it.key());
      im->has_id[id] = 1;
    }
    const auto& bm = byte_map().byte_to_utf8;
    for (int b = 0; b < 256; ++b) {
      auto it = im->vocab.find(bm[b]);
      im->byte_id[b] = it == im->vocab.end() ? -1 : it->second;
    }
    std::vector<std::array<int32_t, 4>> merges;
    const json& mj = model.at("merges");
    merges.reserve(mj.size());
    int32_t rank = 0;
    for (auto& m : mj) {
      std::string a, b;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        size_t sp = s.find(' ', 1);
        if (sp == std::string::npos)
          return make_error(ErrorCode::kCorruptData, "{}: model.merges[{}] '{}' has no space", src, rank, s);
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2) {
        a = m[0].get<std::string>();
        b = m[1].get<std::string>();
      } else {
        return make_error(ErrorCode::kCorruptData, "{}: model.merges[{}] is not a pair", src, rank);
      }
      auto ia = im->vocab.find(a), ib = im->vocab.find(b), ic = im->vocab.find(a + b);
      if (ia == im->vocab.end() || ib == im->vocab.end() || ic == im->vocab.end())
        return make_error(ErrorCode::kCorruptData, "{}: model.merges[{}] uses a token missing from vocab", src, rank);
      merges.push_back({ia->second, ib->second, rank, ic->second});
      ++rank;
    }
    im->merges.build(merges);

    const json& norm = j.value("normalizer", json());
    if (!norm.is_null()) {
      bool ok = norm.value("type", "") == "Sequence" && norm.value("normalizers", json::array()).empty();
      if (!ok)
        return make_error(ErrorCode::kUnsupported, "{}: normalizer '{}' is not supported (only none)", src,
                          norm.value("type", "?"));
    }
    V4_RETURN_IF_ERROR(parse_pre(j.value("pre_tokenizer", json()), src, im->pre));
    const json& dec = j.value("decoder", json());
    if (!dec.is_null() && dec.value("type", "") != "ByteLevel")
      return make_error(ErrorCode::kUnsupported, "{}: decoder '{}' is not supported (only ByteLevel)", src,
                        dec.value("type", "?"));
    if (!added_json.is_array())
      return make_error(ErrorCode::kCorruptData, "{}: added_tokens is not an array", src);
    for (size_t ai = 0; ai < added_json.size(); ++ai) {
      const json& a = added_json[ai];
      if (!a.is_object() || !a.contains("id"))
        return make_error(ErrorCode::kCorruptData, "{}: added_tokens[{}] is not an object with an 'id'", src, ai);
      if (auto e = bad_id(a["id"], fmt::format("added_tokens[{}].id", ai))) return *e;
      AddedToken t;
      t.id = a.at("id").get<TokenId>();
      t.content = a.at("content").get<std::string>();
      t.special = a.value("special", false);
      t.normalized = a.value("normalized", !t.special);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      t.single_word = a.value("single_word", false);
      if (t.content.empty()) return make_error(ErrorCode::kCorruptData, "{}: added_tokens id {} has empty content", src, t.id);
      im->added.push_back(std::move(t));
    }
    im->rebuild_added();
    V4_RETURN_IF_ERROR(parse_post(j.value("post_processor", json()), src, *im, im->post));
    // The post-processor's ids are put around every encoded prompt: each must be a token here.
    for (const auto* ids : {&im->post.prefix, &im->post.suffix})
      for (TokenId id : *ids)
        if (id < 0 || size_t(id) >= im->has_id.size() || !im->has_id[size_t(id)])
          return make_error(ErrorCode::kCorruptData,
                            "{}: post_processor adds token id {}, which is not a token of this file", src, id);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kCorruptData, "{}: malformed tokenizer.json: {}", src, e.what());
  }
  // Default BOS/EOS: DeepSeek strings when present (tokenizer_config.json may override).
  Tokenizer t;
  t.impl_ = im;
  im->bos = t.token_to_id("<｜begin▁of▁sentence｜>");
  im->eos = t.token_to_id("<｜end▁of▁sentence｜>");
  return t;
}

Result<Tokenizer> Tokenizer::from_file(const std::string& path) {
  fs::path p(path);
  std::error_code ec;
  if (fs::is_directory(p, ec)) p /= "tokenizer.json";
  if (!fs::exists(p, ec)) return make_error(ErrorCode::kNotFound, "tokenizer file not found: {}", p.string());
  V4_ASSIGN_OR_RETURN(std::string text, read_file(p));
  V4_ASSIGN_OR_RETURN(Tokenizer t, from_json_text(text, p.string()));
  fs::path cfg = p.parent_path() / "tokenizer_config.json";
  if (fs::exists(cfg, ec)) {
    auto ctext = read_file(cfg);
    if (ctext.ok()) {
      try {
        json c = json::parse(*ctext);
        auto im = std::const_pointer_cast<Impl>(t.impl_);
        // A BOS / EOS string that is not a token of tokenizer.json would silently serve every
        // prompt without its BOS (or never stop at EOS): refuse it, naming the field.
        for (const char* field : {"bos_token", "eos_token"}) {
          if (!c.contains(field)) continue;
          auto s = token_content(c[field]);
          if (!s) continue;
          auto id = t.token_to_id(*s);
          if (!id)
            return make_error(ErrorCode::kInvalidArgument,
                              "{}: {} \"{}\" is not a token of {}", cfg.string(), field, log_escape(*s, 64),
                              p.string());
          (std::string_view(field) == "bos_token" ? im->bos : im->eos) = id;
        }
      } catch (const json::exception& e) {
        return make_error(ErrorCode::kCorruptData, "{}: not valid JSON: {}", cfg.string(), e.what());
      }
    }
  }
  return t;
}

Result<Tokenizer> Tokenizer::with_added_tokens(const std::vector<AddedToken>& tokens) const {
  if (!impl_) return make_error(ErrorCode::kInvalidArgument, "with_added_tokens on an empty Tokenizer");
  auto im = std::make_shared<Impl>();
  im->uid = g_uid++;
  const Impl& o = *impl_;
  im->source = o.source;
  im->vocab = o.vocab;
  im->n_vocab = o.n_vocab;
  im->id_to_str.assign(o.id_to_str.begin(), o.id_to_str.begin() + o.n_vocab);
  im->id_bytes.assign(o.id_bytes.begin(), o.id_bytes.begin() + o.n_vocab);
  im->has_id.assign(o.has_id.begin(), o.has_id.begin() + o.n_vocab);
  im->byte_id = o.byte_id;
  im->merges = o.merges;
  im->pre = o.pre;
  im->post = o.post;
  std::vector<AddedToken> merged;
  for (auto& a : o.added) {
    bool replaced = std::any_of(tokens.begin(), tokens.end(),
                                [&](const AddedToken& t) { return t.id == a.id || t.content == a.content; });
    if (!replaced) merged.push_back(a);
  }
  for (auto& t : tokens) {
    if (t.content.empty()) return make_error(ErrorCode::kInvalidArgument, "added token id {} has empty content", t.id);
    if (t.id < 0) return make_error(ErrorCode::kInvalidArgument, "added token '{}' has negative id", t.content);
    merged.push_back(t);
  }
  im->added = std::move(merged);
  im->rebuild_added();
  Tokenizer out;
  out.impl_ = im;
  im->bos = o.bos ? o.bos : out.token_to_id("<｜begin▁of▁sentence｜>");
  im->eos = o.eos ? o.eos : out.token_to_id("<｜end▁of▁sentence｜>");
  return out;
}

std::vector<AddedToken> Tokenizer::dsv4_added_tokens() {
  std::vector<AddedToken> v;
  auto add = [&](TokenId id, std::string s, bool special, bool normalized) {
    v.push_back(AddedToken{id, std::move(s), special, normalized, false, false, false});
  };
  add(0, "<｜begin▁of▁sentence｜>", true, false);
  add(1, "<｜end▁of▁sentence｜>", true, false);
  add(2, "<｜▁pad▁｜>", true, false);
  for (int n = 0; n <= 799; ++n) add(128000 + n, "<｜place▁holder▁no▁" + std::to_string(n) + "｜>", true, false);
  const char* names[] = {
      "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>", "<｜User｜>", "<｜Assistant｜>", "<|EOT|>",
      "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
      "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>",
      "<｜tool▁sep｜>", "<｜begin▁of▁repo▁name｜>", "<｜end▁of▁repo▁name｜>", "<｜begin▁of▁file▁name｜>",
      "<｜end▁of▁file▁name｜>", "<｜begin▁of▁file｜>", "<｜end▁of▁file｜>", "<think>", "</think>",
      "<｜place▁holder▁for▁copy｜>", "<｜place▁holder▁for▁pointer▁replace｜>", "｜DSML｜", "<｜begin▁sys｜>",
      "<｜end▁sys｜>", "<｜latest_reminder｜>", "<｜action｜>", "<｜query｜>", "<｜authority｜>", "<｜domain｜>",
      "<｜task｜>", "<｜political｜>", "<｜entity｜>", "<｜title｜>", "<｜safety｜>", "<｜answer｜>",
      "<｜search｜>", "<dsml:", "</dsml:", "<｜search▁begin｜>", "<｜search▁end｜>", "<｜extracted_url｜>",
      "<｜read_url｜>", "<｜end_of_query｜>"};
  TokenId id = 128800;
  for (const char* s : names) {
    add(id, s, id == 128805, true);  // V3 flags: only <|EOT|> is special in this range
    ++id;
  }
  const std::pair<TokenId, const char*> mm[] = {{129264, "<｜image2｜>"}, {129265, "<｜/table>｜"},
                                                {129266, "<｜table｜>"},   {129267, "<｜/td｜>"},
                                                {129268, "<｜td｜>"},      {129269, "<｜/tr｜>"},
                                                {129270, "<｜tr｜>"},      {129279, "<｜image｜>"}};
  for (auto& [i, s] : mm) add(i, s, true, false);
  return v;
}

// ---- encode / decode --------------------------------------------------------------------------
std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  if (!impl_) return {};
  const Impl& im = *impl_;
  std::string clean;
  std::string_view t = text;
  if (utf8_complete_prefix(text) != text.size() || !is_valid_utf8(text)) {
    clean = utf8_lossy(text);
    t = clean;
  }
  std::vector<TokenId> out;
  out.reserve(t.size() / 3 + 4);
  if (add_special_tokens) out.insert(out.end(), im.post.prefix.begin(), im.post.prefix.end());
  std::vector<std::pair<std::string_view, int>> pass1, pass2;
  im.split_added(t, im.trie_raw, true, pass1);
  for (auto& [seg, idx] : pass1) {
    if (idx >= 0) {
      out.push_back(im.added[idx].id);
      continue;
    }
    pass2.clear();
    im.split_added(seg, im.trie_norm, true, pass2);
    for (auto& [s2, i2] : pass2) {
      if (i2 >= 0) out.push_back(im.added[i2].id);
      else im.encode_text(s2, out);
    }
  }
  if (add_special_tokens) out.insert(out.end(), im.post.suffix.begin(), im.post.suffix.end());
  return out;
}

std::vector<TokenId> Tokenizer::encode_ordinary(std::string_view text) const {
  if (!impl_) return {};
  std::vector<TokenId> out;
  if (is_valid_utf8(text)) {
    impl_->encode_text(text, out);
  } else {
    std::string clean = utf8_lossy(text);
    impl_->encode_text(clean, out);
  }
  return out;
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special_tokens) const {
  if (!impl_) return {};
  const Impl& im = *impl_;
  std::string bytes;
  for (TokenId id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= im.has_id.size() || !im.has_id[id]) continue;
    if (skip_special_tokens && im.special_flag[id]) continue;
    bytes += im.id_bytes[id];
  }
  return utf8_lossy(bytes);
}

std::string Tokenizer::token_bytes(TokenId id) const {
  if (!impl_) return {};
  const Impl& im = *impl_;
  if (id < 0 || static_cast<size_t>(id) >= im.has_id.size() || !im.has_id[id]) return {};
  return im.id_bytes[id];
}

std::optional<std::string> Tokenizer::id_to_token(TokenId id) const {
  if (!impl_) return std::nullopt;
  const Impl& im = *impl_;
  if (id < 0 || static_cast<size_t>(id) >= im.has_id.size() || !im.has_id[id]) return std::nullopt;
  return im.id_to_str[id];
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  if (!impl_) return std::nullopt;
  const Impl& im = *impl_;
  std::string k(token);
  if (auto it = im.added_by_content.find(k); it != im.added_by_content.end()) return im.added[it->second].id;
  if (auto it = im.vocab.find(k); it != im.vocab.end()) return it->second;
  return std::nullopt;
}

size_t Tokenizer::vocab_size() const { return impl_ ? impl_->has_id.size() : 0; }
bool Tokenizer::is_special(TokenId id) const {
  return impl_ && id >= 0 && static_cast<size_t>(id) < impl_->special_flag.size() && impl_->special_flag[id];
}
bool Tokenizer::is_added(TokenId id) const {
  return impl_ && id >= 0 && static_cast<size_t>(id) < impl_->added_flag.size() && impl_->added_flag[id];
}
std::optional<TokenId> Tokenizer::bos_id() const { return impl_ ? impl_->bos : std::nullopt; }
std::optional<TokenId> Tokenizer::eos_id() const { return impl_ ? impl_->eos : std::nullopt; }
std::vector<AddedToken> Tokenizer::added_tokens() const { return impl_ ? impl_->added : std::vector<AddedToken>{}; }

}  // namespace v4::text
