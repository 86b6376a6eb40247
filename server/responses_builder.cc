#include "server/responses_builder.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace loom {
namespace {

using ojson = nlohmann::ordered_json;

std::string dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

ojson text_part(const std::string& text) {
  return {{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}};
}

}  // namespace

ResponsesBuilder::ResponsesBuilder(ResponsesTurn turn, bool stream)
    : turn_(std::move(turn)), stream_(stream), reader_(turn_.output) {}

ojson ResponsesBuilder::response() const {
  ojson r = {{"id", turn_.id},       {"object", "response"}, {"created_at", turn_.created_at},
             {"status", status_},    {"error", nullptr},     {"incomplete_details", nullptr},
             {"model", turn_.model}, {"output", items_}};
  if (status_ == "incomplete") r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  if (status_ == "failed") r["error"] = {{"code", "server_error"}, {"message", error_}};
  for (const auto& [key, value] : turn_.echo.items()) r[key] = value;
  if (status_ != "in_progress") {
    r["usage"] = {{"input_tokens", prompt_tokens_},
                  {"input_tokens_details", {{"cached_tokens", cached_tokens_}}},
                  {"output_tokens", completion_tokens_},
                  {"output_tokens_details", {{"reasoning_tokens", 0}}},
                  {"total_tokens", prompt_tokens_ + completion_tokens_}};
  } else {
    r["usage"] = nullptr;
  }
  return r;
}

std::string ResponsesBuilder::event(ojson e) {
  e["sequence_number"] = sequence_++;
  return dump(e);
}

std::vector<std::string> ResponsesBuilder::stream_head() {
  std::vector<std::string> out;
  out.push_back(event({{"type", "response.created"}, {"response", response()}}));
  out.push_back(event({{"type", "response.in_progress"}, {"response", response()}}));
  return out;
}

// Ends the open item (message, reasoning or function call): its closing events, in the order
// OpenAI sends them.
void ResponsesBuilder::close_open(std::vector<std::string>* out) {
  if (message_ < 0) return;
  ojson& item = items_[static_cast<size_t>(message_)];
  const int index = message_;
  message_ = -1;
  const std::string type = item["type"].get<std::string>();
  const std::string id = item["id"].get<std::string>();
  item["status"] = "completed";
  if (!stream_) return;
  if (type == "message") {
    const std::string text = item["content"][0]["text"].get<std::string>();
    out->push_back(event({{"type", "response.output_text.done"},
                          {"item_id", id},
                          {"output_index", index},
                          {"content_index", 0},
                          {"text", text}}));
    out->push_back(event({{"type", "response.content_part.done"},
                          {"item_id", id},
                          {"output_index", index},
                          {"content_index", 0},
                          {"part", item["content"][0]}}));
  } else if (type == "reasoning") {
    out->push_back(event({{"type", "response.reasoning_text.done"},
                          {"item_id", id},
                          {"output_index", index},
                          {"content_index", 0},
                          {"text", item["content"][0]["text"]}}));
  } else {
    out->push_back(event({{"type", "response.function_call_arguments.done"},
                          {"item_id", id},
                          {"output_index", index},
                          {"arguments", item["arguments"]}}));
  }
  out->push_back(
      event({{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}}));
}

