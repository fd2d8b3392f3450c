// A small JSON reader for manifest.json, and the canonical form its checksum is taken over.
//
// The manifest's own checksum (manifest_sha256) is the sha256 of Python's
// json.dumps(body, sort_keys=True, separators=(",", ":")) with ASCII escapes. Numbers keep the text
// they were written with (Python wrote them, so re-emitting that text is what Python re-emits).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hyflash::json {

struct Value {
  enum class Kind { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  std::string text;  // a number's lexeme, or a string's contents (UTF-8)
  std::vector<Value> items;                            // Array
  std::vector<std::pair<std::string, Value>> members;  // Object, in file order

  bool is_object() const { return kind == Kind::Object; }
  bool is_array() const { return kind == Kind::Array; }
  bool is_string() const { return kind == Kind::String; }
  bool is_int() const;  // a Number written without fraction or exponent
  const Value* find(const std::string& key) const;  // nullptr when absent (or not an object)
  // The accessors throw std::runtime_error naming what was expected.
  const Value& at(const std::string& key) const;
  const Value& at(size_t index) const;
  size_t size() const;
  int64_t as_int() const;
  double as_double() const;
  const std::string& as_string() const;
};

Value parse(const std::string& text);  // throws std::runtime_error("... at offset N")
std::string canonical(const Value& value, const std::string& skip_top_key = "");
std::string quote(const std::string& s);  // a JSON string literal, ASCII escapes as Python writes them
std::string number(double x);  // the shortest text that reads back as x, always a float (1.0, not 1)

}  // namespace hyflash::json
