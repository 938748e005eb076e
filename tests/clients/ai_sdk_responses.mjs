// The AI SDK's OpenAI provider with its defaults (the Responses API, store: true): one turn,
// two turns (the second sends the first's items back as item_reference), a tool loop.
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, isStepCount, tool } from 'ai';
import { z } from 'zod';
import { gateway, report } from './gateway.mjs';

const openai = createOpenAI({ baseURL: gateway.url, apiKey: gateway.key });
const common = {
  model: openai(gateway.model),
  maxRetries: 0,
  // forceReasoning: the SDK knows reasoning models by OpenAI's names (o*, gpt-5*); for any
  // other name it drops `reasoning` from the request unless told the model reasons.
  providerOptions: { openai: { reasoningSummary: 'auto', forceReasoning: true } },
};
const summary = (result) => ({
  text: result.text,
  reasoningText: result.steps.map((step) => step.reasoningText ?? '').join(''),
  reasoningParts: result.steps.flatMap((step) => step.reasoning.map((part) => part.type)),
  steps: result.steps.map((step) => ({
    finishReason: step.finishReason,
    toolCalls: step.toolCalls.map((call) => ({ name: call.toolName, input: call.input })),
    toolResults: step.toolResults.map((r) => ({ name: r.toolName, output: r.output })),
  })),
});

const scenarios = {
  async 'one-turn'() {
    return summary(await generateText({ ...common, prompt: 'Why is the sky blue?' }));
  },
  async 'two-turns'() {
    const messages = [{ role: 'user', content: 'Why is the sky blue?' }];
    const first = await generateText({ ...common, messages });
    messages.push(...first.response.messages, { role: 'user', content: 'And at sunset?' });
    const second = await generateText({ ...common, messages });
    return { first: summary(first), second: summary(second) };
  },
  async 'tool-loop'() {
    const calls = [];
    const weather = tool({
      description: 'The weather in a city.',
      inputSchema: z.object({ city: z.string() }),
      execute: async ({ city }) => {
        calls.push(city);
        return `It is sunny in ${city}.`;
      },
    });
    const result = await generateText({
      ...common,
      prompt: 'What is the weather in Paris?',
      tools: { weather },
      stopWhen: isStepCount(3),
    });
    return { ...summary(result), calls };
  },
};

const name = process.argv[2];
if (!(name in scenarios)) throw new Error(`scenario: one of ${Object.keys(scenarios)}`);
report(await scenarios[name]());
