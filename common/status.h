// status.h — error values for the engine and the renderer.
//
// The engine never exits or aborts on bad input: every fallible call returns a
// Status (no value) or an Expected<T> (a value or an error). Error messages name
// what was wrong (file, field, value, allowed range) and, where useful, what to do.
#pragma once

#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace kvscope {

struct Error {
  std::string message;
};

inline std::string to_piece(const std::string& s) { return s; }
inline std::string to_piece(std::string&& s) { return std::move(s); }
inline std::string to_piece(const char* s) { return s; }
inline std::string to_piece(std::string_view s) { return std::string(s); }
inline std::string to_piece(char c) { return std::string(1, c); }
template <class T>
  requires std::is_arithmetic_v<T>
std::string to_piece(T v) {
  return std::to_string(v);
}

// Builds an Error from pieces: make_error("gguf: ", path, ": bad magic").
template <class... Parts>
Error make_error(Parts&&... parts) {
  std::string s;
  ((s += to_piece(std::forward<Parts>(parts))), ...);
  return Error{std::move(s)};
}

template <class T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}
  Expected(Error error) : v_(std::move(error)) {}

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &std::get<0>(v_); }
  const T* operator->() const { return &std::get<0>(v_); }
  T& operator*() & { return std::get<0>(v_); }
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error.message)), failed_(true) {}
  static Status Ok() { return Status(); }

  bool ok() const { return !failed_; }
  explicit operator bool() const { return ok(); }
  const std::string& message() const { return error_; }
  Error error() const { return Error{error_}; }

 private:
  std::string error_;
  bool failed_ = false;
};

}  // namespace kvscope

// Propagate a failed Status / Expected from the enclosing function.
#define KV_TRY(expr)                                       \
  do {                                                     \
    auto kv_try_status_ = (expr);                          \
    if (!kv_try_status_.ok()) return kv_try_status_.error(); \
  } while (0)
