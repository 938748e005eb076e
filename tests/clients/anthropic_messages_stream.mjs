// The Anthropic TypeScript SDK's messages.stream() with thinking: the SDK's accumulated final
// message next to the text it streamed.
import Anthropic from '@anthropic-ai/sdk';
import { gateway, report } from './gateway.mjs';

const client = new Anthropic({ baseURL: gateway.root, apiKey: gateway.key, maxRetries: 0 });
const stream = client.messages.stream({
  model: gateway.model,
  max_tokens: 4096,
  thinking: { type: 'enabled', budget_tokens: 2048 },
  messages: [{ role: 'user', content: 'Why is the sky blue?' }],
});
let text = '';
stream.on('text', (delta) => {
  text += delta;
});
const final = await stream.finalMessage();
report({ text, final });
