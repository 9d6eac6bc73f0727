// UTF-8 helpers shared by the tokenizer, detokenizer and output parser.
#include <cstdint>
#include <string>
#include <string_view>

#include "text/detokenizer.h"

namespace v4::text {
namespace {

// For a lead byte: total sequence length (0 = invalid lead) and the allowed range of the 2nd byte
// (Unicode Table 3-7, well-formed UTF-8 byte sequences).
struct Lead {
  int len;
  uint8_t lo, hi;
};

inline Lead lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

}  // namespace

void append_utf8_lossy(std::string_view s, std::string& out) {
  const size_t n = s.size();
  size_t i = 0;
  size_t run_start = 0;  // start of a run of valid bytes not yet appended
  while (i < n) {
    const uint8_t b = static_cast<uint8_t>(s[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    const Lead L = lead_info(b);
    if (L.len == 0) {
      out.append(s.data() + run_start, i - run_start);
      out.append(kReplacement);
      ++i;
      run_start = i;
      continue;
    }
    size_t j = i + 1;
    bool bad = false;
    for (int k = 1; k < L.len; ++k, ++j) {
      if (j >= n) {
        bad = true;
        break;
      }
      const uint8_t c = static_cast<uint8_t>(s[j]);
      const uint8_t lo = k == 1 ? L.lo : 0x80, hi = k == 1 ? L.hi : 0xBF;
      if (c < lo || c > hi) {
        bad = true;
        break;
      }
    }
    if (bad) {  // maximal subpart [i, j) becomes one U+FFFD
      out.append(s.data() + run_start, i - run_start);
      out.append(kReplacement);
      i = j;
      run_start = i;
    } else {
      i = j;
    }
  }
  out.append(s.data() + run_start, n - run_start);
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  append_utf8_lossy(bytes, out);
  return out;
}

size_t utf8_complete_prefix(std::string_view s) {
  const size_t n = s.size();
  // A valid-but-incomplete sequence is at most 3 bytes long and starts at a lead byte.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t p = n - back;
    const uint8_t b = static_cast<uint8_t>(s[p]);
    if (b >= 0x80 && b < 0xC0) continue;  // continuation byte: keep looking for the lead
    const Lead L = lead_info(b);
    if (L.len <= 1 || static_cast<size_t>(L.len) <= back) return n;  // complete or invalid
    for (size_t k = 1; k < back; ++k) {
      const uint8_t c = static_cast<uint8_t>(s[p + k]);
      const uint8_t lo = k == 1 ? L.lo : 0x80, hi = k == 1 ? L.hi : 0xBF;
      if (c < lo || c > hi) return n;  // already invalid: nothing to wait for
    }
    return p;
  }
  return n;
}

}  // namespace v4::text
