// response_format → constrained decoding: json_object allows any JSON object, json_schema the JSON
// that src/chat's JsonSchemaGrammar compiles from the schema (strictly: an unsupported keyword is a
// 400 naming it). The same GrammarConstraint as enforced tool calls masks the tokens.
#pragma once

#include <functional>
#include <memory>

#include "runtime/logits_constraint.h"
#include "server/api_error.h"
#include "server/openai_request.h"
#include "server/text.h"

namespace spw::server {

using MakeConstraint = std::function<std::shared_ptr<runtime::LogitsConstraint>()>;

// An empty function for "text". Errors: a schema outside the supported subset, no tokenizer.
ApiResult<MakeConstraint> response_format_constraint(const ResponseFormat& format, const Text& text, int32_t eos_id);

}  // namespace spw::server
