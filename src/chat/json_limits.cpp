#include "chat/json_limits.h"

#include <utility>
#include <vector>

namespace spw {
namespace {

using ojson = nlohmann::ordered_json;

// Counts depth and values; returning false stops nlohmann's SAX parser at once.
class LimitCounter : public nlohmann::json_sax<ojson> {
 public:
  explicit LimitCounter(const JsonLimits& limits) : limits_(limits) {}

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override { return open(); }
  bool key(string_t&) override { return value(); }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error_ = make_error("is not valid JSON: ", e.what());
    return false;
  }

  Error error() const { return error_; }

 private:
  bool value() {
    if (++n_values_ <= limits_.max_values) return true;
    error_ = make_error("has more than ", limits_.max_values, " JSON values (this server's limit)");
    return false;
  }
  bool open() {
    if (++depth_ > limits_.max_depth) {
      error_ = make_error("nests arrays/objects more than ", limits_.max_depth,
                          " levels deep (this server's limit)");
      return false;
    }
    return value();
  }
  bool close() {
    --depth_;
    return true;
  }

  const JsonLimits& limits_;
  size_t depth_ = 0;
  size_t n_values_ = 0;
  Error error_{"is not valid JSON"};
};

}  // namespace

Result<ojson> parse_json_bounded(std::string_view text, const JsonLimits& limits) {
  LimitCounter counter(limits);
  if (!ojson::sax_parse(text, &counter, nlohmann::detail::input_format_t::json, /*strict=*/true,
                        /*ignore_comments=*/false)) {
    return counter.error();
  }
  // Within the limits and valid: the DOM pass cannot fail.
  ojson j = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return make_error("is not valid JSON");
  return j;
}

bool json_depth_exceeds(const ojson& value, size_t max_depth) {
  std::vector<std::pair<const ojson*, size_t>> stack{{&value, 0}};
  while (!stack.empty()) {
    auto [v, depth] = stack.back();
    stack.pop_back();
    if (!v->is_structured()) continue;
    if (depth + 1 > max_depth) return true;
    for (const ojson& child : *v) stack.emplace_back(&child, depth + 1);
  }
  return false;
}

}  // namespace spw
