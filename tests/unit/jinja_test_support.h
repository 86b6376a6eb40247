// Shared by tests/unit/jinja_*_test.cc: renders a template source with Hugging Face's
// always-present variables (messages = [], tools = None, documents = None,
// add_generation_prompt = False) plus the variables of a JSON object.
#pragma once

#include <string>
#include <string_view>

#include "engine/chat/jinja_render.h"
#include "nlohmann/json.hpp"

namespace loom::jinja {

// The rendered text, or "PARSE ERROR: <message>" / "RENDER ERROR: <message>".
inline std::string render(std::string_view source, std::string_view vars_json) {
  auto t = Template::parse(source);
  if (!t.ok()) return "PARSE ERROR: " + std::string(t.status().message());
  Dict ctx;
  ctx.set("messages", Value::make_list({}));
  ctx.set("tools", Value::none());
  ctx.set("documents", Value::none());
  ctx.set("add_generation_prompt", Value::boolean(false));
  Value vars = from_json(nlohmann::ordered_json::parse(vars_json));
  for (const auto& [k, v] : vars.dict->items) ctx.set(k, v);
  auto r = t->render(ctx);
  return r.ok() ? *r : "RENDER ERROR: " + std::string(r.status().message());
}

}  // namespace loom::jinja
