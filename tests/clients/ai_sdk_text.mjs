// The AI SDK's Chat Completions model (openai.chat), its OpenAI-compatible provider
// (createOpenAICompatible, what its docs name for a self-hosted server) or its Anthropic provider
// (createAnthropic, the Messages API): one generateText and one streamText, every stream part's
// type kept.
import { createAnthropic } from '@ai-sdk/anthropic';
import { createOpenAI } from '@ai-sdk/openai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { generateText, streamText } from 'ai';
import { gateway, report } from './gateway.mjs';

const models = {
  'openai-chat': () => createOpenAI({ baseURL: gateway.url, apiKey: gateway.key }).chat(gateway.model),
  'openai-compatible': () =>
    createOpenAICompatible({ name: 'thinkgate', baseURL: gateway.url, apiKey: gateway.key })(
      gateway.model,
    ),
  anthropic: () => createAnthropic({ baseURL: gateway.url, apiKey: gateway.key })(gateway.model),
};
const name = process.argv[2];
if (!(name in models)) throw new Error(`provider: one of ${Object.keys(models)}`);
const model = models[name]();
const prompt = 'Why is the sky blue?';

const generated = await generateText({ model, prompt, maxRetries: 0, maxOutputTokens: 2000 });
const streamed = streamText({ model, prompt, maxRetries: 0, maxOutputTokens: 2000 });
const parts = [];
const errors = [];
let text = '';
for await (const part of streamed.fullStream) {
  parts.push(part.type);
  if (part.type === 'text-delta') text += part.text;
  if (part.type === 'error') errors.push(String(part.error?.stack ?? part.error));
}
report({
  generated: { text: generated.text, finishReason: generated.finishReason },
  streamed: { text, parts: [...new Set(parts)], errors, finishReason: await streamed.finishReason },
});
