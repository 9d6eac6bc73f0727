#include "base/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace v4 {
void set_log_level(const std::string& name) {
  static bool init = [] {
    auto logger = spdlog::stderr_color_mt("v4serve");
    spdlog::set_default_logger(logger);
    spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
    return true;
  }();
  (void)init;
  spdlog::set_level(spdlog::level::from_str(name));
}

std::string log_escape(std::string_view s, size_t max_chars) {
  std::string out;
  out.reserve(s.size());
  size_t chars = 0;
  for (size_t p = 0; p < s.size(); ++chars) {
    if (chars == max_chars) {
      out += "…";
      break;
    }
    const auto c = static_cast<unsigned char>(s[p]);
    const size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    bool ok = len > 0 && p + len <= s.size() && !(len == 2 && c < 0xC2);
    for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[p + k]) & 0xC0) == 0x80;
    if (!ok) {
      out += fmt::format("\\x{:02x}", c);
      ++p;
      continue;
    }
    uint32_t cp = c;
    if (len == 2) cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(s[p + 1]) & 0x3Fu);
    if (len == 3)
      cp = ((c & 0x0Fu) << 12) | ((static_cast<unsigned char>(s[p + 1]) & 0x3Fu) << 6) |
           (static_cast<unsigned char>(s[p + 2]) & 0x3Fu);
    if (cp == '\\') out += "\\\\";
    else if (cp == '\n') out += "\\n";
    else if (cp == '\r') out += "\\r";
    else if (cp == '\t') out += "\\t";
    else if (cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || cp == 0x2028 || cp == 0x2029)
      out += fmt::format("\\u{:04x}", cp);
    else out.append(s, p, len);
    p += len;
  }
  return out;
}
}  // namespace v4