std::vector<std::string> ResponsesBuilder::on_event(int /*prompt*/, const RequestOutput& out) {
  std::vector<std::string> events;
  const ChatDelta delta = reader_.feed(out);
  transcript_.add(delta, out.token_ids);
  const std::string item_prefix = turn_.id.substr(turn_.id.find('_') + 1);
  // Opens an item of `type` unless one is open; returns its index.
  auto open = [&](const std::string& type, ojson item) {
    if (message_ >= 0 && items_[static_cast<size_t>(message_)]["type"] == type &&
        type != "function_call")
      return message_;
    close_open(&events);
    message_ = static_cast<int>(items_.size());
    items_.push_back(std::move(item));
    if (stream_) {
      ojson added = items_.back();
      if (type == "message") added["content"] = ojson::array();
      if (type == "reasoning") added["content"] = ojson::array();
      events.push_back(event(
          {{"type", "response.output_item.added"}, {"output_index", message_}, {"item", added}}));
      if (type == "message") {
        events.push_back(event({{"type", "response.content_part.added"},
                                {"item_id", items_.back()["id"]},
                                {"output_index", message_},
                                {"content_index", 0},
                                {"part", text_part("")}}));
      }
    }
    return message_;
  };
  const std::string n = absl::StrCat(items_.size());
  if (!delta.reasoning.empty()) {
    const int i =
        open("reasoning", {{"type", "reasoning"},
                           {"id", absl::StrCat("rs_", item_prefix, "_", n)},
                           {"summary", ojson::array()},
                           {"content", ojson::array({{{"type", "reasoning_text"}, {"text", ""}}})},
                           {"status", "in_progress"}});
    ojson& item = items_[static_cast<size_t>(i)];
    item["content"][0]["text"] = item["content"][0]["text"].get<std::string>() + delta.reasoning;
    reasoning_ += delta.reasoning;
    if (stream_) {
      events.push_back(event({{"type", "response.reasoning_text.delta"},
                              {"item_id", item["id"]},
                              {"output_index", i},
                              {"content_index", 0},
                              {"delta", delta.reasoning}}));
    }
  }
  if (!delta.content.empty()) {
    const int i = open("message", {{"type", "message"},
                                   {"id", absl::StrCat("msg_", item_prefix, "_", n)},
                                   {"status", "in_progress"},
                                   {"role", "assistant"},
                                   {"content", ojson::array({text_part("")})}});
    ojson& item = items_[static_cast<size_t>(i)];
    item["content"][0]["text"] = item["content"][0]["text"].get<std::string>() + delta.content;
    text_ += delta.content;
    if (stream_) {
      events.push_back(event({{"type", "response.output_text.delta"},
                              {"item_id", item["id"]},
                              {"output_index", i},
                              {"content_index", 0},
                              {"delta", delta.content},
                              {"logprobs", ojson::array()}}));
    }
  }
  for (const ToolCallDelta& call : delta.tool_calls) {
    int i = -1;
    if (call.index < calls_.size()) {
      i = calls_[call.index];
    } else {
      const std::string id = call.id.empty() ? absl::StrCat("call_", call.index) : call.id;
      i = open("function_call", {{"type", "function_call"},
                                 {"id", absl::StrCat("fc_", item_prefix, "_", items_.size())},
                                 {"call_id", id},
                                 {"name", call.name},
                                 {"arguments", ""},
                                 {"status", "in_progress"}});
      calls_.resize(call.index + 1, -1);
      calls_[call.index] = i;
    }
    if (i < 0 || call.arguments.empty()) continue;
    ojson& item = items_[static_cast<size_t>(i)];
    item["arguments"] = item["arguments"].get<std::string>() + call.arguments;
    if (stream_) {
      events.push_back(event({{"type", "response.function_call_arguments.delta"},
                              {"item_id", item["id"]},
                              {"output_index", i},
                              {"delta", call.arguments}}));
    }
  }
  if (!out.finish) return events;
  // The turn's last event.
  prompt_tokens_ = out.prompt_tokens;
  cached_tokens_ = out.cached_tokens;
  completion_tokens_ = out.completion_tokens;
  reason_ = std::string(chat_finish_reason(*out.finish, reader_.made_tool_calls()));
  close_open(&events);
  switch (*out.finish) {
    case FinishReason::kStop:
      status_ = "completed";
      break;
    case FinishReason::kLength:
      status_ = "incomplete";
      break;
    case FinishReason::kCancelled:
      status_ = "cancelled";
      break;
    default:
      status_ = "failed";
      error_ = out.error.empty() ? "the engine failed the request" : out.error;
      break;
  }
  const bool done = status_ == "completed" || status_ == "incomplete";
  if (done) turn_.kept.record(transcript_.message(), transcript_.token_ids(), dump(response()));
  if (stream_) {
    const char* type = status_ == "completed"    ? "response.completed"
                       : status_ == "incomplete" ? "response.incomplete"
                                                 : "response.failed";
    if (status_ != "cancelled") events.push_back(event({{"type", type}, {"response", response()}}));
  }
  return events;
}

std::string ResponsesBuilder::final_json() const { return dump(response()); }

std::string ResponsesBuilder::sse_frame(const std::string& payload) const {
  // The payload's type, without parsing it: every event starts {"type":"...".
  constexpr std::string_view kHead = "{\"type\":\"";
  std::string_view p(payload);
  std::string_view type = "message";
  if (p.substr(0, kHead.size()) == kHead) {
    const size_t end = p.find('"', kHead.size());
    if (end != std::string_view::npos) type = p.substr(kHead.size(), end - kHead.size());
  }
  return absl::StrCat("event: ", std::string(type), "\n", sse_event(payload));
}

}  // namespace loom
