// Loom's Jinja interpreter: the subset of jinja2 (3.1) that Hugging Face chat templates use,
// rendered as transformers renders them (ImmutableSandboxedEnvironment with trim_blocks,
// lstrip_blocks and loop controls; HF's `tojson`; globals `raise_exception` and `strftime_now`;
// no HTML escaping; Python printing of values). The supported statements, expressions, filters,
// tests and methods are listed in docs/chat.md; anything else is an error naming the construct
// and the template line, never ignored.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/chat/jinja_value.h"

namespace loom::jinja {

struct ParsedTemplate;

// Rendered text and the byte ranges of it that came from the request (values given with
// from_json(..., /*from_request=*/true) and whatever the template computed from them).
struct TrackedText {
  std::string text;
  Ranges request_ranges;
};

class Template {
 public:
  // InvalidArgument naming the problem and the line on a syntax error or unsupported construct.
  static absl::StatusOr<Template> parse(std::string_view source);

  // Renders with `context` as the template's variables. InvalidArgument naming the problem and
  // the template line on a runtime error (`raise_exception`, an undefined value used, a type
  // error, an unknown filter, test or method). Thread-safe: a render shares nothing mutable.
  absl::StatusOr<std::string> render(const Dict& context) const;
  // The same, with provenance: a string a built-in (filter, method) computed from request text
  // counts as request text as a whole; concatenation, `~`, printing and macro output keep exact
  // ranges.
  absl::StatusOr<TrackedText> render_tracked(const Dict& context) const;

 private:
  std::shared_ptr<const ParsedTemplate> tree_;
};

}  // namespace loom::jinja
