// text::Tokenizer — Hugging Face `tokenizer.json` byte-level BPE (the DeepSeek V3/V4 kind), loaded
// unchanged. Semantics equal HF `tokenizers` (Rust) `Tokenizer::encode` / `decode`; see docs/text.md
// for the exact rules chosen (invalid UTF-8, added-token matching, post-processor).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace v4::text {

/// A vocabulary id (0 .. vocab_size()-1).
using TokenId = int32_t;

/// One entry of `tokenizer.json`'s `added_tokens` (same fields, same meaning as HF `AddedToken`).
/// Added tokens are matched in the raw text before pre-tokenization (leftmost, then longest), whether
/// or not they are `special`; `special` only matters for `decode(skip_special_tokens=true)`.
struct AddedToken {
  TokenId id = 0;
  std::string content;       ///< exact UTF-8 text of the token
  bool special = false;      ///< skipped by decode(skip_special_tokens=true)
  bool normalized = false;   ///< matched after the normalizer (2nd pass, HF order)
  bool lstrip = false;       ///< also swallows whitespace on its left
  bool rstrip = false;       ///< also swallows whitespace on its right
  bool single_word = false;  ///< only matches when not inside a word
};

/// Byte-level BPE tokenizer. Cheap to copy (shared immutable state); all methods are thread-safe.
/// A default-constructed Tokenizer is empty: encode/decode return nothing, vocab_size() is 0.
class Tokenizer {
 public:
  /// Loads `path`: a `tokenizer.json`, or a model directory containing one. BOS/EOS come from a
  /// `tokenizer_config.json` next to it (`bos_token`/`eos_token`), else from the well-known DeepSeek
  /// strings when present in the vocabulary. Errors: kNotFound / kIoError (file), kCorruptData
  /// (bad JSON, naming the field), kUnsupported (a model/normalizer/pre-tokenizer kind we don't do).
  static Result<Tokenizer> from_file(const std::string& path);

  /// Parses the text of a `tokenizer.json`; `source` names it in error messages.
  static Result<Tokenizer> from_json_text(std::string_view json_text, const std::string& source);

  /// Returns a copy whose added-token table is `tokens` (replacing entries with the same id or the
  /// same content, adding the rest). Vocabulary, merges and pre-tokenizer are shared. Errors:
  /// kInvalidArgument on an empty content.
  Result<Tokenizer> with_added_tokens(const std::vector<AddedToken>& tokens) const;

  /// The DeepSeek-V4 (preview / 0731) added-token table from chat-encoding.md §1: ids 0-2,
  /// placeholders 128000+N (N=0..799), 128800-128846, 129264-129270 and 129279. Use it with
  /// `with_added_tokens` when only a V3 tokenizer.json is at hand; a V4 model directory's own
  /// tokenizer.json is used as-is and needs nothing.
  static std::vector<AddedToken> dsv4_added_tokens();

  /// Encodes UTF-8 `text`. Invalid UTF-8 is first replaced with U+FFFD (maximal-subpart rule, as
  /// Rust `String::from_utf8_lossy` / Python `bytes.decode(errors="replace")`). Added tokens are split
  /// out first; the rest goes through normalizer, pre-tokenizer, BPE. `add_special_tokens` applies
  /// the post-processor (TemplateProcessing adds its special tokens; ByteLevel adds nothing — the
  /// DeepSeek files add no BOS).
  std::vector<TokenId> encode(std::string_view text, bool add_special_tokens = false) const;

  /// Encodes with added-token matching disabled: the whole text goes through BPE, so `<｜User｜>`
  /// typed by a user stays ordinary text (not what HF does; for guarding user text).
  std::vector<TokenId> encode_ordinary(std::string_view text) const;

  /// Decodes like HF `decode` with the ByteLevel decoder: bytes of all tokens concatenated, then
  /// invalid UTF-8 replaced with U+FFFD. Unknown ids are skipped.
  std::string decode(std::span<const TokenId> ids, bool skip_special_tokens = false) const;

  /// The raw bytes a token stands for (byte-level mapping undone; may be partial UTF-8). Empty for
  /// unknown ids.
  std::string token_bytes(TokenId id) const;

  /// The token's string as written in tokenizer.json (`Ġhello`), or nullopt for unknown ids.
  std::optional<std::string> id_to_token(TokenId id) const;
  /// The id of a token string as written in tokenizer.json (vocab or added), or nullopt.
  std::optional<TokenId> token_to_id(std::string_view token) const;

  /// max id + 1 over vocab and added tokens (129280 for V4 with the V4 table).
  size_t vocab_size() const;
  /// True for added tokens with `special: true`.
  bool is_special(TokenId id) const;
  /// True for any added token (special or not).
  bool is_added(TokenId id) const;
  std::optional<TokenId> bos_id() const;
  std::optional<TokenId> eos_id() const;
  /// The current added-token table, by id.
  std::vector<AddedToken> added_tokens() const;

  struct Impl;  // defined in tokenizer.cpp

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace v4::text
