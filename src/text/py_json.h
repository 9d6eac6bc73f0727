// Internal: Python-`json`-compatible parsing and dumping (json.loads / json.dumps semantics), used
// to reproduce DeepSeek's reference encoder byte for byte. Not part of the public text API.
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace v4::text::pyjson {

/// A value as Python's json.loads returns it: ints keep their exact decimal text (Python ints are
/// unbounded), floats are doubles, objects keep first-insertion order with the last value.
struct Value {
  enum class Kind { kNull, kBool, kInt, kFloat, kStr, kArr, kObj } kind = Kind::kNull;
  bool b = false;
  std::string int_text;  // canonical decimal ("-0" -> "0")
  double f = 0;
  std::string s;
  std::vector<Value> arr;
  std::vector<std::pair<std::string, Value>> obj;
};

/// Deepest nesting of arrays / objects loads() reads (deeper text is refused, not recursed into).
inline constexpr int kMaxLoadsDepth = 512;

/// json.loads(text) (strict=True, NaN/Infinity accepted). nullopt where Python raises, and for
/// text nested deeper than kMaxLoadsDepth; then *too_deep (when given) says which.
std::optional<Value> loads(std::string_view text, bool* too_deep = nullptr);

/// json.dumps(v, ensure_ascii=...) with default separators.
std::string dumps(const Value& v, bool ensure_ascii = false);
/// json.dumps of an nlohmann value (numbers: integers exact, floats as Python repr).
std::string dumps(const nlohmann::ordered_json& v, bool ensure_ascii = false);
/// json.dumps of a string.
std::string dumps_string(std::string_view s, bool ensure_ascii = false);
/// Python repr(float): shortest round-trip; exponent form outside 1e-4 <= |x| < 1e16.
std::string float_repr(double x);

}  // namespace v4::text::pyjson
