#include "json.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace hyflash::json {
namespace {

// The characters JSON escapes with a letter, both ways: {character, letter}
constexpr std::pair<char, char> kEscapes[] = {{'"', '"'}, {'\\', '\\'}, {'\b', 'b'}, {'\f', 'f'},
                                              {'\n', 'n'},  {'\r', 'r'},   {'\t', 't'}};

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}

  Value document() {
    Value v = value(0);
    space();
    if (i_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  const std::string& s_;
  size_t i_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("invalid JSON: " + what + " at offset " + std::to_string(i_));
  }
  void space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) ++i_;
  }
  bool literal(const char* word) {
    size_t n = std::char_traits<char>::length(word);
    if (s_.compare(i_, n, word) != 0) return false;
    i_ += n;
    return true;
  }

  Value value(int depth) {
    if (depth > 64) fail("nesting deeper than 64");
    space();
    if (i_ >= s_.size()) fail("unexpected end");
    Value v;
    char c = s_[i_];
    if (c == '{') {
      v.kind = Value::Kind::Object;
      ++i_;
      space();
      if (i_ < s_.size() && s_[i_] == '}') { ++i_; return v; }
      while (true) {
        space();
        if (i_ >= s_.size() || s_[i_] != '"') fail("expected a key");
        std::string key = string();
        space();
        if (i_ >= s_.size() || s_[i_] != ':') fail("expected ':'");
        ++i_;
        v.members.emplace_back(std::move(key), value(depth + 1));
        space();
        if (i_ < s_.size() && s_[i_] == ',') { ++i_; continue; }
        if (i_ < s_.size() && s_[i_] == '}') { ++i_; return v; }
        fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      v.kind = Value::Kind::Array;
      ++i_;
      space();
      if (i_ < s_.size() && s_[i_] == ']') { ++i_; return v; }
      while (true) {
        v.items.push_back(value(depth + 1));
        space();
        if (i_ < s_.size() && s_[i_] == ',') { ++i_; continue; }
        if (i_ < s_.size() && s_[i_] == ']') { ++i_; return v; }
        fail("expected ',' or ']'");
      }
    }
    if (c == '"') {
      v.kind = Value::Kind::String;
      v.text = string();
      return v;
    }
    if (literal("true")) { v.kind = Value::Kind::Bool; v.boolean = true; return v; }
    if (literal("false")) { v.kind = Value::Kind::Bool; return v; }
    if (literal("null")) return v;
    v.kind = Value::Kind::Number;
    size_t start = i_;
    for (const char* word : {"NaN", "Infinity", "-Infinity"})  // Python writes these for non-finite floats
      if (literal(word)) { v.text = s_.substr(start, i_ - start); return v; }
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    size_t digits = i_;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    if (i_ == digits) fail("unexpected character");
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    }
    v.text = s_.substr(start, i_ - start);
    return v;
  }

  unsigned hex4() {
    if (i_ + 4 > s_.size()) fail("short \\u escape");
    unsigned u = 0;
    for (int k = 0; k < 4; ++k) {
      char h = s_[i_++];
      u <<= 4;
      if (h >= '0' && h <= '9') u |= h - '0';
      else if (h >= 'a' && h <= 'f') u |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') u |= h - 'A' + 10;
      else fail("bad \\u escape");
    }
    return u;
  }

  static void utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string string() {
    ++i_;  // the opening quote
    std::string out;
    while (true) {
      if (i_ >= s_.size()) fail("unterminated string");
      char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') { out += c; continue; }
      if (i_ >= s_.size()) fail("unterminated escape");
      char e = s_[i_++];
      auto plain = std::find_if(std::begin(kEscapes), std::end(kEscapes), [e](auto p) { return p.second == e; });
      if (plain != std::end(kEscapes)) {
        out += plain->first;
        continue;
      }
      switch (e) {
        case '/': out += '/'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && s_.compare(i_, 2, "\\u") == 0) {
            size_t back = i_;
            i_ += 2;
            unsigned low = hex4();
            if (low >= 0xDC00 && low < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            else i_ = back;
          }
          utf8(out, cp);
          break;
        }
        default: fail("bad escape");
      }
    }
  }
};

