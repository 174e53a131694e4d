#include "server/response_format.h"

#include "server/grammar_constraint.h"

namespace spw::server {

ApiResult<MakeConstraint> response_format_constraint(const ResponseFormat& format, const Text& text, int32_t eos_id) {
  if (format.type == ResponseFormat::Type::text) return MakeConstraint{};
  if (!text.has_tokenizer())
    return bad_request("response_format needs the model's tokenizer.json, which this model directory lacks",
                       "response_format");
  auto grammar = std::make_shared<JsonSchemaGrammar>();
  uint16_t root = grammar->any_object();
  if (format.type == ResponseFormat::Type::json_schema) {
    auto compiled = grammar->add(format.schema, /*strict=*/true);
    if (!compiled.ok())
      return bad_request(compiled.error().message + " (docs/server.md lists the supported subset)", "response_format");
    root = compiled.value();
  }
  std::shared_ptr<const JsonSchemaGrammar> shared = std::move(grammar);
  return MakeConstraint([shared, root, trie = text.token_trie(), eos_id] {
    return std::make_shared<JsonSchemaConstraint>(shared, trie, eos_id, shared->start(root));
  });
}

}  // namespace spw::server
