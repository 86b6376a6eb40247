#include "engine/chat/tool_call_parser.h"

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/chat/json_text.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace {

constexpr size_t kNone = std::string_view::npos;

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// Earliest complete occurrence of any marker in `s`; sets *which to its index in `markers`.
// No marker contains '<' after its first byte, so a marker cannot start inside another one and
// "earliest complete occurrence" does not depend on how much text has arrived.
size_t find_first(std::string_view s, std::initializer_list<std::string_view> markers,
                  size_t* which) {
  size_t best = kNone;
  size_t i = 0;
  for (std::string_view m : markers) {
    if (!m.empty()) {
      size_t p = s.find(m);
      if (p < best) {
        best = p;
        *which = i;
      }
    }
    ++i;
  }
  return best;
}

// Length of the longest suffix of `s` that is a proper prefix of one of the markers: text that
// must be held back because it may still become a marker.
size_t partial_suffix(std::string_view s, std::initializer_list<std::string_view> markers) {
  size_t best = 0;
  for (std::string_view m : markers) {
    size_t max_len = std::min(s.size(), m.empty() ? 0 : m.size() - 1);
    for (size_t len = max_len; len > best; --len) {
      if (s.substr(s.size() - len) == m.substr(0, len)) {
        best = len;
        break;
      }
    }
  }
  return best;
}

// Marker-delimited syntaxes (kimi, deepseek_v3, deepseek_v3.1, native).
struct MarkerSpec {
  std::string_view section_begin;  // empty: calls are not grouped in a section
  std::string_view section_end;
  std::string_view call_begin;
  std::string_view header_end;     // ends the call header (id / name)
  std::string_view args_end;       // ends the arguments
  std::string_view args_suffix;    // dropped from the end of the arguments before args_end
  std::string_view args_end_full;  // args_suffix + args_end
  bool trim_args;                  // strip whitespace around the arguments
};

constexpr MarkerSpec kKimiSpec{"<|tool_calls_section_begin|>",
                               "<|tool_calls_section_end|>",
                               "<|tool_call_begin|>",
                               "<|tool_call_argument_begin|>",
                               "<|tool_call_end|>",
                               "",
                               "<|tool_call_end|>",
                               true};
constexpr MarkerSpec kDeepSeekV3Spec{"<｜tool▁calls▁begin｜>",   "<｜tool▁calls▁end｜>",
                                     "<｜tool▁call▁begin｜>",    "\n```json\n",
                                     "<｜tool▁call▁end｜>",      "\n```",
                                     "\n```<｜tool▁call▁end｜>", false};
constexpr MarkerSpec kDeepSeekV31Spec{"<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
                                      "<｜tool▁call▁begin｜>",  "<｜tool▁sep｜>",
                                      "<｜tool▁call▁end｜>",    "",
                                      "<｜tool▁call▁end｜>",    false};
constexpr MarkerSpec kNativeSpec{
    "", "", "<|tool_call|>", "<|tool_args|>", "<|tool_call_end|>", "", "<|tool_call_end|>", false};

constexpr std::string_view kQwenBegin = "<tool_call>";
constexpr std::string_view kQwenEnd = "</tool_call>";

enum class State {
  kText,          // plain content
  kSection,       // inside a tool-call section, between calls
  kHeader,        // after a call marker, before its header is complete
  kArgs,          // streaming a call's arguments
  kQwenHeader,    // after <tool_call>, matching {"name": "...", "arguments":
  kQwenArgs,      // streaming the arguments JSON value
  kQwenTail,      // after the arguments value, until </tool_call>
  kQwenFallback,  // header not in canonical form: buffer the whole call and parse it as JSON
};

enum class Match { kYes, kNeedMore, kNo };

// Matches the canonical Qwen call header `\s*{\s*"name"\s*:\s*"NAME"\s*,\s*"arguments"\s*:\s*`
// at the start of `s`. On kYes sets *len (bytes consumed) and *name.
Match match_qwen_header(std::string_view s, size_t* len, std::string* name) {
  size_t i = 0;
  auto skip_ws = [&] {
    while (i < s.size() && is_space(s[i])) ++i;
    return i < s.size();
  };
  auto literal = [&](std::string_view lit) -> Match {
    for (char c : lit) {
      if (i >= s.size()) return Match::kNeedMore;
      if (s[i] != c) return Match::kNo;
      ++i;
    }
    return Match::kYes;
  };
  Match m;
  if (!skip_ws()) return Match::kNeedMore;
  if ((m = literal("{")) != Match::kYes) return m;
  if (!skip_ws()) return Match::kNeedMore;
  if ((m = literal("\"name\"")) != Match::kYes) return m;
  if (!skip_ws()) return Match::kNeedMore;
  if ((m = literal(":")) != Match::kYes) return m;
  if (!skip_ws()) return Match::kNeedMore;
  if ((m = literal("\"")) != Match::kYes) return m;
  size_t name_begin = i;
  while (true) {
    if (i >= s.size()) return Match::kNeedMore;
    char c = s[i];
    if (c == '"') break;
    // Escapes and markup in a name: not canonical, let the JSON fallback decide.
    if (c == '\\' || c == '<' || static_cast<unsigned char>(c) < 0x20) return Match::kNo;
    ++i;
  }
  if (i == name_begin) return Match::kNo;
  std::string_view parsed_name = s.substr(name_begin, i - name_begin);
  ++i;
  if (!skip_ws()) return Match::kNeedMore;
  if ((m = literal(",")) != Match::kYes) return m;
  if (!skip_ws()) return Match::kNeedMore;
  if ((m = literal("\"arguments\"")) != Match::kYes) return m;
  if (!skip_ws()) return Match::kNeedMore;
  if ((m = literal(":")) != Match::kYes) return m;
  if (!skip_ws()) return Match::kNeedMore;  // the value's first byte decides its kind
  *len = i;
  *name = std::string(parsed_name);
  return Match::kYes;
}

const MarkerSpec* marker_spec(ToolCallSyntax syntax) {
  switch (syntax) {
    case ToolCallSyntax::kKimi:
      return &kKimiSpec;
    case ToolCallSyntax::kDeepSeekV3:
      return &kDeepSeekV3Spec;
    case ToolCallSyntax::kDeepSeekV31:
      return &kDeepSeekV31Spec;
    case ToolCallSyntax::kNative:
      return &kNativeSpec;
    case ToolCallSyntax::kQwen:
      return nullptr;
  }
  return nullptr;
}

// A function name as DeepSeek writes it in a call header: surrounding blanks trimmed; false when
// it is empty or holds a newline or markup.
bool deepseek_name(std::string_view fn, std::string* name) {
  size_t b = fn.find_first_not_of(" \t\r");
  if (b == kNone) return false;
  fn = fn.substr(b, fn.find_last_not_of(" \t\r") - b + 1);
  if (fn.find('\n') != kNone || fn.find('<') != kNone) return false;
  *name = std::string(fn);
  return true;
}

}  // namespace

