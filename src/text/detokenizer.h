// text::Detokenizer — incremental (streaming) decoding of generated token ids to UTF-8 text.
#pragma once
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace v4::text {

/// Options for a Detokenizer.
struct DetokenizerOptions {
  /// Drop tokens marked `special` (BOS/EOS/pad/placeholders). Keep false on the output-parser path:
  /// `<think>`, `</think>`, `｜DSML｜` must reach the parser (chat-encoding.md §4.3 item 11).
  bool skip_special_tokens = false;
  /// With `skip_special_tokens`: more ids to drop (sorted), e.g. template control tokens such as
  /// `<｜User｜>` that the tokenizer file does not mark `special`. Null = none.
  std::shared_ptr<const std::vector<TokenId>> skip_ids;
};

/// Turns a stream of ids into text deltas. Never emits part of a UTF-8 character: bytes of a
/// character split across tokens are held until it is complete. A byte sequence that can no longer
/// become valid UTF-8 is emitted as U+FFFD (same rule as `Tokenizer::decode`), so the concatenation
/// of all deltas plus `finish()` equals `tokenizer.decode(all ids)`. Holds a copy of the tokenizer
/// (cheap); one instance per request; not thread-safe.
class Detokenizer {
 public:
  explicit Detokenizer(Tokenizer tokenizer, DetokenizerOptions options = {});

  /// Appends one token; returns the text that became complete (possibly empty).
  std::string push(TokenId id);
  /// Appends several tokens; returns the text that became complete.
  std::string push(std::span<const TokenId> ids);
  /// Ends the stream: returns held bytes (an incomplete trailing character becomes U+FFFD).
  std::string finish();
  /// Bytes held back waiting for the rest of a character (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  std::string drain(bool final);
  bool skipped(TokenId id) const;
  Tokenizer tok_;
  DetokenizerOptions opt_;
  std::string pending_;
};

/// Appends the UTF-8 of `bytes` to `out`, replacing invalid sequences with U+FFFD per the Unicode
/// "maximal subpart" practice (identical to Rust `from_utf8_lossy` and Python `errors="replace"`).
void append_utf8_lossy(std::string_view bytes, std::string& out);
/// `append_utf8_lossy` into a new string.
std::string utf8_lossy(std::string_view bytes);
/// Length of the longest prefix of `bytes` that does not end inside an incomplete (but so far
/// valid) UTF-8 sequence; i.e. bytes after it may still become a valid character.
size_t utf8_complete_prefix(std::string_view bytes);

}  // namespace v4::text
