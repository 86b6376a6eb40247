// loom-server with the official OpenAI Node SDK (npm install openai@5.23.2).
//   LOOM_URL=http://127.0.0.1:8000 node node_openai.mjs
import OpenAI from 'openai';

const client = new OpenAI({
  baseURL: `${process.env.LOOM_URL ?? 'http://127.0.0.1:8000'}/v1`,
  apiKey: process.env.LOOM_API_KEY ?? 'unused',  // required by the SDK; checked only with --api_key
});
const model = (await client.models.list()).data[0].id;

const completion = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 16, seed: 1 });
console.log('completion:', JSON.stringify(completion.choices[0].text));

const stream = await client.chat.completions.create({
  model, messages: [{ role: 'user', content: 'Hello!' }], max_tokens: 16, stream: true,
});
process.stdout.write('chat (streamed): ');
for await (const chunk of stream) process.stdout.write(chunk.choices[0]?.delta?.content ?? '');
process.stdout.write('\n');

const withTools = await client.chat.completions.create({
  model,
  messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
  tools: [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }],
  max_tokens: 32,
});
console.log('tools:', JSON.stringify(withTools.choices[0].message), withTools.choices[0].finish_reason);