std::string_view tool_call_syntax_name(ToolCallSyntax syntax) {
  switch (syntax) {
    case ToolCallSyntax::kKimi:
      return "kimi";
    case ToolCallSyntax::kDeepSeekV3:
      return "deepseek_v3";
    case ToolCallSyntax::kDeepSeekV31:
      return "deepseek_v3.1";
    case ToolCallSyntax::kQwen:
      return "qwen";
    case ToolCallSyntax::kNative:
      return "native";
  }
  return "native";
}

ToolCallSyntax default_tool_call_syntax(ChatFormat format) {
  switch (format) {
    case ChatFormat::kKimi:
      return ToolCallSyntax::kKimi;
    case ChatFormat::kDeepSeek:
      return ToolCallSyntax::kDeepSeekV3;
    case ChatFormat::kQwen:
      return ToolCallSyntax::kQwen;
    case ChatFormat::kNative:
      return ToolCallSyntax::kNative;
  }
  return ToolCallSyntax::kNative;
}

struct ToolCallStreamParser::Impl {
  explicit Impl(ToolCallSyntax s) : syntax(s), spec(marker_spec(s)) {}

  ToolCallSyntax syntax;
  const MarkerSpec* spec;  // null for qwen
  State state = State::kText;
  std::string buf;  // received, not yet consumed
  bool finished = false;
  size_t num_calls = 0;       // calls started so far; the current one is num_calls - 1
  bool seen_call = false;     // a call has ended: whitespace at the end of the text is dropped
  std::string content_ws;     // trailing whitespace of content, held until what follows decides
  bool args_started = false;  // trim_args: leading whitespace skipped
  std::string args_ws;        // trim_args: held-back trailing whitespace of the arguments
  // Qwen argument value scanner: finds where the "arguments" JSON value ends.
  enum class ValueKind { kNone, kContainer, kString, kScalar };
  ValueKind value_kind = ValueKind::kNone;
  int depth = 0;  // open {/[ in a container value
  bool in_string = false;
  bool escaped = false;

