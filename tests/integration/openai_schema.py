"""The parts of OpenAI's published OpenAPI schema (openai/openai-openapi, openapi.yaml) that a client
SDK relies on, written by hand, and a small validator for them (standard library only).

Covered, with their required fields, types, nullability and enums as published:
CreateCompletionResponse (also the completions stream chunk, as OpenAI streams it, with a null
usage before the last chunk),
CreateChatCompletionResponse (ChatCompletionResponseMessage, ChatCompletionMessageToolCall,
the choice's logprobs object with ChatCompletionTokenLogprob), CreateChatCompletionStreamResponse
(ChatCompletionStreamResponseDelta, ChatCompletionMessageToolCallChunk), CompletionUsage, Model,
ListModelsResponse and ErrorResponse/Error. Optional fields the spec lists but Loom never sends
(system_fingerprint, service_tier, audio, annotations, function_call, ...) are left out; extra
fields are allowed, as in the spec. One deliberate extension: finish_reason "abort" (a request cut
by shutdown, docs/api.md).
"""


def nullable(schema):
    return dict(schema, nullable=True)


INT = {"type": "integer"}
NUM = {"type": "number"}
STR = {"type": "string"}

USAGE = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
         "properties": {"prompt_tokens": INT, "completion_tokens": INT, "total_tokens": INT}}

COMPLETION_FINISH = ["stop", "length", "content_filter", "abort"]
CHAT_FINISH = ["stop", "length", "tool_calls", "content_filter", "function_call", "abort"]

COMPLETION_LOGPROBS = {
    "type": "object",
    "properties": {"text_offset": {"type": "array", "items": INT},
                   "token_logprobs": {"type": "array", "items": NUM},
                   "tokens": {"type": "array", "items": STR},
                   "top_logprobs": {"type": "array", "items": {"type": "object"}}}}

CREATE_COMPLETION_RESPONSE = {
    "type": "object", "required": ["id", "object", "created", "model", "choices"],
    "properties": {
        "id": STR, "object": {"type": "string", "enum": ["text_completion"]}, "created": INT,
        "model": STR, "usage": USAGE,
        "choices": {"type": "array", "items": {
            "type": "object", "required": ["finish_reason", "index", "logprobs", "text"],
            "properties": {
                # The stream chunks of OpenAI's completions carry null until the last one.
                "finish_reason": nullable({"type": "string", "enum": COMPLETION_FINISH}),
                "index": INT, "text": STR, "logprobs": nullable(COMPLETION_LOGPROBS)}}}}}

# OpenAI streams completions as CreateCompletionResponse objects; with stream_options.include_usage
# "all other chunks will also include a usage field, but with a null value" (the documented
# behaviour, which the schema does not spell out for completions).
COMPLETION_STREAM_CHUNK = dict(
    CREATE_COMPLETION_RESPONSE,
    properties=dict(CREATE_COMPLETION_RESPONSE["properties"], usage=nullable(USAGE)))

TOP_LOGPROB = {"type": "object", "required": ["token", "logprob", "bytes"],
               "properties": {"token": STR, "logprob": NUM,
                              "bytes": nullable({"type": "array", "items": INT})}}
TOKEN_LOGPROB = {"type": "object", "required": ["token", "logprob", "bytes", "top_logprobs"],
                 "properties": {"token": STR, "logprob": NUM,
                                "bytes": nullable({"type": "array", "items": INT}),
                                "top_logprobs": {"type": "array", "items": TOP_LOGPROB}}}
CHAT_LOGPROBS = {"type": "object", "required": ["content", "refusal"],
                 "properties": {"content": nullable({"type": "array", "items": TOKEN_LOGPROB}),
                                "refusal": nullable({"type": "array", "items": TOKEN_LOGPROB})}}

TOOL_CALL = {"type": "object", "required": ["id", "type", "function"],
             "properties": {"id": STR, "type": {"type": "string", "enum": ["function"]},
                            "function": {"type": "object", "required": ["name", "arguments"],
                                         "properties": {"name": STR, "arguments": STR}}}}

