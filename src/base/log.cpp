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
}  // namespace v4
