// The official `openai` npm SDK against a running loom-server: completions, chat, streaming,
// tools round trip, n > 1, logprobs, errors, and the Responses API (previous_response_id,
// retrieve, stream, delete), checked field by field.
// Env: LOOM_BASE_URL (e.g. http://127.0.0.1:PORT/v1), LOOM_MODEL, LOOM_NPM_PREFIX (where the SDK is
// installed). Exit 0 when every check passes.
import { createRequire } from 'node:module';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';

const require = createRequire(`${process.env.LOOM_NPM_PREFIX}/package.json`);
const OpenAI = require('openai');
const client = new OpenAI({ baseURL: process.env.LOOM_BASE_URL, apiKey: 'sk-test', maxRetries: 0 });
const model = process.env.LOOM_MODEL;
let checks = 0;
const eq = (a, b, what) => { assert.deepStrictEqual(a, b, what); checks++; };
const ok = (c, what) => { assert.ok(c, what); checks++; };

// The finish reason a choice's token count implies: fewer than max_tokens means something
// stopped it (`stop`: EOS here, no stop strings or ids); exactly max_tokens is `length`, or `stop`
// when the last token allowed was EOS.
function checkFinish(reason, tokens, maxTokens, what) {
  ok(tokens < maxTokens ? reason === 'stop' : ['length', 'stop'].includes(reason),
    `${what}: finish_reason ${reason} after ${tokens} of ${maxTokens} tokens`);
}

function checkUsage(u, what) {
  ok(Number.isInteger(u.prompt_tokens) && u.prompt_tokens > 0, `${what}: prompt_tokens`);
  ok(Number.isInteger(u.completion_tokens) && u.completion_tokens > 0, `${what}: completion_tokens`);
  eq(u.total_tokens, u.prompt_tokens + u.completion_tokens, `${what}: total_tokens`);
}

// models
const models = await client.models.list();
eq(models.data[0].id, model, 'models: id');
eq(models.data[0].object, 'model', 'models: object');
const retrieved = await client.models.retrieve(model);
eq(retrieved.id, model, 'models.retrieve: id');
eq(retrieved, models.data[0], 'models.retrieve: the listed entry');

// completions, non-streaming and streaming with the same seed
const cparams = { model, prompt: 'Once upon a time', max_tokens: 12, seed: 42, temperature: 0.8 };
const c = await client.completions.create(cparams);
eq(c.object, 'text_completion', 'completion: object');
ok(c.id.startsWith('cmpl-'), 'completion: id');
eq(c.model, model, 'completion: model');
ok(Number.isInteger(c.created), 'completion: created');
eq(c.choices.length, 1, 'completion: one choice');
eq(c.choices[0].index, 0, 'completion: index');
ok(typeof c.choices[0].text === 'string', 'completion: text');
checkFinish(c.choices[0].finish_reason, c.usage.completion_tokens, cparams.max_tokens, 'completion');
checkUsage(c.usage, 'completion');
let streamed = '';
let usageChunk = null;
for await (const chunk of await client.completions.create({ ...cparams, stream: true, stream_options: { include_usage: true } })) {
  if (chunk.usage) usageChunk = chunk;
  for (const ch of chunk.choices) streamed += ch.text;
}
eq(streamed, c.choices[0].text, 'completion: streamed text == non-streamed');
ok(usageChunk && usageChunk.choices.length === 0, 'completion: usage chunk has no choices');
eq(usageChunk.usage, c.usage, 'completion: streamed usage == non-streamed');

// chat, non-streaming and streaming
const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello!' }];
const chat = await client.chat.completions.create({ model, messages, max_tokens: 10, seed: 7 });
eq(chat.object, 'chat.completion', 'chat: object');
ok(chat.id.startsWith('chatcmpl-'), 'chat: id');
eq(chat.choices[0].message.role, 'assistant', 'chat: role');
ok(typeof chat.choices[0].message.content === 'string', 'chat: content');
checkFinish(chat.choices[0].finish_reason, chat.usage.completion_tokens, 10, 'chat');
checkUsage(chat.usage, 'chat');
let chatStreamed = '';
let role = null;
let finish = null;
for await (const chunk of await client.chat.completions.create({ model, messages, max_tokens: 10, seed: 7, stream: true })) {
  eq(chunk.object, 'chat.completion.chunk', 'chat stream: object');
  const d = chunk.choices[0].delta;
  if (d.role) role = d.role;
  if (d.content) chatStreamed += d.content;
  if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
}
eq(role, 'assistant', 'chat stream: role');
eq(chatStreamed, chat.choices[0].message.content, 'chat: streamed == non-streamed');
eq(finish, chat.choices[0].finish_reason, 'chat: streamed finish_reason');