CREATE_CHAT_COMPLETION_RESPONSE = {
    "type": "object", "required": ["choices", "created", "id", "model", "object"],
    "properties": {
        "id": STR, "object": {"type": "string", "enum": ["chat.completion"]}, "created": INT,
        "model": STR, "usage": USAGE,
        "choices": {"type": "array", "items": {
            "type": "object", "required": ["finish_reason", "index", "message", "logprobs"],
            "properties": {
                "finish_reason": {"type": "string", "enum": CHAT_FINISH}, "index": INT,
                "logprobs": nullable(CHAT_LOGPROBS),
                "message": {"type": "object", "required": ["content", "refusal", "role"],
                            "properties": {"content": nullable(STR), "refusal": nullable(STR),
                                           "role": {"type": "string", "enum": ["assistant"]},
                                           "tool_calls": {"type": "array", "items": TOOL_CALL}}}}}}}}

TOOL_CALL_CHUNK = {"type": "object", "required": ["index"],
                   "properties": {"index": INT, "id": STR,
                                  "type": {"type": "string", "enum": ["function"]},
                                  "function": {"type": "object",
                                               "properties": {"name": STR, "arguments": STR}}}}

CREATE_CHAT_COMPLETION_STREAM_RESPONSE = {
    "type": "object", "required": ["choices", "created", "id", "model", "object"],
    "properties": {
        "id": STR, "object": {"type": "string", "enum": ["chat.completion.chunk"]},
        "created": INT, "model": STR, "usage": nullable(USAGE),
        "choices": {"type": "array", "items": {
            "type": "object", "required": ["delta", "finish_reason", "index"],
            "properties": {
                "index": INT, "logprobs": nullable(CHAT_LOGPROBS),
                "finish_reason": nullable({"type": "string", "enum": CHAT_FINISH}),
                "delta": {"type": "object", "properties": {
                    "content": nullable(STR), "refusal": nullable(STR),
                    "role": {"type": "string",
                             "enum": ["developer", "system", "user", "assistant", "tool"]},
                    "tool_calls": {"type": "array", "items": TOOL_CALL_CHUNK}}}}}}}}

MODEL = {"type": "object", "required": ["id", "object", "created", "owned_by"],
         "properties": {"id": STR, "object": {"type": "string", "enum": ["model"]},
                        "created": INT, "owned_by": STR}}

LIST_MODELS_RESPONSE = {"type": "object", "required": ["object", "data"],
                        "properties": {"object": {"type": "string", "enum": ["list"]},
                                       "data": {"type": "array", "items": MODEL}}}

ERROR_RESPONSE = {"type": "object", "required": ["error"],
                  "properties": {"error": {
                      "type": "object", "required": ["type", "message", "param", "code"],
                      "properties": {"type": STR, "message": STR, "param": nullable(STR),
                                     "code": nullable(STR)}}}}

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


def errors(value, schema, path="$"):
    """The ways `value` breaks `schema` (empty: it conforms)."""
    if value is None:
        return [] if schema.get("nullable") else ["%s: null where a %s is required" %
                                                  (path, schema.get("type"))]
    t = schema.get("type")
    if t == "integer":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif t == "number":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        ok = t is None or isinstance(value, _TYPES[t])
    if not ok:
        return ["%s: %r is not a %s" % (path, value, t)]
    out = []
    if "enum" in schema and value not in schema["enum"]:
        out.append("%s: %r not in %s" % (path, value, schema["enum"]))
    if t == "object":
        for key in schema.get("required", []):
            if key not in value:
                out.append("%s: required field '%s' missing" % (path, key))
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                out += errors(value[key], sub, "%s.%s" % (path, key))
    if t == "array" and "items" in schema:
        for i, item in enumerate(value):
            out += errors(item, schema["items"], "%s[%d]" % (path, i))
    return out
