// json_writer.h — a minimal streaming JSON writer for the CLI's machine-readable output.
// Every string (keys too) first goes through printable_text(): text from a model file may
// hold control bytes or invalid UTF-8, which become visible escapes ("\x1b" as text), so
// the output is always valid JSON whose strings a terminal can print safely; '\n' and
// '\t' stay (as JSON escapes). Commas are inserted automatically.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "engine/printable.h"

namespace kvscope::cli {

class JsonWriter {
 public:
  JsonWriter& begin_object() { open('{'); return *this; }
  JsonWriter& end_object() { close('}'); return *this; }
  JsonWriter& begin_array() { open('['); return *this; }
  JsonWriter& end_array() { close(']'); return *this; }
  JsonWriter& key(std::string_view k) {
    comma();
    string(k);
    out_ += ':';
    after_key_ = true;
    return *this;
  }
  JsonWriter& value(std::string_view s) { comma(); string(s); return *this; }
  JsonWriter& value(const char* s) { return value(std::string_view(s)); }
  JsonWriter& value(const std::string& s) { return value(std::string_view(s)); }
  JsonWriter& value(bool b) { comma(); out_ += b ? "true" : "false"; return *this; }
  JsonWriter& value(int v) { return value(int64_t(v)); }
  JsonWriter& value(int64_t v) { comma(); out_ += std::to_string(v); return *this; }
  JsonWriter& value(uint64_t v) { comma(); out_ += std::to_string(v); return *this; }
  JsonWriter& value(double v) {
    comma();
    if (!std::isfinite(v)) {
      out_ += "null";
    } else {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.6g", v);
      out_ += buf;
    }
    return *this;
  }
  const std::string& str() const { return out_; }

 private:
  void open(char c) { comma(); out_ += c; first_.push_back(true); }
  void close(char c) { out_ += c; first_.pop_back(); }
  void comma() {
    if (after_key_) { after_key_ = false; return; }
    if (!first_.empty()) {
      if (!first_.back()) out_ += ',';
      first_.back() = false;
    }
  }
  void string(std::string_view raw) {
    const std::string s = printable_text(raw);
    out_ += '"';
    for (unsigned char c : s) {
      switch (c) {
        case '"': out_ += "\\\""; break;
        case '\\': out_ += "\\\\"; break;
        case '\n': out_ += "\\n"; break;
        case '\r': out_ += "\\r"; break;
        case '\t': out_ += "\\t"; break;
        default:
          if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out_ += buf;
          } else {
            out_ += char(c);
          }
      }
    }
    out_ += '"';
  }
  std::string out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

}  // namespace kvscope::cli
