// agent_checks.mjs: the official `openai` npm client against `moetune serve`
// the way agents drive it: chat.completions.stream with its content events,
// runTools (the SDK calls our tool with the parsed arguments, sends the
// result back and reads the answer), streamed runTools, models.retrieve
// (and its 404), and a 50 MB body that must come back as a 413 error
// object, not a broken connection the SDK retries (requests counted
// server-side in /metrics). The model's output is scripted by
// tests/serve/test_serve_agent.c's sampler hook.
// Usage: node agent_checks.mjs BASE_URL MODEL_ID  (exit 0 on success)
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const base = process.argv[2];
const modelId = process.argv[3];
const client = new OpenAI({ baseURL: base + '/v1', apiKey: 'none', maxRetries: 0 });

// 1. chat.completions.stream: content events add up to the final message.
{
  let seen = '';
  let chunks = 0;
  const s = client.chat.completions.stream({
    model: modelId,
    messages: [{ role: 'user', content: 'Say something' }],
    max_tokens: 12,
    temperature: 0,
  });
  s.on('content', (delta) => { seen += delta; });
  s.on('chunk', () => { chunks++; });
  const fin = await s.finalChatCompletion();
  assert.equal(fin.choices[0].message.content, seen);
  assert.ok(['stop', 'length'].includes(fin.choices[0].finish_reason));
  assert.ok(fin.id.startsWith('chatcmpl-'));
  console.log(`stream ok (${chunks} chunks)`);
}

// 2. runTools: the SDK runs our function and sends its result back.
const calls = [];
const runnerTools = [
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
      function: (args) => { calls.push(args); return { sky: 'sunny', temp: 21 }; },
      parse: JSON.parse,
    },
  },
];
{
  const runner = client.chat.completions.runTools({
    model: modelId,
    messages: [{ role: 'user', content: 'Weather in Paris for 3 days?' }],
    tools: runnerTools,
    temperature: 0,
    max_tokens: 200,
  });
  const content = await runner.finalContent();
  assert.deepEqual(calls, [{ city: 'Paris', days: 3 }]);
  assert.equal(content, 'It is sunny in Paris.');
  const msgs = runner.messages;
  assert.ok(msgs.some((m) => m.role === 'tool'), 'the tool result went back');
  console.log('runTools ok');
}
{
  const runner = client.chat.completions.runTools({
    model: modelId,
    messages: [{ role: 'user', content: 'Weather in Paris for 3 days?' }],
    tools: runnerTools,
    temperature: 0,
    max_tokens: 200,
    stream: true,
  });
  const content = await runner.finalContent();
  assert.equal(calls.length, 2);
  assert.deepEqual(calls[1], { city: 'Paris', days: 3 });
  assert.equal(content, 'It is sunny in Paris.');
  console.log('streamed runTools ok');
}

// 3. models.retrieve.
{
  const m = await client.models.retrieve(modelId);
  assert.equal(m.id, modelId);
  assert.equal(m.object, 'model');
  await assert.rejects(client.models.retrieve('no-such-model'), (e) => {
    assert.equal(e.status, 404);
    assert.equal(e.code, 'model_not_found');
    return true;
  });
  console.log('models.retrieve ok');
}

// 4. A 50 MB body: a 413 error object, once, with the SDK's own retries on.
async function errorCount() {
  const text = await (await fetch(base + '/metrics')).text();
  const line = text.split('\n').find((l) =>
    l.startsWith('moetune_requests_total{endpoint="chat.completions",outcome="error"} '));
  return line ? Number(line.split(' ')[1]) : 0;
}
{
  const retrying = new OpenAI({ baseURL: base + '/v1', apiKey: 'none', maxRetries: 2 });
  const before = await errorCount();
  const big = 'x'.repeat(50 << 20);
  await assert.rejects(
    retrying.chat.completions.create({ model: modelId, messages: [{ role: 'user', content: big }] }),
    (e) => {
      assert.equal(e.status, 413, `status ${e.status}: ${e.message}`);
      assert.equal(e.code, 'request_too_large');
      assert.equal(e.type, 'invalid_request_error');
      return true;
    });
  const after = await errorCount();
  assert.equal(after - before, 1, `the server saw ${after - before} requests (a retry storm?)`);
  console.log('413 ok (one request)');
}
console.log('agent checks ok');
