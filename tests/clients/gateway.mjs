// What every client script shares: where the gateway is, the key and model to use (from the
// environment tests/e2e/test_agent_clients.py sets), and the one JSON line it prints last.
const need = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};

export const gateway = {
  url: need('GATEWAY_URL'), // the OpenAI base URL, ending in /v1
  root: need('GATEWAY_ROOT'),
  key: need('GATEWAY_KEY'),
  model: need('GATEWAY_MODEL'),
};

export const report = (result) => process.stdout.write(`${JSON.stringify(result)}\n`);
