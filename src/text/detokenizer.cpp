#include "text/detokenizer.h"

#include <algorithm>

namespace v4::text {

Detokenizer::Detokenizer(Tokenizer tokenizer, DetokenizerOptions options)
    : tok_(std::move(tokenizer)), opt_(options) {}

std::string Detokenizer::drain(bool final) {
  // Emit everything except a trailing sequence that may still become a valid character.
  size_t keep_from = final ? pending_.size() : utf8_complete_prefix(pending_);
  std::string out;
  append_utf8_lossy(std::string_view(pending_).substr(0, keep_from), out);
  pending_.erase(0, keep_from);
  return out;
}

bool Detokenizer::skipped(TokenId id) const {
  if (!opt_.skip_special_tokens) return false;
  if (tok_.is_special(id)) return true;
  return opt_.skip_ids && std::binary_search(opt_.skip_ids->begin(), opt_.skip_ids->end(), id);
}

std::string Detokenizer::push(TokenId id) {
  if (skipped(id)) return {};
  pending_ += tok_.token_bytes(id);
  return drain(false);
}

std::string Detokenizer::push(std::span<const TokenId> ids) {
  for (TokenId id : ids) {
    if (skipped(id)) continue;
    pending_ += tok_.token_bytes(id);
  }
  return drain(false);
}

std::string Detokenizer::finish() { return drain(true); }

}  // namespace v4::text
