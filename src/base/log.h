// Logging: spdlog to stderr. Use V4_LOG_INFO(...) etc. with fmt-style formats.
#pragma once
#include <spdlog/spdlog.h>

#include <cstddef>
#include <string>
#include <string_view>

namespace v4 {
/// Sets the global level from a name ("debug", "info", "warn", "error"); unknown -> info.
void set_log_level(const std::string& name);

/// Client text for a log line (a path, a field name, an error message quoting a model name)
/// escaped so that it cannot end the line or drive a terminal: `\` and control characters
/// JSON-style (`\n`, `\u001b`), C1 codes and U+2028/U+2029 as `\uXXXX`, bytes that are not
/// UTF-8 as `\xNN`. At most `max_chars` characters (code points or stray bytes) of `s` are
/// kept; a cut adds "…".
std::string log_escape(std::string_view s, size_t max_chars = std::string_view::npos);
}  // namespace v4

#define V4_LOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define V4_LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define V4_LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define V4_LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
