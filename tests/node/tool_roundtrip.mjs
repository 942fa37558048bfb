// tool_roundtrip.mjs: the official `openai` npm client runs a full tool
// round trip against `moetune serve` (tools -> tool_calls -> tool result ->
// answer), non-streaming, streaming chunk by chunk, and through the SDK's
// own stream accumulator (which checks every chunk's shape), then n = 2.
// The server's output is scripted by tests/test_serve_agent.c's sampler
// hook. Usage: node tool_roundtrip.mjs BASE_URL  (exit 0 on success)
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: process.argv[2] + '/v1', apiKey: 'none', maxRetries: 0 });
const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Weather forecast for a city',
      parameters: {
        type: 'object',
        properties: { city: { type: 'string' }, days: { type: 'integer' } },
        required: ['city'],
      },
    },
  },
];
const question = [{ role: 'user', content: 'Weather in Paris for 3 days?' }];
const base = { model: 'tiny', tools, temperature: 0, max_tokens: 200 };

function checkCall(msg) {
  assert.equal(msg.tool_calls.length, 1);
  const c = msg.tool_calls[0];
  assert.equal(c.type, 'function');
  assert.equal(c.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(c.function.arguments), { city: 'Paris', days: 3 });
  assert.ok(c.id.startsWith('call_'));
  assert.equal(msg.content ?? '', 'I will check.');
  assert.equal(msg.reasoning_content, 'The user wants the weather.');
  return c;
}

function followUp(msg, call) {
  return [
    ...question,
    { role: 'assistant', content: msg.content, tool_calls: msg.tool_calls },
    { role: 'tool', tool_call_id: call.id, content: '{"sky": "sunny", "temp": 21}' },
  ];
}

// 1. Not streaming.
const r1 = await client.chat.completions.create({ ...base, messages: question });
assert.equal(r1.choices[0].finish_reason, 'tool_calls');
const call = checkCall(r1.choices[0].message);
const r2 = await client.chat.completions.create({ ...base, messages: followUp(r1.choices[0].message, call) });
assert.equal(r2.choices[0].finish_reason, 'stop');
assert.equal(r2.choices[0].message.content, 'It is sunny in Paris.');
assert.equal(r2.choices[0].message.tool_calls, undefined);
console.log('plain round trip ok');

// 2. Streaming, chunks by hand.
const s1 = await client.chat.completions.create({ ...base, messages: question, stream: true });
const acc = { content: '', reasoning: '', calls: [] };
let finish = null;
let chunks = 0;
for await (const ch of s1) {
  chunks++;
  if (!ch.choices.length) continue;
  const d = ch.choices[0].delta;
  if (d.content) acc.content += d.content;
  if (d.reasoning_content) acc.reasoning += d.reasoning_content;
  for (const t of d.tool_calls ?? []) {
    if (!acc.calls[t.index]) {
      assert.ok(t.id && t.function.name, 'the first delta of a call has its id and name');
      acc.calls[t.index] = { id: t.id, type: 'function', function: { name: t.function.name, arguments: '' } };
    }
    acc.calls[t.index].function.arguments += t.function.arguments ?? '';
  }
  if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
}
assert.equal(finish, 'tool_calls');
const smsg = { content: acc.content, reasoning_content: acc.reasoning, tool_calls: acc.calls };
const scall = checkCall(smsg);
const s2 = await client.chat.completions.create({ ...base, messages: followUp(smsg, scall), stream: true });
let answer = '';
for await (const ch of s2) if (ch.choices.length) answer += ch.choices[0].delta.content ?? '';
assert.equal(answer, 'It is sunny in Paris.');
console.log(`streaming round trip ok (${chunks} chunks)`);

// 3. The SDK's accumulator: it validates each chunk against the previous ones.
const h = client.chat.completions.stream({ ...base, messages: question });
const fin = await h.finalChatCompletion();
assert.equal(fin.choices[0].finish_reason, 'tool_calls');
assert.equal(fin.choices[0].message.tool_calls[0].function.name, 'get_weather');
assert.deepEqual(JSON.parse(fin.choices[0].message.tool_calls[0].function.arguments), { city: 'Paris', days: 3 });
console.log('sdk stream accumulator ok');

// 4. n = 2, streamed: both choices carry the same scripted call.
const h2 = client.chat.completions.stream({ ...base, messages: question, n: 2 });
const fin2 = await h2.finalChatCompletion();
assert.equal(fin2.choices.length, 2);
for (const c of fin2.choices) {
  assert.equal(c.finish_reason, 'tool_calls');
  assert.deepEqual(JSON.parse(c.message.tool_calls[0].function.arguments), { city: 'Paris', days: 3 });
}
console.log('n = 2 ok');
