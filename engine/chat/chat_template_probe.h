// What a checkpoint's own chat template says about the text its model generates, found by
// rendering a conversation whose assistant turn carries known tool calls and reasoning (the
// probe), so a checkpoint is read in the syntax its template writes rather than the one its
// family usually has (DeepSeek-V3 and V3.1 share model_type but not their tool-call syntax).
#pragma once

#include <optional>

#include "engine/chat/checkpoint_chat_template.h"
#include "engine/chat/tool_call_parser.h"

namespace loom {

// The syntax whose parser recovers exactly the probe's two tool calls (names, arguments as JSON
// values, and Kimi's ids) from the assistant turn the template renders; the first in
// kToolCallSyntaxes order if several would. nullopt when none does: the template drops tool calls
// (Kimi-K2-Instruct's), writes them some other way, or fails on the probe conversation.
std::optional<ToolCallSyntax> probe_tool_call_syntax(const CheckpointChatTemplate& chat_template);

// Whether the template writes reasoning blocks: rendering the probe, generation prompt or
// assistant turn, writes </think>.
bool template_renders_reasoning(const CheckpointChatTemplate& chat_template);

}  // namespace loom
