// openai-node's Files and Batch API (tests/e2e/test_batches_node.py), one scenario per run:
//   run     upload a JSONL file (toFile), create a chat batch, poll it to its end, download the
//           output and error files, list batches and files (auto-paginated);
//   cancel  upload a long batch, create it, wait until one line finished, cancel, poll to the end;
//   bad     upload a file with a bad line (the 400 the SDK raises, as it raises it).
// Prints what the SDK got, for the Python test to compare with what the simulator answers.
import OpenAI, { toFile } from 'openai';
import { gateway, report } from './gateway.mjs';

const client = new OpenAI({ baseURL: gateway.url, apiKey: gateway.key, maxRetries: 0 });
const LINES = Number(process.env.LINES ?? '5');
const POLL_MS = 20;
const DEADLINE_MS = 20_000;

const line = (i) => JSON.stringify({
  custom_id: `q${i}`, method: 'POST', url: '/v1/chat/completions',
  body: { model: gateway.model, messages: [{ role: 'user', content: `Question ${i}?` }] },
});

const upload = async (text) =>
  client.files.create({ file: await toFile(Buffer.from(text), 'in.jsonl'), purpose: 'batch' });

const pollUntil = async (id, done) => {
  const deadline = Date.now() + DEADLINE_MS;
  for (;;) {
    const batch = await client.batches.retrieve(id);
    if (done(batch)) return batch;
    if (Date.now() > deadline) throw new Error(`still ${batch.status} after ${DEADLINE_MS} ms`);
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
};

const ENDED = ['completed', 'failed', 'expired', 'cancelled'];
const lines = async (fileId) => {
  if (!fileId) return [];
  const text = await (await client.files.content(fileId)).text();
  return text.split('\n').filter((x) => x.trim()).map((x) => JSON.parse(x));
};

const create = async (count) => {
  const file = await upload(Array.from({ length: count }, (_, i) => line(i)).join('\n') + '\n');
  const batch = await client.batches.create({
    input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h',
    metadata: { from: 'node' },
  });
  return { file, batch };
};

const scenarios = {
  async run() {
    const { file, batch } = await create(LINES);
    const done = await pollUntil(batch.id, (b) => ENDED.includes(b.status));
    const batches = [];
    for await (const b of client.batches.list({ limit: 1 })) batches.push(b.id);
    const files = [];
    for await (const f of client.files.list({ limit: 1 })) files.push(f.id);
    return {
      file, created: batch, done,
      output: await lines(done.output_file_id), errors: await lines(done.error_file_id),
      batches, files,
    };
  },

  async cancel() {
    const { batch } = await create(LINES);
    await pollUntil(batch.id, (b) => b.request_counts.completed >= 1);
    const cancelling = await client.batches.cancel(batch.id);
    const done = await pollUntil(batch.id, (b) => ENDED.includes(b.status));
    return {
      cancelling: cancelling.status, done,
      output: await lines(done.output_file_id), errors: await lines(done.error_file_id),
    };
  },

  async bad() {
    try {
      await upload(`${line(0)}\n{oops\n`);
      return { refused: false };
    } catch (error) {
      return { refused: true, status: error.status, error: error.error };
    }
  },
};

const scenario = scenarios[process.argv[2]];
if (!scenario) throw new Error(`usage: openai_batches.mjs ${Object.keys(scenarios).join('|')}`);
report(await scenario());