  // Feeds one byte of the value; returns true when the value ended with it (for a scalar: the
  // byte is the delimiter after it).
  bool scan_value_byte(char c) {
    switch (value_kind) {
      case ValueKind::kNone:
        if (c == '{' || c == '[') {
          value_kind = ValueKind::kContainer;
          depth = 1;
        } else if (c == '"') {
          value_kind = ValueKind::kString;
          in_string = true;
        } else {
          value_kind = ValueKind::kScalar;
        }
        return false;
      case ValueKind::kScalar:
        return is_space(c) || c == ',' || c == '}' || c == ']';
      case ValueKind::kString:
      case ValueKind::kContainer:
        if (in_string) {
          if (escaped) {
            escaped = false;
          } else if (c == '\\') {
            escaped = true;
          } else if (c == '"') {
            in_string = false;
            if (value_kind == ValueKind::kString) return true;
          }
          return false;
        }
        if (c == '"') {
          in_string = true;
        } else if (c == '{' || c == '[') {
          ++depth;
        } else if (c == '}' || c == ']') {
          return --depth == 0;
        }
        return false;
    }
    return false;
  }

  State text_state() const {
    return spec != nullptr && !spec->section_begin.empty() ? State::kSection : State::kText;
  }

  // Content is passed through, except that whitespace directly before a call, inside a call
  // section, or at the end after a call is dropped (it separates calls, as the templates write
  // them, e.g. Qwen's "\n" after content; it is not a reply). So trailing whitespace waits.
  void emit_content(std::string_view text, ChatDelta* out) {
    size_t last = text.find_last_not_of(" \n\t\r");
    if (last == kNone) {
      content_ws += text;
      return;
    }
    out->content += content_ws;
    content_ws.clear();
    out->content += text.substr(0, last + 1);
    content_ws += text.substr(last + 1);
  }

  void start_call(std::string id, std::string name, ChatDelta* out) {
    ToolCallDelta d;
    d.index = num_calls++;
    d.id = id.empty() ? absl::StrCat("call_", d.index) : std::move(id);
    d.name = std::move(name);
    out->tool_calls.push_back(std::move(d));
    content_ws.clear();
    args_started = false;
    args_ws.clear();
  }

  void emit_args(std::string_view text, ChatDelta* out) {
    if (text.empty()) return;
    std::string frag;
    if (spec != nullptr && spec->trim_args) {
      if (!args_started) {
        size_t first = text.find_first_not_of(" \n\t\r");
        if (first == kNone) return;
        text.remove_prefix(first);
        args_started = true;
      }
      size_t last = text.find_last_not_of(" \n\t\r");
      if (last == kNone) {
        args_ws += text;
        return;
      }
      frag = std::move(args_ws);
      args_ws.clear();
      frag += text.substr(0, last + 1);
      args_ws = std::string(text.substr(last + 1));
    } else {
      frag = std::string(text);
    }
    if (frag.empty()) return;
    if (!out->tool_calls.empty() && out->tool_calls.back().index == num_calls - 1) {
      out->tool_calls.back().arguments += frag;
    } else {
      ToolCallDelta d;
      d.index = num_calls - 1;
      d.arguments = std::move(frag);
      out->tool_calls.push_back(std::move(d));
    }
  }

  void end_call() {
    args_ws.clear();
    seen_call = true;
    content_ws.clear();
  }

  // A call marker that did not start a valid call: the marker becomes content and the text
  // after it is scanned again as content.
  void degrade(std::string_view marker, ChatDelta* out) {
    emit_content(marker, out);
    state = text_state();
  }

  // Validates a call header; fills id (empty: generate) and name.
  bool parse_header(std::string_view header, std::string* id, std::string* name) const {
    if (syntax == ToolCallSyntax::kKimi) {
      // "functions.<name>:<index>" (vLLM's kimi_k2 parser: [^<]+:\d+, name after the last '.').
      size_t b = header.find_first_not_of(" \n\t\r");
      if (b == kNone) return false;
      size_t e = header.find_last_not_of(" \n\t\r");
      std::string_view h = header.substr(b, e - b + 1);
      size_t colon = h.rfind(':');
      if (colon == kNone || colon + 1 == h.size()) return false;
      for (size_t i = colon + 1; i < h.size(); ++i) {
        if (h[i] < '0' || h[i] > '9') return false;
      }
      std::string_view fn = h.substr(0, colon);
      size_t dot = fn.rfind('.');
      if (dot != kNone) fn.remove_prefix(dot + 1);
      if (fn.empty()) return false;
      *id = std::string(h);
      *name = std::string(fn);
      return true;
    }
    if (syntax == ToolCallSyntax::kDeepSeekV3) {
      // "<type><｜tool▁sep｜><name>".
      constexpr std::string_view kSep = "<｜tool▁sep｜>";
      size_t sep = header.find(kSep);
      if (sep == kNone) return false;
      return deepseek_name(header.substr(sep + kSep.size()), name);
    }
    if (syntax == ToolCallSyntax::kDeepSeekV31) return deepseek_name(header, name);  // "<name>"
    // native: the bare function name.
    if (header.empty()) return false;
    for (char c : header) {
      if (is_space(c) || c == '<') return false;
    }
    *name = std::string(header);
    return true;
  }

