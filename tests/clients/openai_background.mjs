// openai-node's background responses (tests/e2e/test_background_node.py), one scenario per run:
//   poll    create with background: true, then retrieve until it left queued / in_progress;
//   resume  create streamed in the background, leave after CUT_AFTER events, resume with
//           retrieve(id, {stream: true, starting_after}), and replay the whole stream;
//   cancel  create a long one, wait until it runs (in_progress), cancel it, retrieve it.
// Prints what the SDK got, for the Python test to compare with what the simulator answers.
import OpenAI from 'openai';
import { gateway, report } from './gateway.mjs';

const client = new OpenAI({ baseURL: gateway.url, apiKey: gateway.key, maxRetries: 0 });
const QUESTION = 'Why?';
const POLL_MS = 20;
const DEADLINE_MS = 15_000;

// Retrieves the response until `done(response)`; a deadline, so a stuck status fails the test
// with what was last seen rather than hanging it.
const pollUntil = async (id, done) => {
  const statuses = [];
  const deadline = Date.now() + DEADLINE_MS;
  for (;;) {
    const response = await client.responses.retrieve(id);
    if (statuses.at(-1) !== response.status) statuses.push(response.status);
    if (done(response)) return { response, statuses };
    if (Date.now() > deadline) throw new Error(`still ${response.status} after ${DEADLINE_MS} ms`);
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
};

const collect = async (stream) => {
  const events = [];
  for await (const event of stream) events.push(event);
  return events;
};

const numbers = (events) => events.map((event) => event.sequence_number);

const scenarios = {
  async poll() {
    const queued = await client.responses.create({
      model: gateway.model, input: QUESTION, background: true,
    });
    const { response, statuses } = await pollUntil(
      queued.id, (r) => !['queued', 'in_progress'].includes(r.status),
    );
    return {
      queued: { id: queued.id, status: queued.status, background: queued.background },
      statuses,
      status: response.status,
      outputText: response.output_text,
      outputTypes: response.output.map((item) => item.type),
    };
  },

  async resume() {
    const cutAfter = Number(process.env.CUT_AFTER);
    if (!(cutAfter > 0)) throw new Error('CUT_AFTER must be a positive number');
    const live = await client.responses.create({
      model: gateway.model, input: QUESTION, stream: true, background: true,
    });
    const cut = [];
    for await (const event of live) {
      cut.push(event);
      if (cut.length === cutAfter) break; // the SDK aborts the connection; the response runs on
    }
    const id = cut[0].response.id;
    const last = cut.at(-1).sequence_number;
    const resumed = await collect(
      await client.responses.retrieve(id, { stream: true, starting_after: last }),
    );
    const whole = await collect(await client.responses.retrieve(id, { stream: true }));
    const joined = [...cut, ...resumed];
    return {
      id,
      cut: numbers(cut),
      numbers: { cutResumed: numbers(joined), whole: numbers(whole) },
      events: { cutResumed: joined, whole },
    };
  },

  async cancel() {
    const queued = await client.responses.create({
      model: gateway.model, input: QUESTION, background: true, max_output_tokens: 4000,
    });
    // in_progress comes with the engine's first chunk: from then on it has a request to abort
    const running = await pollUntil(queued.id, (r) => r.status !== 'queued');
    const cancelled = await client.responses.cancel(queued.id);
    const again = await client.responses.retrieve(queued.id);
    return {
      statusBefore: running.response.status,
      statuses: running.statuses,
      cancelled: cancelled.status,
      retrieved: again.status,
    };
  },
};

const scenario = scenarios[process.argv[2]];
if (!scenario) throw new Error(`usage: openai_background.mjs ${Object.keys(scenarios).join('|')}`);
report(await scenario());
