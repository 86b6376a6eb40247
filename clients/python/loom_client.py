"""Python client of loom-server's gRPC API (proto/loom/v1/loom.proto).

Needs grpcio and protobuf (Debian: python3-grpcio python3-protobuf) and the message modules that
the build generates with protoc into build/python (target loom_python_client, which also copies
this file there):

    PYTHONPATH=build/python python3 -m loom_client --target 127.0.0.1:50051 generate "Hello"

The gRPC method glue is written here with grpcio's generic channel.unary_unary / unary_stream, so
no grpcio-tools (and no *_pb2_grpc.py) is needed.
"""

import argparse
import os
import sys

import grpc

try:
    from loom.v1 import loom_pb2
    import health_pb2
    import reflection_pb2
except ImportError as e:  # pragma: no cover - a setup error, explained
    raise ImportError(
        "loom_client needs the generated protobuf modules: build the CMake target "
        "loom_python_client and put <build>/python on PYTHONPATH (%s)" % e) from e

_SERVICE = "/loom.v1.Loom/"
_FINISH = {
    loom_pb2.FINISH_REASON_UNSPECIFIED: None,
    loom_pb2.FINISH_REASON_STOP: "stop",
    loom_pb2.FINISH_REASON_LENGTH: "length",
    loom_pb2.FINISH_REASON_CANCELLED: "cancelled",
    loom_pb2.FINISH_REASON_ERROR: "error",
    loom_pb2.FINISH_REASON_TOOL_CALLS: "tool_calls",
}
_SAMPLING_FIELDS = [f.name for f in loom_pb2.SamplingParams.DESCRIPTOR.fields]


def _record_finish(choice, msg):
    """A choice's final message (Generate's or Chat's) sets its finish reason, usage and error."""
    if msg.finish_reason != loom_pb2.FINISH_REASON_UNSPECIFIED:
        choice["finish_reason"] = finish_reason_name(msg.finish_reason)
        choice["prompt_tokens"] = msg.usage.prompt_tokens
        choice["completion_tokens"] = msg.usage.completion_tokens
        if hasattr(msg, "session_id"):  # Chat's
            choice["cached_tokens"] = msg.usage.cached_tokens
            choice["session_id"] = msg.session_id
        if msg.error:
            choice["error"] = msg.error


def finish_reason_name(value):
    """FinishReason enum value -> "stop", "length", "cancelled", "error", "tool_calls" or None."""
    return _FINISH.get(value)


