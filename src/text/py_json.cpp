#include "text/py_json.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

namespace v4::text::pyjson {
namespace {

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

class Parser {
 public:
  explicit Parser(std::string_view t) : t_(t) {}
  std::optional<Value> run() {
    ws();
    Value v;
    if (!value(v, 0)) return std::nullopt;
    ws();
    if (i_ != t_.size()) return std::nullopt;  // "Extra data"
    return v;
  }
  /// Whether run() met a value nested deeper than kMaxLoadsDepth.
  bool too_deep() const { return too_deep_; }

 private:
  void ws() {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\t' || t_[i_] == '\n' || t_[i_] == '\r')) ++i_;
  }
  bool lit(std::string_view w) {
    if (t_.substr(i_, w.size()) == w) {
      i_ += w.size();
      return true;
    }
    return false;
  }
  bool hex4(uint32_t& cp) {
    if (i_ + 4 > t_.size()) return false;
    cp = 0;
    for (int k = 0; k < 4; ++k) {
      char c = t_[i_ + k];
      cp <<= 4;
      if (c >= '0' && c <= '9') cp |= c - '0';
      else if (c >= 'a' && c <= 'f') cp |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') cp |= c - 'A' + 10;
      else return false;
    }
    i_ += 4;
    return true;
  }
  bool str(std::string& out) {
    if (i_ >= t_.size() || t_[i_] != '"') return false;
    ++i_;
    while (i_ < t_.size()) {
      unsigned char c = static_cast<unsigned char>(t_[i_]);
      if (c == '"') {
        ++i_;
        return true;
      }
      if (c < 0x20) return false;  // strict: control characters not allowed
      if (c != '\\') {
        out.push_back(static_cast<char>(c));
        ++i_;
        continue;
      }
      if (++i_ >= t_.size()) return false;
      char e = t_[i_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          uint32_t cp;
          if (!hex4(cp)) return false;
          if (cp >= 0xD800 && cp <= 0xDBFF && t_.substr(i_, 2) == "\\u") {
            size_t save = i_;
            i_ += 2;
            uint32_t lo;
            if (hex4(lo) && lo >= 0xDC00 && lo <= 0xDFFF) {
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else {
              i_ = save;
            }
          }
          if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;  // lone surrogate: not representable in UTF-8
          append_utf8(cp, out);
          break;
        }
        default:
          return false;
      }
    }
    return false;
  }
  bool number(Value& v) {
    size_t s = i_;
    if (i_ < t_.size() && t_[i_] == '-') ++i_;
    if (i_ >= t_.size()) return false;
    if (t_[i_] == '0') {
      ++i_;
    } else if (t_[i_] >= '1' && t_[i_] <= '9') {
      while (i_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[i_]))) ++i_;
    } else {
      return false;
    }
    size_t int_end = i_;
    bool is_float = false;
    if (i_ + 1 < t_.size() && t_[i_] == '.' && std::isdigit(static_cast<unsigned char>(t_[i_ + 1]))) {
      is_float = true;
      ++i_;
      while (i_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[i_]))) ++i_;
    }
    if (i_ < t_.size() && (t_[i_] == 'e' || t_[i_] == 'E')) {
      size_t k = i_ + 1;
      if (k < t_.size() && (t_[k] == '+' || t_[k] == '-')) ++k;
      if (k < t_.size() && std::isdigit(static_cast<unsigned char>(t_[k]))) {
        is_float = true;
        i_ = k;
        while (i_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[i_]))) ++i_;
      }
    }
    std::string lex(t_.substr(s, i_ - s));
    if (is_float) {
      v.kind = Value::Kind::kFloat;
      v.f = std::strtod(lex.c_str(), nullptr);  // overflow -> +-inf like Python float()
    } else {
      v.kind = Value::Kind::kInt;
      v.int_text = std::string(t_.substr(s, int_end - s));
      if (v.int_text == "-0") v.int_text = "0";
    }
    return true;
  }
  bool value(Value& v, int depth) {
    if (depth > kMaxLoadsDepth) {
      too_deep_ = true;
      return false;
    }
    if (i_ >= t_.size()) return false;
    char c = t_[i_];
    if (c == '{') {
      ++i_;
      v.kind = Value::Kind::kObj;
      ws();
      if (i_ < t_.size() && t_[i_] == '}') {
        ++i_;
        return true;
      }
      // Key -> position, once the object is past a few keys: a linear search per key made an
      // object of n keys cost O(n^2) (a tool call's arguments string is client text).
      std::unordered_map<std::string, size_t> index;
      constexpr size_t kLinear = 16;
      while (true) {
        ws();
        std::string k;
        if (!str(k)) return false;
        ws();
        if (i_ >= t_.size() || t_[i_] != ':') return false;
        ++i_;
        ws();
        Value item;
        if (!value(item, depth + 1)) return false;
        size_t at = v.obj.size();
        if (v.obj.size() < kLinear) {
          for (size_t q = 0; q < v.obj.size(); ++q)
            if (v.obj[q].first == k) at = q;
        } else {
          if (index.empty())
            for (size_t q = 0; q < v.obj.size(); ++q) index.emplace(v.obj[q].first, q);
          auto [it, inserted] = index.emplace(k, v.obj.size());
          at = it->second;
        }
        if (at < v.obj.size()) v.obj[at].second = std::move(item);  // dict: last value wins, first position kept
        else v.obj.emplace_back(std::move(k), std::move(item));
        ws();
        if (i_ < t_.size() && t_[i_] == ',') {
          ++i_;
          continue;
        }
        if (i_ < t_.size() && t_[i_] == '}') {
          ++i_;
          return true;
        }
        return false;
      }
    }
    if (c == '[') {
      ++i_;
      v.kind = Value::Kind::kArr;
      ws();
      if (i_ < t_.size() && t_[i_] == ']') {
        ++i_;
        return true;
      }
      while (true) {
        ws();
        Value item;
        if (!value(item, depth + 1)) return false;
        v.arr.push_back(std::move(item));
        ws();
        if (i_ < t_.size() && t_[i_] == ',') {
          ++i_;
          continue;
        }
        if (i_ < t_.size() && t_[i_] == ']') {
          ++i_;
          return true;
        }
        return false;
      }
    }
    if (c == '"') {
      v.kind = Value::Kind::kStr;
      return str(v.s);
    }
    if (lit("null")) {
      v.kind = Value::Kind::kNull;
      return true;
    }
    if (lit("true")) {
      v.kind = Value::Kind::kBool;
      v.b = true;
      return true;
    }
    if (lit("false")) {
      v.kind = Value::Kind::kBool;
      v.b = false;
      return true;
    }
    if (lit("NaN")) {
      v.kind = Value::Kind::kFloat;
      v.f = std::nan("");
      return true;
    }
    if (lit("Infinity")) {
      v.kind = Value::Kind::kFloat;
      v.f = INFINITY;
      return true;
    }
    if (lit("-Infinity")) {
      v.kind = Value::Kind::kFloat;
      v.f = -INFINITY;
      return true;
    }
    return number(v);
  }

  std::string_view t_;
  size_t i_ = 0;
  bool too_deep_ = false;
};

}  // namespace

