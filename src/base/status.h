// Recoverable errors: everything a user can cause (bad model file, unsupported config, bad request)
// travels as an Error with context and reaches the user as a clear message. Aborts (SPW_CHECK) are
// for broken invariants only (docs/STYLE.md, rule 7).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <string_view>
#include <type_traits>
#include <variant>

namespace spw {

struct Error {
  std::string message;
};

// A value or an Error. Deliberately tiny: C++20 has no std::expected.
template <class T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}  // NOLINT
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

// Result<void>.
class Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return error_; }

 private:
  Error error_;
  bool ok_ = true;
};

inline std::string to_text(const std::string& s) { return s; }
inline std::string to_text(std::string_view s) { return std::string(s); }
inline std::string to_text(const char* s) { return s; }
inline std::string to_text(char c) { return std::string(1, c); }
template <class T>
  requires std::is_arithmetic_v<T>
std::string to_text(T v) {
  return std::to_string(v);
}


template <class... Args>
Error make_error(Args&&... parts) {
  std::string s;
  (s.append(to_text(std::forward<Args>(parts))), ...);
  return Error{std::move(s)};
}

}  // namespace spw

// Propagate an error from an expression returning Status or Result<T>.
#define SPW_TRY(expr)                                  \
  do {                                                 \
    auto spw_try_status_ = (expr);                     \
    if (!spw_try_status_.ok()) return spw_try_status_.error(); \
  } while (0)

// Broken invariant: print and abort. Never for user-caused conditions.
#define SPW_CHECK(cond)                                                              \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "%s:%d: invariant violated: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                  \
    }                                                                                \
  } while (0)
