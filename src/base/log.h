// Logging: spdlog to stderr. Use V4_LOG_INFO(...) etc. with fmt-style formats.
#pragma once
#include <spdlog/spdlog.h>

namespace v4 {
/// Sets the global level from a name ("debug", "info", "warn", "error"); unknown -> info.
void set_log_level(const std::string& name);
}  // namespace v4

#define V4_LOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define V4_LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define V4_LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define V4_LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