class LoomClient:
    """A connection to one loom-server. Thread-safe (grpc channels are). Errors are raised as
    grpc.RpcError (e.code() is grpc.StatusCode.INVALID_ARGUMENT for a bad request)."""

    def __init__(self, target, timeout=None, channel=None, api_key=None):
        """target: "host:port". timeout: default deadline in seconds for every call (None: none).
        api_key: sent as metadata `authorization: Bearer KEY` on every call (servers started with
        --api_key; health checks need none)."""
        self.channel = channel or grpc.insecure_channel(target)
        self.timeout = timeout
        self.metadata = (("authorization", "Bearer " + api_key),) if api_key else None
        ser = lambda m: m.SerializeToString()  # noqa: E731
        self._generate = self.channel.unary_stream(
            _SERVICE + "Generate", request_serializer=ser,
            response_deserializer=loom_pb2.GenerateResponse.FromString)
        self._chat = self.channel.unary_stream(
            _SERVICE + "Chat", request_serializer=ser,
            response_deserializer=loom_pb2.ChatResponse.FromString)
        self._tokenize = self.channel.unary_unary(
            _SERVICE + "Tokenize", request_serializer=ser,
            response_deserializer=loom_pb2.TokenizeResponse.FromString)
        self._detokenize = self.channel.unary_unary(
            _SERVICE + "Detokenize", request_serializer=ser,
            response_deserializer=loom_pb2.DetokenizeResponse.FromString)
        self._model_info = self.channel.unary_unary(
            _SERVICE + "GetModelInfo", request_serializer=ser,
            response_deserializer=loom_pb2.GetModelInfoResponse.FromString)
        self._delete_session = self.channel.unary_unary(
            _SERVICE + "DeleteSession", request_serializer=ser,
            response_deserializer=loom_pb2.DeleteSessionResponse.FromString)
        self._stats = self.channel.unary_unary(
            _SERVICE + "GetStats", request_serializer=ser,
            response_deserializer=loom_pb2.GetStatsResponse.FromString)
        self._health = self.channel.unary_unary(
            "/grpc.health.v1.Health/Check", request_serializer=ser,
            response_deserializer=health_pb2.HealthCheckResponse.FromString)
        self._reflection = self.channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=ser,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)

    def close(self):
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _t(self, timeout):
        return self.timeout if timeout is None else timeout

    @staticmethod
    def make_request(prompt, priority=0, request_id="", parse_special_tokens=False, **sampling):
        """A GenerateRequest: `prompt` is a str (tokenized by the server) or a list of token ids;
        `sampling` takes the fields of loom.v1.SamplingParams (temperature, top_k, top_p, min_p,
        repetition_penalty, presence_penalty, frequency_penalty, seed, max_tokens, min_tokens,
        ignore_eos, stop_token_ids, stop, logprobs, n, logit_bias as {token id: bias})."""
        unknown = set(sampling) - set(_SAMPLING_FIELDS)
        if unknown:
            raise TypeError("unknown sampling fields: %s" % ", ".join(sorted(unknown)))
        req = loom_pb2.GenerateRequest(priority=priority, request_id=request_id,
                                       parse_special_tokens=parse_special_tokens)
        if isinstance(prompt, str):
            req.text = prompt
        else:
            req.token_ids.ids.extend(int(t) for t in prompt)
        for k, v in sampling.items():
            if v is None:
                continue
            if isinstance(v, dict):  # logit_bias: {token id: bias}
                getattr(req.sampling, k).update({int(t): float(b) for t, b in v.items()})
            elif isinstance(v, (list, tuple)):
                getattr(req.sampling, k).extend(v)
            else:
                setattr(req.sampling, k, v)
        return req

    def generate(self, prompt, timeout=None, **kwargs):
        """Streams GenerateResponse messages (fields: index, token_ids, text, logprobs,
        finish_reason, error, usage). The returned iterator is also a grpc.Call: call its
        .cancel() to stop the request (the server cancels it in the engine)."""
        return self._generate(self.make_request(prompt, **kwargs), timeout=self._t(timeout),
                              metadata=self.metadata)

    def generate_text(self, prompt, timeout=None, **kwargs):
        """Runs a request to the end. Returns one dict per choice: text, token_ids, logprobs
        (list of TokenLogprob), finish_reason, prompt_tokens, completion_tokens."""
        choices = {}
        for msg in self.generate(prompt, timeout=timeout, **kwargs):
            c = choices.setdefault(msg.index, {"text": "", "token_ids": [], "logprobs": [],
                                               "finish_reason": None, "prompt_tokens": 0,
                                               "completion_tokens": 0})
            c["text"] += msg.text
            c["token_ids"].extend(msg.token_ids)
            c["logprobs"].extend(msg.logprobs)
            _record_finish(c, msg)
        return [choices[i] for i in sorted(choices)]

    @staticmethod
    def make_chat_request(messages, tools=None, tool_choice=None, priority=0, request_id="",
                          parse_special_tokens=False, chat_template_kwargs=None, session_id="",
                          session_must_exist=False, store=None, **sampling):
        """A ChatRequest from OpenAI-shaped arguments. messages: dicts with role, content and, as
        OpenAI has them, name, tool_call_id, reasoning_content and tool_calls ([{"id", "function":
        {"name", "arguments"}}]). tools: OpenAI function tools ({"type": "function", "function":
        {"name", "description", "parameters"}}) or flat {"name", "description", "parameters"};
        parameters a dict (sent as JSON text, key order kept) or a JSON string. tool_choice:
        "auto", "none", "required" or {"type": "function", "function": {"name": ...}}.
        chat_template_kwargs: a dict. session_id: a turn of the session the server keeps under
        that id (messages: only the turn's new ones); session_must_exist: NOT_FOUND rather than
        starting it; store: False to leave the session as it was. `sampling` as in
        make_request."""
        import json
        req = loom_pb2.ChatRequest(priority=priority, request_id=request_id,
                                   parse_special_tokens=parse_special_tokens,
                                   session_id=session_id, session_must_exist=session_must_exist)
        if store is not None:
            req.store = store
        for m in messages:
            unknown = set(m) - {"role", "content", "name", "tool_call_id", "reasoning_content",
                                "tool_calls"}
            if unknown:
                raise TypeError("unknown message fields: %s" % ", ".join(sorted(unknown)))
            pm = req.messages.add(role=m["role"], name=m.get("name") or "")
            for key in ("content", "tool_call_id", "reasoning_content"):
                if m.get(key) is not None:
                    setattr(pm, key, m[key])
            for c in m.get("tool_calls") or []:
                fn = c.get("function", c)
                pm.tool_calls.add(id=c.get("id") or "", name=fn["name"],
                                  arguments=fn.get("arguments", ""))
        for t in tools or []:
            fn = t.get("function", t)
            params = fn.get("parameters")
            if params is not None and not isinstance(params, str):
                params = json.dumps(params)
            req.tools.add(name=fn.get("name", ""), description=fn.get("description") or "",
                          parameters=params or "")
        if isinstance(tool_choice, str):
            req.tool_choice_mode = tool_choice
        elif tool_choice is not None:
            req.tool_choice_function = tool_choice.get("function", tool_choice)["name"]
        if chat_template_kwargs is not None:
            req.chat_template_kwargs = json.dumps(chat_template_kwargs)
        req.sampling.CopyFrom(LoomClient.make_request([0], **sampling).sampling)
        return req

    def chat(self, messages, timeout=None, **kwargs):
        """Streams ChatResponse messages (fields: index, content, reasoning_content, tool_calls
        (ToolCallDelta: index, id, name, arguments), token_ids, logprobs, finish_reason, error,
        usage). Arguments as make_chat_request. The iterator is also a grpc.Call (.cancel())."""
        return self._chat(self.make_chat_request(messages, **kwargs), timeout=self._t(timeout),
                          metadata=self.metadata)

    def chat_reply(self, messages, timeout=None, **kwargs):
        """Runs a chat to the end. Returns one dict per choice: content, reasoning_content,
        tool_calls (OpenAI-shaped: [{"id", "type", "function": {"name", "arguments"}}], the
        streamed deltas reassembled), token_ids, logprobs, finish_reason, prompt_tokens,
        completion_tokens, cached_tokens (a session turn: prompt tokens continued from the
        session's kept cache) and session_id."""
        choices = {}
        for msg in self.chat(messages, timeout=timeout, **kwargs):
            c = choices.setdefault(msg.index, {"content": "", "reasoning_content": "",
                                               "tool_calls": [], "token_ids": [], "logprobs": [],
                                               "finish_reason": None, "prompt_tokens": 0,
                                               "completion_tokens": 0})
            c["content"] += msg.content
            c["reasoning_content"] += msg.reasoning_content
            for d in msg.tool_calls:
                while len(c["tool_calls"]) <= d.index:
                    c["tool_calls"].append({"id": "", "type": "function",
                                            "function": {"name": "", "arguments": ""}})
                call = c["tool_calls"][d.index]
                call["id"] = call["id"] or d.id
                call["function"]["name"] = call["function"]["name"] or d.name
                call["function"]["arguments"] += d.arguments
            c["token_ids"].extend(msg.token_ids)
            c["logprobs"].extend(msg.logprobs)
            _record_finish(c, msg)
        return [choices[i] for i in sorted(choices)]

    def delete_session(self, session_id, timeout=None):
        """Deletes a Chat session (grpc.RpcError NOT_FOUND when there is none)."""
        self._delete_session(loom_pb2.DeleteSessionRequest(session_id=session_id),
                             timeout=self._t(timeout), metadata=self.metadata)

    def tokenize(self, text, parse_special_tokens=False, timeout=None):
        """Text -> list of token ids."""
        req = loom_pb2.TokenizeRequest(text=text, parse_special_tokens=parse_special_tokens)
        return list(self._tokenize(req, timeout=self._t(timeout), metadata=self.metadata).token_ids)

    def detokenize(self, token_ids, skip_special_tokens=False, timeout=None):
        """List of token ids -> text."""
        req = loom_pb2.DetokenizeRequest(token_ids=token_ids,
                                         skip_special_tokens=skip_special_tokens)
        return self._detokenize(req, timeout=self._t(timeout), metadata=self.metadata).text

    def model_info(self, timeout=None):
        """A GetModelInfoResponse (model_name, model_type, vocab_size, max_model_len, ...)."""
        return self._model_info(loom_pb2.GetModelInfoRequest(), timeout=self._t(timeout),
                                metadata=self.metadata)

    def stats(self, timeout=None):
        """A GetStatsResponse: the engine's counters (pages_free, slots_free, running, ...)."""
        return self._stats(loom_pb2.GetStatsRequest(), timeout=self._t(timeout),
                           metadata=self.metadata)

    def health(self, service="", timeout=None):
        """grpc.health.v1 Check: "SERVING", "NOT_SERVING", "UNKNOWN" or "SERVICE_UNKNOWN"."""
        resp = self._health(health_pb2.HealthCheckRequest(service=service),
                            timeout=self._t(timeout))
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)

    def list_services(self, timeout=None):
        """Server reflection: the fully qualified names of the services served."""
        resp = self._reflect(reflection_pb2.ServerReflectionRequest(list_services=""), timeout)
        return [s.name for s in resp.list_services_response.service]

    def file_containing_symbol(self, symbol, timeout=None):
        """Server reflection: serialized FileDescriptorProtos defining `symbol` (and its deps)."""
        resp = self._reflect(
            reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol), timeout)
        if resp.HasField("error_response"):
            raise LookupError(resp.error_response.error_message)
        return list(resp.file_descriptor_response.file_descriptor_proto)

    def _reflect(self, request, timeout):
        return next(iter(self._reflection(iter([request]), timeout=self._t(timeout),
                                          metadata=self.metadata)))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="loom_client", description="loom-server gRPC client")
    ap.add_argument("--target", default="127.0.0.1:50051", help="host:port of loom-server")
    ap.add_argument("--timeout", type=float, default=None, help="deadline per call, seconds")
    ap.add_argument("--api-key", default=os.environ.get("LOOM_API_KEY"),
                    help="for servers started with --api_key (default: $LOOM_API_KEY)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="stream a completion")
    g.add_argument("prompt", help="prompt text (or comma-separated ids with --ids)")
    g.add_argument("--ids", action="store_true", help="the prompt is token ids: 1,2,3")
    g.add_argument("--max-tokens", type=int, default=None)
    g.add_argument("--temperature", type=float, default=None)
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=[])
    g.add_argument("--n", type=int, default=None)
    g.add_argument("--show-ids", action="store_true", help="print token ids, not text")
    ch = sub.add_parser("chat", help="stream a chat reply to one user message")
    ch.add_argument("message", help="the user's message")
    ch.add_argument("--system", default=None, help="a system message before it")
    ch.add_argument("--tools", default=None, help="a JSON file of OpenAI function tools")
    ch.add_argument("--max-tokens", type=int, default=None)
    ch.add_argument("--temperature", type=float, default=None)
    ch.add_argument("--seed", type=int, default=None)
    t = sub.add_parser("tokenize", help="text -> token ids")
    t.add_argument("text")
    d = sub.add_parser("detokenize", help="token ids -> text")
    d.add_argument("ids", help="comma-separated token ids")
    sub.add_parser("info", help="model info")
    sub.add_parser("stats", help="engine counters")
    sub.add_parser("health", help="grpc.health.v1 status")
    sub.add_parser("services", help="services listed by server reflection")
    a = ap.parse_args(argv)

    with LoomClient(a.target, timeout=a.timeout, api_key=a.api_key) as c:
        try:
            if a.cmd == "generate":
                prompt = [int(x) for x in a.prompt.split(",")] if a.ids else a.prompt
                stream = c.generate(prompt, max_tokens=a.max_tokens, temperature=a.temperature,
                                    top_p=a.top_p, top_k=a.top_k, seed=a.seed, stop=a.stop,
                                    n=a.n)
                for msg in stream:
                    out = " ".join(map(str, msg.token_ids)) + " " if a.show_ids else msg.text
                    sys.stdout.write(out)
                    sys.stdout.flush()
                    if msg.finish_reason:
                        sys.stdout.write("\n[choice %d: %s, %d prompt + %d completion tokens]\n" % (
                            msg.index, finish_reason_name(msg.finish_reason),
                            msg.usage.prompt_tokens, msg.usage.completion_tokens))
            elif a.cmd == "chat":
                import json
                messages = ([{"role": "system", "content": a.system}] if a.system else []) + [
                    {"role": "user", "content": a.message}]
                tools = None
                if a.tools:
                    with open(a.tools) as f:
                        tools = json.load(f)
                for msg in c.chat(messages, tools=tools, max_tokens=a.max_tokens,
                                  temperature=a.temperature, seed=a.seed):
                    sys.stdout.write(msg.reasoning_content + msg.content)
                    for d in msg.tool_calls:
                        sys.stdout.write("\n[tool call %d: %s] %s" % (d.index, d.name, d.arguments)
                                         if d.id else d.arguments)
                    sys.stdout.flush()
                    if msg.finish_reason:
                        sys.stdout.write("\n[%s, %d prompt + %d completion tokens]\n" % (
                            finish_reason_name(msg.finish_reason), msg.usage.prompt_tokens,
                            msg.usage.completion_tokens))
            elif a.cmd == "tokenize":
                print(",".join(map(str, c.tokenize(a.text))))
            elif a.cmd == "detokenize":
                print(c.detokenize([int(x) for x in a.ids.split(",")]))
            elif a.cmd == "info":
                print(c.model_info(), end="")
            elif a.cmd == "stats":
                print(c.stats(), end="")
            elif a.cmd == "health":
                print(c.health())
            elif a.cmd == "services":
                print("\n".join(c.list_services()))
        except grpc.RpcError as e:
            print("error: %s: %s" % (e.code().name, e.details()), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