std::optional<Value> loads(std::string_view text, bool* too_deep) {
  Parser p(text);
  std::optional<Value> v = p.run();
  if (too_deep) *too_deep = p.too_deep();
  return v;
}

std::string float_repr(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);
  std::string_view sci(buf, r.ptr - buf);  // e.g. "-1.2345e+20"
  bool neg = !sci.empty() && sci[0] == '-';
  if (neg) sci.remove_prefix(1);
  size_t epos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, epos))
    if (c != '.') digits.push_back(c);
  int exp10 = std::atoi(std::string(sci.substr(epos + 1)).c_str());
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  int decpt = exp10 + 1;
  std::string out = neg ? "-" : "";
  if (digits == "0") return out + "0.0";
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(-decpt, '0') + digits;
    } else if (decpt >= static_cast<int>(digits.size())) {
      out += digits + std::string(decpt - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    int e = decpt - 1;
    out += e < 0 ? "e-" : "e+";
    std::string es = std::to_string(std::abs(e));
    if (es.size() < 2) es = "0" + es;
    out += es;
  }
  return out;
}

std::string dumps_string(std::string_view s, bool ensure_ascii) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\u%04x", c);
      out += b;
    } else if (c >= 0x80 && ensure_ascii) {
      // decode one code point and write \uXXXX (surrogate pair above the BMP)
      int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
      uint32_t cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
      for (int k = 1; k < len && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
      i += len - 1;
      char b[16];
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(b, sizeof(b), "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
      } else {
        std::snprintf(b, sizeof(b), "\\u%04x", cp);
      }
      out += b;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  out += "\"";
  return out;
}

std::string dumps(const Value& v, bool ea) {
  switch (v.kind) {
    case Value::Kind::kNull: return "null";
    case Value::Kind::kBool: return v.b ? "true" : "false";
    case Value::Kind::kInt: return v.int_text;
    case Value::Kind::kFloat: return float_repr(v.f);
    case Value::Kind::kStr: return dumps_string(v.s, ea);
    case Value::Kind::kArr: {
      std::string o = "[";
      for (size_t i = 0; i < v.arr.size(); ++i) o += (i ? ", " : "") + dumps(v.arr[i], ea);
      return o + "]";
    }
    case Value::Kind::kObj: {
      std::string o = "{";
      for (size_t i = 0; i < v.obj.size(); ++i)
        o += (i ? ", " : "") + dumps_string(v.obj[i].first, ea) + ": " + dumps(v.obj[i].second, ea);
      return o + "}";
    }
  }
  return "null";
}

std::string dumps(const nlohmann::ordered_json& v, bool ea) {
  using J = nlohmann::ordered_json;
  switch (v.type()) {
    case J::value_t::null: return "null";
    case J::value_t::boolean: return v.get<bool>() ? "true" : "false";
    case J::value_t::number_integer: return std::to_string(v.get<int64_t>());
    case J::value_t::number_unsigned: return std::to_string(v.get<uint64_t>());
    case J::value_t::number_float: return float_repr(v.get<double>());
    case J::value_t::string: return dumps_string(v.get_ref<const std::string&>(), ea);
    case J::value_t::array: {
      std::string o = "[";
      bool first = true;
      for (auto& x : v) {
        o += (first ? "" : ", ") + dumps(x, ea);
        first = false;
      }
      return o + "]";
    }
    case J::value_t::object: {
      std::string o = "{";
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        o += (first ? "" : ", ") + dumps_string(it.key(), ea) + ": " + dumps(it.value(), ea);
        first = false;
      }
      return o + "}";
    }
    default: return "null";
  }
}

}  // namespace v4::text::pyjson
