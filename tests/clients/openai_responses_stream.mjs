// openai-node's responses.stream(): every event through the SDK's accumulator, then what the
// accumulated snapshot holds next to what the server's response.completed carried.
import OpenAI from 'openai';
import { gateway, report } from './gateway.mjs';

const client = new OpenAI({ baseURL: gateway.url, apiKey: gateway.key, maxRetries: 0 });
const stream = client.responses.stream({
  model: gateway.model,
  input: 'Why is the sky blue?',
  max_output_tokens: 2000,
});
const kinds = [];
let completed = null;
let deltas = '';
let lastSnapshot = null;
stream.on('event', (event) => {
  if (kinds.at(-1) !== event.type) kinds.push(event.type); // one entry per run of deltas
  if (event.type === 'response.completed') completed = event.response;
});
stream.on('response.output_text.delta', (event) => {
  deltas += event.delta;
  lastSnapshot = event.snapshot;
});
const final = await stream.finalResponse();
report({ kinds, deltas, lastSnapshot, final, completed, outputText: final.output_text });
