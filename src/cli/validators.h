// Range checks for numeric CLI flags. CLI11's own (CLI::Range, PositiveNumber, NonNegativeNumber)
// print "Value -1 not in range 0.000000 to 1.797...e308" even for integer flags; these print
// what the flag accepts and what it got, after CLI11's "--flag: " prefix:
//   --num-layers: must be >= 1 (got 0)
//   --port: must be in [0, 65535] (got 70000)
//   --mem-fraction: must be in (0, 1] (got 0)
//   --header-timeout: must be > 0 (got 0)
//   --steps: must be an integer (got 'ten')
// They run on the argument text before CLI11 converts it, so they also reject text that is not
// a number of the right kind (integers: decimal, 0x hex or 0 octal as CLI11 reads them; numbers:
// finite decimal floating point).
#pragma once
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#include <fmt/format.h>

namespace v4::cli {

namespace detail {

/// Parses an integer the way CLI11 does (strtoll, base 0, the whole text). false: not an integer
/// or outside int64 (then `*overflow` says which).
inline bool parse_int(const std::string& s, int64_t* v, bool* overflow) {
  *overflow = false;
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(s.c_str(), &end, 0);
  if (end != s.c_str() + s.size()) return false;
  if (errno == ERANGE) {
    *overflow = true;
    return false;
  }
  *v = int64_t(x);
  return true;
}

/// Parses a finite number (strtod, the whole text).
inline bool parse_number(const std::string& s, double* v) {
  if (s.empty()) return false;
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(x)) return false;
  *v = x;
  return true;
}

inline std::string show(double x) { return fmt::format("{}", x); }

}  // namespace detail

/// CLI11 check: an integer in [lo, hi]. Message "must be in [lo, hi] (got v)"; text that is no
/// integer (or does not fit in int64): "must be an integer (got 'text')".
inline CLI::Validator int_range(int64_t lo, int64_t hi, bool show_as_at_least = false) {
  const std::string want = fmt::format("must be in [{}, {}]", lo, hi);
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        int64_t v = 0;
        bool overflow = false;
        if (!detail::parse_int(s, &v, &overflow))
          return overflow ? fmt::format("must be <= {} (got {})", hi, s)
                          : fmt::format("must be an integer (got '{}')", s);
        if (show_as_at_least && v < lo) return fmt::format("must be >= {} (got {})", lo, v);
        if (show_as_at_least && v > hi) return fmt::format("must be <= {} (got {})", hi, v);
        if (v < lo || v > hi) return fmt::format("{} (got {})", want, v);
        return std::string();
      },
      show_as_at_least ? fmt::format(">= {}", lo) : fmt::format("in [{}, {}]", lo, hi));
}

/// CLI11 check: an integer >= lo (and <= `hi`, the largest value the option's type holds —
/// pass INT32_MAX for an int option). Messages "must be >= lo (got v)", "must be <= hi (got v)".
inline CLI::Validator int_at_least(int64_t lo,
                                   int64_t hi = std::numeric_limits<int64_t>::max()) {
  return int_range(lo, hi, /*show_as_at_least=*/true);
}

/// CLI11 check: a finite number >= lo (> lo with `open_lo`) and <= hi. Message "must be in
/// [lo, hi] (got v)" (or "(lo, hi]"); with `one_sided`, "must be >= lo (got v)" / "must be > lo"
/// below and "must be <= hi (got v)" above. Text that is not a finite number: "must be a number
/// (got 'text')".
inline CLI::Validator number_range(double lo, double hi, bool open_lo = false,
                                   bool one_sided = false) {
  const std::string below = fmt::format("must be {} {}", open_lo ? ">" : ">=", detail::show(lo));
  const std::string above = fmt::format("must be <= {}", detail::show(hi));
  const std::string both = fmt::format("must be in {}{}, {}]", open_lo ? "(" : "[",
                                       detail::show(lo), detail::show(hi));
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        double v = 0;
        if (!detail::parse_number(s, &v)) return fmt::format("must be a number (got '{}')", s);
        const bool low = v < lo || (open_lo && v == lo);
        if (!low && v <= hi) return std::string();
        return fmt::format("{} (got {})", one_sided ? (low ? below : above) : both,
                           detail::show(v));
      },
      (one_sided ? below : both).substr(std::string("must be ").size()));
}

/// number_range with one-sided messages: "must be >= 0 (got -1)", "must be > 0 (got 0)" (with
/// `open_lo`), "must be <= hi (got v)" when a (finite) `hi` is given.
inline CLI::Validator number_at_least(double lo, bool open_lo = false,
                                      double hi = std::numeric_limits<double>::max()) {
  return number_range(lo, hi, open_lo, /*one_sided=*/true);
}

}  // namespace v4::cli