  // Consumes as much of buf as is unambiguous. With `eof`, nothing more will arrive.
  void run(bool eof, ChatDelta* out) {
    size_t pos = 0;
    run_states(eof, out, pos);
    buf.erase(0, pos);
  }

  void run_states(bool eof, ChatDelta* out, size_t& pos) {
    while (true) {
      std::string_view s = std::string_view(buf).substr(pos);
      if (s.empty() && !eof) break;
      size_t which = 0;
      switch (state) {
        case State::kText: {
          std::string_view begin =
              spec == nullptr
                  ? kQwenBegin
                  : (spec->section_begin.empty() ? spec->call_begin : spec->section_begin);
          size_t p = find_first(s, {begin}, &which);
          if (p == kNone) {
            size_t hold = eof ? 0 : partial_suffix(s, {begin});
            emit_content(s.substr(0, s.size() - hold), out);
            pos += s.size() - hold;
            if (eof) {
              if (!seen_call) out->content += content_ws;  // a reply without calls is verbatim
              content_ws.clear();
            }
            return;
          }
          // Whitespace before the marker waits: dropped if a call follows, kept if it degrades.
          emit_content(s.substr(0, p), out);
          pos += p + begin.size();
          if (spec == nullptr) {
            state = State::kQwenHeader;
          } else {
            state = spec->section_begin.empty() ? State::kHeader : State::kSection;
          }
          break;
        }
        case State::kSection: {
          size_t p = find_first(s, {spec->call_begin, spec->section_end}, &which);
          if (p == kNone) {
            size_t hold = eof ? 0 : partial_suffix(s, {spec->call_begin, spec->section_end});
            emit_content(s.substr(0, s.size() - hold), out);
            pos += s.size() - hold;
            if (eof) content_ws.clear();
            return;
          }
          emit_content(s.substr(0, p), out);
          if (which == 0) {
            pos += p + spec->call_begin.size();
            state = State::kHeader;
          } else {
            content_ws.clear();  // whitespace at the end of a section is dropped
            pos += p + spec->section_end.size();
            state = State::kText;
          }
          break;
        }
        case State::kHeader: {
          size_t p = find_first(
              s, {spec->header_end, spec->call_begin, spec->section_end, spec->args_end}, &which);
          if (p == kNone) {
            if (!eof) return;
            degrade(spec->call_begin, out);  // header cut off by the end of the text
            break;
          }
          std::string id, name;
          if (which != 0 || !parse_header(s.substr(0, p), &id, &name)) {
            degrade(spec->call_begin, out);
            break;
          }
          start_call(std::move(id), std::move(name), out);
          pos += p + spec->header_end.size();
          state = State::kArgs;
          break;
        }
        case State::kArgs: {
          size_t p = find_first(s, {spec->args_end, spec->call_begin, spec->section_end}, &which);
          if (p == kNone) {
            size_t hold = eof ? 0
                              : partial_suffix(s, {spec->args_end_full, spec->args_end,
                                                   spec->call_begin, spec->section_end});
            emit_args(s.substr(0, s.size() - hold), out);
            pos += s.size() - hold;
            if (eof) end_call();  // cut off: the call keeps the arguments received
            return;
          }
          std::string_view args = s.substr(0, p);
          if (which == 0) {
            if (!spec->args_suffix.empty() && args.size() >= spec->args_suffix.size() &&
                args.substr(args.size() - spec->args_suffix.size()) == spec->args_suffix) {
              args.remove_suffix(spec->args_suffix.size());
            }
            pos += p + spec->args_end.size();
          } else {
            pos += p;  // interrupted by the next call or the section end: handled there
          }
          emit_args(args, out);
          end_call();
          state = text_state();
          break;
        }
        case State::kQwenHeader: {
          size_t len = 0;
          std::string name;
          Match m = match_qwen_header(s, &len, &name);
          if (m == Match::kYes) {
            start_call("", std::move(name), out);
            pos += len;
            value_kind = ValueKind::kNone;
            depth = 0;
            in_string = escaped = false;
            state = State::kQwenArgs;
          } else if (m == Match::kNo) {
            state = State::kQwenFallback;
          } else if (eof) {
            degrade(kQwenBegin, out);
          } else {
            return;
          }
          break;
        }
        case State::kQwenArgs: {
          size_t p = find_first(s, {kQwenEnd, kQwenBegin}, &which);
          size_t limit =
              p != kNone ? p
                         : (eof ? s.size() : s.size() - partial_suffix(s, {kQwenEnd, kQwenBegin}));
          size_t i = 0;
          bool done = false;
          for (; i < limit && !done; ++i) done = scan_value_byte(s[i]);
          if (done && value_kind == ValueKind::kScalar) --i;  // the delimiter is not part of it
          emit_args(s.substr(0, i), out);
          pos += i;
          if (done) {
            end_call();
            state = State::kQwenTail;
            break;
          }
          if (p != kNone) {
            end_call();  // the value never closed: the call ends at the marker
            if (which == 0) pos += kQwenEnd.size();
            state = State::kText;
            break;
          }
          if (eof) end_call();
          return;
        }
        case State::kQwenTail: {
          size_t p = find_first(s, {kQwenEnd, kQwenBegin}, &which);
          if (p == kNone) {
            // Expected only "}\n"; anything else before </tool_call> is dropped.
            size_t hold = eof ? 0 : partial_suffix(s, {kQwenEnd, kQwenBegin});
            pos += s.size() - hold;
            if (eof) state = State::kText;
            return;
          }
          pos += p + (which == 0 ? kQwenEnd.size() : 0);
          state = State::kText;
          break;
        }
        case State::kQwenFallback: {
          size_t p = find_first(s, {kQwenEnd, kQwenBegin}, &which);
          if (p == kNone) {
            if (!eof) return;
            degrade(kQwenBegin, out);
            break;
          }
          if (which == 1) {
            degrade(kQwenBegin, out);
            break;
          }
          nlohmann::ordered_json j =
              nlohmann::ordered_json::parse(s.substr(0, p), nullptr, /*allow_exceptions=*/false);
          if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string() ||
              j["name"].get_ref<const std::string&>().empty() || !j.contains("arguments")) {
            degrade(kQwenBegin, out);
            break;
          }
          start_call("", j["name"].get<std::string>(), out);
          std::string args;
          chat_internal::dump_json_text(j["arguments"], chat_internal::JsonSeparators::kPython,
                                        &args);
          emit_args(args, out);
          end_call();
          pos += p + kQwenEnd.size();
          state = State::kText;
          break;
        }
      }
    }
  }
};

