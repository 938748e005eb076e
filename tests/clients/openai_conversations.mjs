// openai-node's Conversations API: create -> items.create -> items.list (the SDK's own
// pagination, two items a page) -> items.retrieve -> items.delete -> delete, then a retrieve of
// the deleted conversation; everything the gateway answered, for the Python test to check.
import OpenAI from 'openai';
import { gateway, report } from './gateway.mjs';

const client = new OpenAI({ baseURL: gateway.url, apiKey: gateway.key, maxRetries: 0 });
const all = async (conversationId) => {
  const items = [];
  for await (const item of client.conversations.items.list(conversationId, { order: 'asc', limit: 2 })) {
    items.push(item);
  }
  return items;
};

const created = await client.conversations.create({
  items: [{ role: 'user', content: 'Why is the sky blue?' }],
  metadata: { client: 'openai-node' },
});
const added = await client.conversations.items.create(created.id, {
  items: [
    { type: 'message', role: 'assistant', content: 'Rayleigh scattering.' },
    { role: 'user', content: [{ type: 'input_text', text: 'And the sea?' }] },
  ],
});
const listed = await all(created.id);
const target = added.data[0].id;
const retrieved = await client.conversations.items.retrieve(target, { conversation_id: created.id });
const afterDelete = await client.conversations.items.delete(target, { conversation_id: created.id });
const remaining = await all(created.id);
const deleted = await client.conversations.delete(created.id);
let missing = null;
try {
  await client.conversations.retrieve(created.id);
} catch (error) {
  missing = { status: error.status, error: error.error };
}
report({ created, added, listed, retrieved, afterDelete, remaining, deleted, missing });
