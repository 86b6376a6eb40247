#!/usr/bin/python3
"""End-to-end test of loom-server over model folders that carry a checkpoint's own chat template
(Python standard library only).

Each folder is made in a temporary directory: the fixture model's config.json, weights and
generation config (symlinks), plus the chat_template.jinja and tokenizer_config.json of a real
template fixture (../shared/fixtures/chat_templates/<name>). The model is the untrained kimi_linear
fixture with the byte-level tokenizer, so generated text is noise and is never asserted on by
itself; what is asserted:

- the startup lines name the folder's template, the tool-call syntax probed from it (DeepSeek-V3.1's
  on a kimi_linear model: the template decides, not model_type; Kimi-K2-Instruct's template writes
  no calls, so the kimi family's) and whether reasoning is split off;
- chat requests with tools, chat_template_kwargs and an assistant message with reasoning_content
  answer 200 with bodies and stream chunks that follow OpenAI's schema;
- the rendered prompt (/tokenize then /detokenize) is the template's: chat_template_kwargs switch
  DeepSeek-V3.1's thinking, and Kimi-K2-Thinking writes the history's reasoning_content;
- the reasoning split, against the unsplit text of the same greedy request on a server started
  with --reasoning_parser=none: with thinking on, the prompt opens <think> and the reply up to
  </think> is reasoning_content, streamed (delta.reasoning_content) and not; with thinking off
  there is no reasoning and the content is the whole text;
- malformed requests are 400s naming the problem: a chat_template_kwargs entry the template may not
  take, reasoning_content on a user message; a bad --reasoning_parser value stops the server.
"""
import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile

import openai_schema
from checks import check, summary
from loom_server_process import LoomServer

ARGS = None

