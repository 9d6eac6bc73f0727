#include <cstdio>

#include "cli/command.h"

V4_REGISTER_COMMAND(version, "version", "print the version", [](CLI::App&) {
  return std::function<int()>([] {
    std::printf("v4serve 0.1.0\n");
    return 0;
  });
});