void accumulate_delta(const ChatDelta& delta, ParsedOutput* out) {
  out->reasoning += delta.reasoning;
  out->content += delta.content;
  for (const ToolCallDelta& d : delta.tool_calls) {
    if (d.index >= out->tool_calls.size()) out->tool_calls.resize(d.index + 1);
    ToolCall& call = out->tool_calls[d.index];
    if (!d.id.empty()) call.id = d.id;
    if (!d.name.empty()) call.name = d.name;
    call.arguments_json += d.arguments;
  }
}

ToolCallStreamParser::ToolCallStreamParser(ToolCallSyntax syntax)
    : impl_(std::make_unique<Impl>(syntax)) {}
ToolCallStreamParser::~ToolCallStreamParser() = default;

ChatDelta ToolCallStreamParser::feed(std::string_view text) {
  ChatDelta out;
  if (impl_->finished) return out;
  impl_->buf.append(text);
  impl_->run(/*eof=*/false, &out);
  return out;
}

ChatDelta ToolCallStreamParser::finish() {
  ChatDelta out;
  if (impl_->finished) return out;
  impl_->run(/*eof=*/true, &out);
  impl_->finished = true;
  impl_->buf.clear();
  return out;
}

ParsedOutput parse_tool_calls(ToolCallSyntax syntax, std::string_view text) {
  ToolCallStreamParser parser(syntax);
  ParsedOutput out;
  accumulate_delta(parser.feed(text), &out);
  accumulate_delta(parser.finish(), &out);
  return out;
}

}  // namespace loom