USER = {"role": "user", "content": "What time is it?"}
TOOLS = [{"type": "function", "function": {
    "name": "get_time", "description": "The current time.",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}]
# An earlier turn: reasoning, a call and its result (Kimi-K2-Thinking prints reasoning_content for
# assistant turns after the last plain assistant reply).
HISTORY = [
    {"role": "user", "content": "Time?"},
    {"role": "assistant", "content": "", "reasoning_content": "I should call get_time.",
     "tool_calls": [{"id": "functions.get_time:0", "type": "function",
                     "function": {"name": "get_time", "arguments": "{\"tz\": \"UTC\"}"}}]},
    {"role": "tool", "tool_call_id": "functions.get_time:0", "content": "12:00"},
]


def model_folder(template):
    """A temporary model folder: the fixture model with `template`'s chat template files."""
    d = tempfile.mkdtemp(prefix="loom-chat-%s-" % template)
    for f in ("config.json", "model.safetensors", "generation_config.json"):
        if os.path.exists(os.path.join(ARGS.model, f)):
            os.symlink(os.path.join(ARGS.model, f), os.path.join(d, f))
    for f in ("chat_template.jinja", "tokenizer_config.json"):
        os.symlink(os.path.join(ARGS.templates, template, f), os.path.join(d, f))
    return d


def post(port, path, body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", path, body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    raw = resp.read()
    conn.close()
    parsed = json.loads(raw)
    if path == "/v1/chat/completions":
        schema = (openai_schema.CREATE_CHAT_COMPLETION_RESPONSE if resp.status == 200
                  else openai_schema.ERROR_RESPONSE)
        errs = openai_schema.errors(parsed, schema)
        check(not errs, "%s %d: not OpenAI's schema: %s" % (path, resp.status, errs[:3]))
    return resp.status, parsed


def stream_chat(port, body):
    """Streams a chat request; returns (status, reasoning, content, tool-call count)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(dict(body, stream=True)).encode(),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    reasoning, content, calls = "", "", 0
    for line in resp.read().decode().split("\n"):
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[len("data: "):])
        errs = openai_schema.errors(chunk, openai_schema.CREATE_CHAT_COMPLETION_STREAM_RESPONSE)
        check(not errs, "chat chunk: not OpenAI's schema: %s" % errs[:3])
        for choice in chunk["choices"]:
            delta = choice["delta"]
            reasoning += delta.get("reasoning_content") or ""
            content += delta.get("content") or ""
            calls += sum(1 for t in delta.get("tool_calls", []) if "id" in t)
    conn.close()
    return resp.status, reasoning, content, calls


def prompt_text(port, body):
    """The prompt the server renders for a chat body (/tokenize, then /detokenize)."""
    status, tokens = post(port, "/tokenize", body)
    if not check(status == 200, "/tokenize: %d %s" % (status, tokens)):
        return ""
    status, text = post(port, "/detokenize", {"tokens": tokens["tokens"]})
    check(status == 200, "/detokenize: %d" % status)
    return text.get("prompt", "")


def startup_check(server, template_dir, syntax, reasoning):
    lines = "".join(server.startup_lines)
    check("chat template the model's %s" % os.path.join(template_dir, "chat_template.jinja")
          in lines, "startup names the template: %s" % lines)
    check("chat replies: tool calls in %s syntax" % syntax in lines,
          "startup says tool calls in %s syntax: %s" % (syntax, lines))
    check(("reasoning: %s" % reasoning) in lines,
          "startup says reasoning: %s: %s" % (reasoning, lines))


def greedy(messages, **extra):
    body = {"messages": messages, "tools": TOOLS, "max_tokens": 12, "temperature": 0,
            "ignore_eos": True}
    body.update(extra)
    return body


def test_deepseek_v31(dirs):
    d = dirs["deepseek_v3_1"]
    with LoomServer(ARGS.server, d) as split, \
            LoomServer(ARGS.server, d, "--reasoning_parser=none") as raw:
        # On a kimi_linear model the template's syntax wins over the kimi family's.
        startup_check(split, d, "deepseek_v3.1", "<think> blocks -> reasoning_content")
        startup_check(raw, d, "deepseek_v3.1", "off (--reasoning_parser=none)")
        messages = HISTORY + [USER]
        for thinking in (True, False):
            body = greedy(messages, chat_template_kwargs={"thinking": thinking})
            prompt = prompt_text(split.port, body)
            opener = "<｜Assistant｜><think>" if thinking else "<｜Assistant｜></think>"
            check(prompt.endswith(opener),
                  "thinking=%s: the prompt ends with %r: %r" % (thinking, opener, prompt[-60:]))
            status, unsplit = post(raw.port, "/v1/chat/completions", body)
            check(status == 200, "reasoning_parser=none: %d %s" % (status, unsplit))
            status, reply = post(split.port, "/v1/chat/completions", body)
            if not check(status == 200, "thinking=%s: %d %s" % (thinking, status, reply)):
                continue
            text = unsplit["choices"][0]["message"]["content"] or ""
            check("reasoning_content" not in unsplit["choices"][0]["message"],
                  "reasoning_parser=none sends no reasoning_content")
            message = reply["choices"][0]["message"]
            check("reasoning_content" in message, "reasoning_content is sent: %s" % message)
            got_reasoning = message.get("reasoning_content") or ""
            got_content = message.get("content") or ""
            if thinking:
                # The prompt opened the block: the reply up to </think> is reasoning.
                want_reasoning = text.split("</think>", 1)[0]
                check(got_reasoning == want_reasoning,
                      "thinking: reasoning %r != %r" % (got_reasoning, want_reasoning))
                if "</think>" not in text:
                    check(got_content == "", "thinking, no </think>: content %r" % got_content)
            else:
                # The prompt closed it: a reply that does not open one has no reasoning.
                check(text.startswith("<think>") or got_reasoning == "",
                      "no thinking: reasoning %r" % got_reasoning)
                if not text.startswith("<think>") and "<｜tool▁calls▁begin｜>" not in text:
                    check(got_content == text, "no thinking: content %r != %r" % (got_content, text))
            status, s_reasoning, s_content, _ = stream_chat(split.port, body)
            check(status == 200, "stream thinking=%s: %d" % (thinking, status))
            check((s_reasoning, s_content) == (got_reasoning, got_content),
                  "thinking=%s: streamed (%r, %r) != (%r, %r)" %
                  (thinking, s_reasoning, s_content, got_reasoning, got_content))
        # Malformed requests name the problem.
        status, err = post(split.port, "/v1/chat/completions",
                           greedy([USER], chat_template_kwargs={"add_generation_prompt": False}))
        check(status == 400 and err["error"]["param"] == "chat_template_kwargs" and
              "add_generation_prompt" in err["error"]["message"] and
              "chat_template.jinja" in err["error"]["message"],
              "a reserved chat_template_kwargs entry is a 400 naming it: %d %s" % (status, err))
        status, err = post(split.port, "/v1/chat/completions",
                           greedy([dict(USER, reasoning_content="r")]))
        check(status == 400 and err["error"]["param"] == "messages[0].reasoning_content",
              "reasoning_content on a user message is a 400 naming it: %d %s" % (status, err))


def test_kimi_k2_thinking(dirs):
    d = dirs["kimi_k2_thinking"]
    with LoomServer(ARGS.server, d) as server:
        startup_check(server, d, "kimi", "<think> blocks -> reasoning_content")
        body = greedy(HISTORY + [USER])
        prompt = prompt_text(server.port, body)
        check("<think>I should call get_time.</think><|tool_calls_section_begin|>"
              "<|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>{\"tz\": \"UTC\"}"
              "<|tool_call_end|><|tool_calls_section_end|>" in prompt,
              "the template writes the history's reasoning_content and call: %r" % prompt)
        check(prompt.endswith("<|im_assistant|>assistant<|im_middle|>"), "prompt end: %r" %
              prompt[-60:])
        status, reply = post(server.port, "/v1/chat/completions", body)
        check(status == 200, "chat: %d %s" % (status, reply))
        if status == 200:
            check("reasoning_content" in reply["choices"][0]["message"],
                  "reasoning_content is sent: %s" % reply)


def test_kimi_k2(dirs):
    d = dirs["kimi_k2"]
    with LoomServer(ARGS.server, d) as server:
        # Its template prints no tool calls: the kimi family's syntax, and no reasoning.
        startup_check(server, d, "kimi", "off (the chat template writes no </think>)")
        check("the kimi family's" in "".join(server.startup_lines),
              "startup says the syntax is the family's: %s" % server.startup_lines)
        status, reply = post(server.port, "/v1/chat/completions", greedy([USER]))
        check(status == 200, "chat: %d %s" % (status, reply))
        if status == 200:
            check("reasoning_content" not in reply["choices"][0]["message"],
                  "no reasoning_content without reasoning: %s" % reply)


def test_bad_flag(dirs):
    proc = subprocess.run([ARGS.server, "--model", dirs["kimi_k2"], "--port", "0",
                           "--reasoning_parser=sometimes"], capture_output=True, timeout=60)
    check(proc.returncode != 0 and b"--reasoning_parser: must be auto or none" in proc.stderr,
          "a bad --reasoning_parser stops the server: %d %r" % (proc.returncode, proc.stderr))


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--server", required=True)
    p.add_argument("--model", required=True, help="a fixture model folder (no chat template)")
    p.add_argument("--templates", required=True, help="the chat_templates fixture folder")
    ARGS = p.parse_args()
    dirs = {name: model_folder(name) for name in ("deepseek_v3_1", "kimi_k2_thinking", "kimi_k2")}
    try:
        for test in (test_deepseek_v31, test_kimi_k2_thinking, test_kimi_k2, test_bad_flag):
            print("==", test.__name__, flush=True)
            test(dirs)
    finally:
        for d in dirs.values():
            shutil.rmtree(d, ignore_errors=True)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
