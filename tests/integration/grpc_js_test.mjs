// loom.v1 from Node's @grpc/grpc-js (with @grpc/proto-loader reading proto/loom/v1/loom.proto)
// against a running loom-server --deterministic: Chat with tools gives HTTP's prompt and reply,
// tool-call deltas reassemble, a 3-turn session sending only new messages gives the whole
// history's tokens, DeleteSession then NOT_FOUND, and the error codes of refusals.
// Env: LOOM_GRPC_TARGET (host:port), LOOM_HTTP_URL (http://host:port), LOOM_PROTO_DIR (proto/),
// LOOM_NPM_PREFIX (where the packages are installed). Exit 0 when every check passes.
import { createRequire } from 'node:module';
import assert from 'node:assert/strict';

const require = createRequire(`${process.env.LOOM_NPM_PREFIX}/package.json`);
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const def = protoLoader.loadSync('loom/v1/loom.proto', {
  includeDirs: [process.env.LOOM_PROTO_DIR], keepCase: true, longs: String, enums: String,
  defaults: true, oneofs: true,
});
const loom = grpc.loadPackageDefinition(def).loom.v1;
const client = new loom.Loom(process.env.LOOM_GRPC_TARGET, grpc.credentials.createInsecure());
let checks = 0;
const eq = (a, b, what) => { assert.deepStrictEqual(a, b, what); checks++; };
const ok = (c, what) => { assert.ok(c, what); checks++; };

// One Chat call to its end: the reply reassembled from its messages.
function chat(request) {
  return new Promise((resolve, reject) => {
    const reply = { content: '', tool_calls: [], token_ids: [], finish_reason: null, usage: null,
      session_ids: new Set() };
    const call = client.Chat(request, { deadline: Date.now() + 120000 });
    call.on('data', (m) => {
      reply.content += m.content;
      for (const d of m.tool_calls) {
        while (reply.tool_calls.length <= d.index) reply.tool_calls.push({ id: '', name: '', arguments: '' });
        const c = reply.tool_calls[d.index];
        c.id ||= d.id;
        c.name ||= d.name;
        c.arguments += d.arguments;
      }
      reply.token_ids.push(...m.token_ids);
      reply.session_ids.add(m.session_id);
      if (m.finish_reason !== 'FINISH_REASON_UNSPECIFIED') {
        reply.finish_reason = m.finish_reason;
        reply.usage = m.usage;
      }
    });
    call.on('error', reject);
    call.on('end', () => resolve(reply));
  });
}

const unary = (method, request) => new Promise((resolve, reject) =>
  client[method](request, { deadline: Date.now() + 30000 }, (err, resp) => (err ? reject(err) : resolve(resp))));

async function httpChat(body) {
  const r = await fetch(`${process.env.LOOM_HTTP_URL}/v1/chat/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  eq(r.status, 200, 'http chat status');
  return r.json();
}

const msg = (role, content, extra = {}) => ({ role, content, ...extra });
const toolSchema = { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] };
const tools = [{ name: 'get_weather', description: 'Weather of a city', parameters: JSON.stringify(toolSchema) }];
const httpTools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
  parameters: toolSchema } }];

// Chat with tools, a call and its result: HTTP's prompt and, greedy, HTTP's reply.
const conversation = [
  msg('user', 'Weather in Paris?'),
  { role: 'assistant', content: '', tool_calls: [{ id: 'call_0', name: 'get_weather', arguments: '{"city": "Paris"}' }] },
  msg('tool', 'sunny', { tool_call_id: 'call_0' }),
];
const greedy = { temperature: 0, max_tokens: 12 };
const r = await chat({ messages: conversation, tools, tool_choice_mode: 'auto', sampling: greedy });
const h = await httpChat({ messages: [conversation[0],
  { role: 'assistant', content: '', tool_calls: [{ id: 'call_0', type: 'function',
    function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
  { role: 'tool', tool_call_id: 'call_0', content: 'sunny' }], tools: httpTools, temperature: 0, max_tokens: 12 });
eq(r.usage.prompt_tokens, h.usage.prompt_tokens, 'tools: prompt tokens == HTTP');
eq(r.usage.completion_tokens, h.usage.completion_tokens, 'tools: completion tokens == HTTP');
eq(r.content, h.choices[0].message.content ?? '', 'tools: content == HTTP');
eq(r.tool_calls.map((c) => [c.id, c.name, c.arguments]),
  (h.choices[0].message.tool_calls ?? []).map((c) => [c.id, c.function.name, c.function.arguments]),
  'tools: calls == HTTP');
eq(r.finish_reason, { stop: 'FINISH_REASON_STOP', length: 'FINISH_REASON_LENGTH',
  tool_calls: 'FINISH_REASON_TOOL_CALLS' }[h.choices[0].finish_reason], 'tools: finish reason == HTTP');

// A session: each turn only its new message; the whole history sent at once gives the same.
const history = [msg('system', 'Be brief.')];
const cached = [];
for (const [k, [text, seed]] of [['Hello', 1], ['And then?', 6], ['Why?', 5]].entries()) {
  const sampling = { temperature: 0.8, max_tokens: 1, seed: String(seed) };
  const turn = await chat({ messages: (k === 0 ? [history[0]] : []).concat([msg('user', text)]),
    session_id: 'js-session', session_must_exist: k > 0, sampling });
  history.push(msg('user', text));
  const whole = await chat({ messages: history, sampling });
  eq(turn.token_ids, whole.token_ids, `session turn ${k}: tokens == whole history`);
  eq(turn.usage.prompt_tokens, whole.usage.prompt_tokens, `session turn ${k}: prompt tokens`);
  eq([...turn.session_ids], ['js-session'], `session turn ${k}: every message names the session`);
  cached.push(turn.usage.cached_tokens);
  history.push(msg('assistant', turn.content));
}
ok(cached[0] === 0 && cached[1] > 0 && cached[2] > 0, `session: continued from the kept cache ${cached}`);
await unary('DeleteSession', { session_id: 'js-session' });
checks++;
await assert.rejects(unary('DeleteSession', { session_id: 'js-session' }),
  (e) => e.code === grpc.status.NOT_FOUND && e.details.includes('js-session'), 'deleted twice: NOT_FOUND');
checks++;
await assert.rejects(chat({ messages: [msg('user', 'x')], session_id: 'js-session', session_must_exist: true }),
  (e) => e.code === grpc.status.NOT_FOUND, 'continue deleted: NOT_FOUND');
checks++;
await assert.rejects(chat({ messages: [msg('user', 'x')], session_id: 'bad id' }),
  (e) => e.code === grpc.status.INVALID_ARGUMENT && e.details.includes('session_id'), 'bad id: INVALID_ARGUMENT');
checks++;
await assert.rejects(chat({ messages: [msg('robot', 'x')] }),
  (e) => e.code === grpc.status.INVALID_ARGUMENT && e.details.includes('messages[0].role'), 'bad role: INVALID_ARGUMENT');
checks++;

client.close();
const version = require('@grpc/grpc-js/package.json').version;
console.log(`@grpc/grpc-js ${version}: ${checks} checks passed (session cached tokens ${cached})`);