// tools round trip: a declared tool, an assistant call and its result
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Current weather',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
const toolMessages = [
  { role: 'user', content: 'Weather in Paris?' },
  { role: 'assistant', content: null, tool_calls: [{ id: 'functions.get_weather:0', type: 'function',
    function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
  { role: 'tool', tool_call_id: 'functions.get_weather:0', content: '22 C, sunny' },
];
// ignore_eos (Loom's extension, passed through by the SDK): only max_tokens ends the turn, so the
// finish is `length`, streamed or not (a call parsed out of a cut turn does not make it
// `tool_calls`).
const tparams = { model, messages: toolMessages, tools, tool_choice: 'auto', max_tokens: 8, seed: 3, ignore_eos: true };
const t = await client.chat.completions.create(tparams);
eq(t.choices[0].message.role, 'assistant', 'tools: role');
eq(t.choices[0].finish_reason, 'length', 'tools: finish_reason (cut by max_tokens)');
eq(t.usage.completion_tokens, 8, 'tools: completion_tokens');
let tStreamed = '';
const tFinish = [];
for await (const chunk of await client.chat.completions.create({ ...tparams, stream: true })) {
  tStreamed += chunk.choices[0]?.delta?.content ?? '';
  if (chunk.choices[0]?.finish_reason) tFinish.push(chunk.choices[0].finish_reason);
}
eq(tStreamed, t.choices[0].message.content ?? '', 'tools: streamed == non-streamed');
eq(tFinish, ['length'], 'tools: streamed finish_reason');
// A stop token forced as the first token (logit_bias +100 on 'A', stop_token_ids, vLLM's
// extension): finish `stop` after 1 token, no call, and the token's text is not output.
const ts = await client.chat.completions.create({ ...tparams, ignore_eos: false, temperature: 0,
  logit_bias: { 65: 100 }, stop_token_ids: [65] });
eq(ts.choices[0].finish_reason, 'stop', 'tools + stop token: finish_reason');
eq(ts.usage.completion_tokens, 1, 'tools + stop token: one token');
eq(ts.choices[0].message.content, '', 'tools + stop token: no text');
ok(ts.choices[0].message.tool_calls === undefined, 'tools + stop token: no call');
await assert.rejects(client.chat.completions.create({ model, messages: toolMessages, tools, tool_choice: 'required' }),
  (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'tool_choice', 'tools: required -> 400');
checks++;

// n > 1
const multi = await client.chat.completions.create({ model, messages, max_tokens: 4, n: 3, seed: 11, ignore_eos: true });
eq(multi.choices.map((x) => x.index), [0, 1, 2], 'n=3: indices');
eq(multi.usage.completion_tokens, 12, 'n=3: usage');
const cmulti = await client.completions.create({ model, prompt: 'abc', max_tokens: 3, n: 2, seed: 5, ignore_eos: true });
eq(cmulti.choices.length, 2, 'completions n=2');

// logprobs
const lp = await client.completions.create({ model, prompt: 'abc', max_tokens: 4, logprobs: 2, seed: 1, ignore_eos: true });
const L = lp.choices[0].logprobs;
eq(L.tokens.length, 4, 'completion logprobs: tokens');
eq(L.token_logprobs.length, 4, 'completion logprobs: token_logprobs');
ok(L.token_logprobs.every((x) => x <= 0), 'completion logprobs: <= 0');
ok(L.top_logprobs.every((m) => Object.keys(m).length >= 1 && Object.keys(m).length <= 2), 'completion logprobs: top');
eq(L.text_offset[0], 0, 'completion logprobs: text_offset');
const clp = await client.chat.completions.create({ model, messages, max_tokens: 3, logprobs: true, top_logprobs: 2, seed: 1, ignore_eos: true });
const content = clp.choices[0].logprobs.content;
eq(content.length, 3, 'chat logprobs: one per token');
for (const e of content) {
  ok(typeof e.token === 'string' && e.logprob <= 0 && Array.isArray(e.bytes), 'chat logprobs: entry');
  eq(e.top_logprobs.length, 2, 'chat logprobs: top_logprobs');
}

// stop_token_ids on completions; an unknown field is a 400 naming it
const st = await client.completions.create({ model, prompt: 'abc', max_tokens: 8, temperature: 0,
  logit_bias: { 65: 100 }, stop_token_ids: [65] });
eq([st.choices[0].finish_reason, st.choices[0].text, st.usage.completion_tokens], ['stop', '', 1],
  'completions stop_token_ids: stop after 1 token, no text');
await assert.rejects(client.completions.create({ model, prompt: 'a', max_tokens: 1, bogus_field: 1 }),
  (e) => e instanceof OpenAI.BadRequestError && e.param === 'bogus_field' &&
    e.message.includes('Unrecognized request argument supplied: bogus_field'), 'unknown field -> 400');
checks++;

// errors in OpenAI's shape
await assert.rejects(client.completions.create({ model, prompt: 'a', max_tokens: -1 }),
  (e) => e instanceof OpenAI.BadRequestError && e.param === 'max_tokens' && e.type === 'invalid_request_error', 'bad max_tokens');
checks++;
await assert.rejects(client.completions.create({ model: 'nope', prompt: 'a' }),
  (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found', 'unknown model');
checks++;

// Responses API: a stored response continued with previous_response_id (the server keeps the
// conversation as an engine session), retrieved, streamed, deleted; 404s in the SDK's classes.
const r1 = await client.responses.create({ model, input: 'Hello', instructions: 'Be brief.',
  max_output_tokens: 6, seed: 3 });
ok(r1.id.startsWith('resp_'), 'responses: id');
eq([r1.object, r1.status === 'completed' || r1.status === 'incomplete', r1.store], ['response', true, true],
  'responses: object, status, store');
ok(typeof r1.output_text === 'string', 'responses: the SDK assembles output_text');
eq(r1.previous_response_id, null, 'responses: no previous');
ok(r1.usage.input_tokens > 0 && r1.usage.output_tokens > 0, 'responses: usage');
eq(r1.usage.total_tokens, r1.usage.input_tokens + r1.usage.output_tokens, 'responses: total_tokens');
const r2 = await client.responses.create({ model, input: 'And then?', previous_response_id: r1.id,
  instructions: 'Be brief.', max_output_tokens: 6, seed: 4 });
eq(r2.previous_response_id, r1.id, 'responses: continued from r1');
ok(Number.isInteger(r2.usage.input_tokens_details.cached_tokens), 'responses: cached_tokens');
// The continued turn continues the whole kept conversation: r1's prompt and r1's reply as sampled
// (this untrained model's replies need not re-tokenize to themselves, so the whole history sent
// at once may encode differently; responses_e2e compares the two where they re-tokenize).
eq(r2.usage.input_tokens_details.cached_tokens, r1.usage.input_tokens + r1.usage.output_tokens,
  'responses: continued the whole kept conversation');
const whole = await client.responses.create({ model, instructions: 'Be brief.', max_output_tokens: 6,
  seed: 4, store: false, input: [
    { role: 'user', content: 'Hello' },
    { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: r1.output_text }] },
    { role: 'user', content: 'And then?' }] });
ok(whole.usage.input_tokens > r1.usage.input_tokens, 'responses: input items hold the history');
eq(whole.store, false, 'responses: store false echoed');
const got = await client.responses.retrieve(r2.id);
eq([got.id, got.output_text], [r2.id, r2.output_text], 'responses.retrieve');
// A third turn, streamed: events in order, deltas adding up to the completed response's text.
const events = [];
let deltas = '';
for await (const ev of await client.responses.create({ model, input: 'Why?', previous_response_id: r2.id,
  max_output_tokens: 6, seed: 5, stream: true })) {
  events.push(ev.type);
  if (ev.type === 'response.output_text.delta') deltas += ev.delta;
  if (ev.type === 'response.completed' || ev.type === 'response.incomplete') {
    eq(ev.response.previous_response_id, r2.id, 'responses stream: continued from r2');
    eq(ev.response.output_text ?? ev.response.output.filter((i) => i.type === 'message')
      .flatMap((i) => i.content).map((c) => c.text).join(''), deltas, 'responses stream: deltas == text');
  }
}
eq(events.slice(0, 2), ['response.created', 'response.in_progress'], 'responses stream: head');
ok(['response.completed', 'response.incomplete'].includes(events.at(-1)), 'responses stream: end');
await client.responses.delete(r2.id);
checks++;
await assert.rejects(client.responses.retrieve(r2.id),
  (e) => e instanceof OpenAI.NotFoundError, 'responses: deleted -> 404');
checks++;
await assert.rejects(client.responses.create({ model, input: 'x', previous_response_id: 'resp_nope' }),
  (e) => e instanceof OpenAI.NotFoundError && e.code === 'previous_response_not_found' &&
    e.param === 'previous_response_id', 'responses: unknown previous_response_id -> 404');
checks++;
await assert.rejects(client.responses.create({ model, input: 'x', background: true }),
  (e) => e instanceof OpenAI.BadRequestError && e.param === 'background', 'responses: background -> 400');
checks++;

const sdkVersion = JSON.parse(readFileSync(`${process.env.LOOM_NPM_PREFIX}/node_modules/openai/package.json`, 'utf8')).version;
console.log(`openai SDK ${sdkVersion}: ${checks} checks passed`);