// The next code point of UTF-8 text at i (advancing i); malformed bytes pass through as themselves.
unsigned next_code_point(const std::string& s, size_t& i) {
  unsigned char c = s[i++];
  int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
  unsigned cp = extra == 3 ? c & 0x07 : extra == 2 ? c & 0x0F : extra == 1 ? c & 0x1F : c;
  for (int k = 0; k < extra && i < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i++]) & 0x3F);
  return cp;
}

void emit(const Value& v, std::string& out, const std::string& skip) {
  switch (v.kind) {
    case Value::Kind::Null: out += "null"; return;
    case Value::Kind::Bool: out += v.boolean ? "true" : "false"; return;
    case Value::Kind::Number: out += v.text; return;
    case Value::Kind::String: out += quote(v.text); return;
    case Value::Kind::Array:
      out += '[';
      for (size_t k = 0; k < v.items.size(); ++k) {
        if (k) out += ',';
        emit(v.items[k], out, "");
      }
      out += ']';
      return;
    case Value::Kind::Object: {
      std::vector<const std::pair<std::string, Value>*> sorted;
      for (const auto& m : v.members)
        if (skip.empty() || m.first != skip) sorted.push_back(&m);
      // UTF-8 byte order is code-point order, which is how Python sorts str keys
      std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t k = 0; k < sorted.size(); ++k) {
        if (k) out += ',';
        out += quote(sorted[k]->first);
        out += ':';
        emit(sorted[k]->second, out, "");
      }
      out += '}';
      return;
    }
  }
}

}  // namespace

bool Value::is_int() const {
  return kind == Kind::Number && text.find_first_of(".eEIN") == std::string::npos;
}

const Value* Value::find(const std::string& key) const {
  if (kind != Kind::Object) return nullptr;
  for (const auto& m : members)
    if (m.first == key) return &m.second;
  return nullptr;
}

const Value& Value::at(const std::string& key) const {
  const Value* v = find(key);
  if (!v) throw std::runtime_error("missing key '" + key + "'");
  return *v;
}

const Value& Value::at(size_t index) const {
  if (kind != Kind::Array || index >= items.size())
    throw std::runtime_error("no item " + std::to_string(index) + " in a list of " + std::to_string(items.size()));
  return items[index];
}

size_t Value::size() const {
  if (kind == Kind::Array) return items.size();
  if (kind == Kind::Object) return members.size();
  throw std::runtime_error("expected a list or an object");
}

int64_t Value::as_int() const {
  if (!is_int()) throw std::runtime_error("expected an integer, got " + canonical(*this));
  return std::strtoll(text.c_str(), nullptr, 10);
}

double Value::as_double() const {
  if (kind != Kind::Number) throw std::runtime_error("expected a number, got " + canonical(*this));
  return std::strtod(text.c_str(), nullptr);
}

const std::string& Value::as_string() const {
  if (kind != Kind::String) throw std::runtime_error("expected a string, got " + canonical(*this));
  return text;
}

Value parse(const std::string& text) { return Parser(text).document(); }

std::string canonical(const Value& value, const std::string& skip_top_key) {
  std::string out;
  emit(value, out, skip_top_key);
  return out;
}

std::string number(double x) {
  char buf[32];
  std::string s(buf, std::to_chars(buf, buf + sizeof buf, x).ptr);
  return s.find_first_of(".eni") == std::string::npos ? s + ".0" : s;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  char buf[16];
  for (size_t i = 0; i < s.size();) {
    unsigned cp = next_code_point(s, i);
    auto plain = std::find_if(std::begin(kEscapes), std::end(kEscapes),
                              [cp](auto p) { return static_cast<unsigned char>(p.first) == cp; });
    if (plain != std::end(kEscapes)) {
      out += '\\';
      out += plain->second;
      continue;
    }
    if (cp >= 0x20 && cp <= 0x7E) {
      out += static_cast<char>(cp);
    } else if (cp < 0x10000) {
      std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      out += buf;
    } else {  // a surrogate pair, as Python's ensure_ascii writes it
      unsigned v = cp - 0x10000;
      std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      out += buf;
    }
  }
  return out + "\"";
}

}  // namespace hyflash::json
