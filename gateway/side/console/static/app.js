// The console's pages, routed by the URL's fragment (#records?model=x, #record/12, #overview,
// #retention, #export; for admins #keys and #spend). The fragment keeps the filters, never the
// key.

import { ApiError, call, query, session } from "./api.js";
import { h, prose, replace, svg, time } from "./dom.js";
import { spendPage } from "./spend.js";
import { checkpoint, forget, pin, pinnedKey, policy, setPolicy, verifyRecord } from "./trust.js";
import { VerifyError } from "./verify.js";

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const status = document.getElementById("status");
const ROLE = "thinkgate.role";
const TENANT = "thinkgate.tenant"; // an auditor key's tenant; "*" sees every tenant
const PAGE = 50;
const STATUSES = ["ok", "error", "invalid", "cancelled", "rate_limited", "upstream_error",
  "client_disconnected", "replica_lost"];
const RANGES = { "": "Any time", "1h": "Last hour", "24h": "Last 24 hours", "7d": "Last 7 days",
                 "30d": "Last 30 days", custom: "Custom range" };
const COLORS = { ok: 0, error: 1, invalid: 3, reasoning: 4, answer: 2 };
const SECONDS = { "1h": 3600, "24h": 86400, "7d": 7 * 86400, "30d": 30 * 86400 };

function say(text) {
  status.textContent = text;
}

function problem(error) {
  const what = error instanceof VerifyError ? "Verification failed" : "Error";
  return h("div", { class: "alert", role: "alert" }, h("strong", {}, `${what}: `), error.message);
}

function parseRoute() {
  const raw = location.hash.replace(/^#/, "");
  const [path, search] = raw.split("?");
  return { path: path || "", params: new URLSearchParams(search || "") };
}

function go(path, params = {}) {
  location.hash = `${path}${query(params)}`;
}

// --- sign in -------------------------------------------------------------------------------

function signIn(message) {
  nav.replaceChildren();
  const key = h("input", { id: "key", type: "password", autocomplete: "off", required: true,
                           spellcheck: "false", "aria-describedby": "key-help" });
  const vkey = h("input", { id: "vkey", type: "text", autocomplete: "off", spellcheck: "false",
                            placeholder: pinnedKey() || "name+id+key", "aria-describedby": "vkey-help" });
  const rules = policy();
  const witnesses = h("textarea", { id: "witnesses", rows: 2, spellcheck: "false",
                                    "aria-describedby": "witnesses-help" },
                      rules ? rules.keys.join("\n") : "");
  const quorum = h("input", { id: "quorum", type: "number", min: 1, inputmode: "numeric",
                              value: rules ? rules.quorum : "" });
  const result = h("div", { "aria-live": "polite" }, message ? problem(message) : null);
  const form = h("form", { class: "card signin", onsubmit: async (event) => {
      event.preventDefault();
      replace(result, h("p", {}, "Signing in…"));
      try {
        await start(key.value.trim(), vkey.value.trim(), witnesses.value, quorum.value);
      } catch (error) {
        session.key = null;
        replace(result, problem(error));
      }
    } },
    h("h1", {}, "thinkgate auditor console"),
    h("label", { for: "key" }, "Auditor or admin key"),
    key,
    h("p", { id: "key-help", class: "help" },
      "Kept in this tab only (sessionStorage): never in a cookie, never in the address."),
    h("label", { for: "vkey" }, "Log verifier key (optional)"),
    vkey,
    h("p", { id: "vkey-help", class: "help" },
      "The key your operator gave you out of band. Left empty, the key the gateway serves is " +
        "pinned on first use and every later checkpoint must be signed by it."),
    h("label", { for: "witnesses" }, "Witness keys (optional, one per line)"),
    witnesses,
    h("label", { for: "quorum" }, "Cosignatures required"),
    quorum,
    h("p", { id: "witnesses-help", class: "help" },
      "With witness keys, records are verified only against checkpoints that many of those " +
        "witnesses cosigned (default: all of them): a log showing you a history they did not " +
        "see is caught."),
    h("button", { type: "submit" }, "Sign in"),
    result);
  replace(main, form);
  key.focus();
}

async function roleOf(key) {
  try {
    const me = await call("/audit/v1/me", { key });
    sessionStorage.setItem(TENANT, me.tenant);
    return "auditor";
  } catch (error) {
    if (!(error instanceof ApiError) || error.status !== 403) throw error;
  }
  await call("/admin/v1/keys", { key });
  return "admin";
}

async function start(key, expected, witnessKeys, quorum) {
  const role = await roleOf(key);
  if (role === "auditor") {
    const pinned = await pin(expected, key);
    if (witnessKeys.trim() || !policy()) await setPolicy(witnessKeys, quorum);
    if (pinned.pinnedNow) say(`Pinned the log's verifier key ${pinned.key}`);
  }
  session.key = key;
  sessionStorage.setItem(ROLE, role);
  // One render: a changed fragment renders through its hashchange event; rendering here too
  // drew the page twice, and a filter typed into the first drawing was lost with it.
  const target = role === "admin" ? "keys" : "records";
  if (location.hash.replace(/^#/, "") === target) route();
  else go(target);
}

function signOut() {
  session.key = null;
  sessionStorage.removeItem(ROLE);
  sessionStorage.removeItem(TENANT);
  location.hash = "";
  signIn();
}

function navigation(role, path) {
  const links = role === "admin"
    ? [["keys", "Keys"], ["spend", "Spend"]]
    : [["records", "Records"], ["overview", "Overview"], ["retention", "Retention"],
       ["export", "Export"]];
  replace(nav,
    h("span", { class: "brand" }, "thinkgate"),
    links.map(([to, label]) => h("a", { href: `#${to}`, "aria-current": path === to ? "page" : null },
                                 label)),
    h("span", { class: "spacer" }),
    role === "auditor" ? h("span", { class: "help" }, `tenant ${sessionStorage.getItem(TENANT)}`) : null,
    role === "auditor" ? checkpointBadge() : null,
    h("button", { type: "button", class: "link", onclick: signOut }, "Sign out"));
}

function checkpointBadge() {
  const badge = h("span", { class: "badge pending", id: "checkpoint", role: "status" }, "checkpoint…");
  checkpoint({ refresh: true }).then(
    (cp) => {
      badge.className = "badge ok";
      badge.textContent = `log verified: ${cp.size} records` +
        (cp.witnesses ? `, cosigned by ${cp.witnesses.length} witnesses` : "");
      badge.title = `Signed checkpoint of size ${cp.size}, consistent with the last one this browser verified`;
    },
    (error) => {
      badge.className = "badge bad";
      badge.textContent = "log NOT verified";
      badge.title = error.message;
      replace(document.getElementById("banner"), problem(error));
    },
  );
  return badge;
}

// --- records -------------------------------------------------------------------------------

function timeBounds(params) {
  const range = params.get("range") || "";
  if (range === "custom") {
    return { since: params.get("since") || undefined, until: params.get("until") || undefined };
  }
  if (SECONDS[range]) return { since: String(Math.floor(Date.now() / 1000) - SECONDS[range]) };
  return {};
}

function filterForm(params, path, fields) {
  const inputs = {};
  const row = [];
  const field = (name, label, control) => {
    inputs[name] = control;
    row.push(h("div", { class: "field" }, h("label", { for: `f-${name}` }, label), control));
  };
  const text = (name, label, list) =>
    field(name, label, h("input", { id: `f-${name}`, name, value: params.get(name) || "",
                                    list: list || null, autocomplete: "off" }));
  if (fields.includes("tenant") && sessionStorage.getItem(TENANT) === "*") text("tenant", "Tenant");
  if (fields.includes("model")) text("model", "Model");
  if (fields.includes("status")) text("status", "Status", "statuses");
  if (fields.includes("key_id")) text("key_id", "Key id");
  if (fields.includes("request_id")) text("request_id", "Request id");
  if (fields.includes("guardrail")) text("guardrail", "Guardrail policy");
  const range = h("select", { id: "f-range", name: "range" },
    Object.entries(RANGES).map(([value, label]) =>
      h("option", { value, selected: (params.get("range") || "") === value }, label)));
  field("range", "Time range", range);
  const local = (iso) => (iso ? toLocalInput(iso) : "");
  field("since", "From (your time)", h("input", { id: "f-since", type: "datetime-local",
                                                 value: local(params.get("since")) }));
  field("until", "To (your time)", h("input", { id: "f-until", type: "datetime-local",
                                               value: local(params.get("until")) }));
  const custom = () => {
    const on = range.value === "custom";
    inputs.since.parentElement.hidden = !on;
    inputs.until.parentElement.hidden = !on;
  };
  range.addEventListener("change", custom);
  custom();
  return h("form", { class: "filters", role: "search", onsubmit: (event) => {
      event.preventDefault();
      const next = {};
      for (const [name, control] of Object.entries(inputs)) {
        if (name === "since" || name === "until") continue;
        next[name] = control.value.trim();
      }
      if (range.value === "custom") {
        next.since = fromLocalInput(inputs.since.value);
        next.until = fromLocalInput(inputs.until.value);
      }
      go(path, next);
    } },
    h("datalist", { id: "statuses" }, STATUSES.map((s) => h("option", { value: s }))),
    row,
    h("div", { class: "field actions" }, h("button", { type: "submit" }, "Apply"),
      h("button", { type: "button", class: "link", onclick: () => go(path) }, "Clear")));
}

function toLocalInput(iso) {
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return "";
  const shifted = new Date(date.getTime() - date.getTimezoneOffset() * 60000);
  return shifted.toISOString().slice(0, 16);
}

function fromLocalInput(value) {
  return value ? new Date(value).toISOString() : "";
}

function apiFilters(params) {
  const out = {};
  for (const name of ["tenant", "model", "status", "key_id", "request_id", "kind", "guardrail"]) {
    if (params.get(name)) out[name] = params.get(name);
  }
  return { ...out, ...timeBounds(params) };
}

function tokens(header) {
  const usage = header.usage || {};
  const reasoning = usage.reasoning_tokens ?? 0;
  const answer = Math.max(0, (usage.completion_tokens ?? 0) - reasoning);
  return { reasoning, answer };
}

function badgeFor(index, header) {
  const badge = h("span", { class: "badge pending", role: "status" }, "checking…");
  verifyRecord(index, header).then(
    (result) => {
      if (result.state === "verified") {
        badge.className = "badge ok";
        badge.textContent = "✓ verified";
        badge.title = "Leaf recomputed from the stored bytes, inclusion proof checked against the signed checkpoint, in this browser";
      } else {
        badge.className = "badge pending";
        badge.textContent = "not yet signed";
        badge.title = "Newer than the checkpoint this page verified; reload to check it";
      }
    },
    (error) => {
      badge.className = "badge bad";
      badge.textContent = "✗ FAILED";
      badge.title = error.message;
      badge.setAttribute("aria-label", `verification failed: ${error.message}`);
    },
  );
  return badge;
}

async function records(params) {
  const cursor = params.get("cursor") || undefined;
  const filters = apiFilters(params);
  const holder = h("div", {}, h("p", { class: "loading" }, "Loading records…"));
  replace(main, h("h1", {}, "Records"), filterForm(params, "records",
    ["tenant", "model", "status", "key_id", "request_id", "guardrail"]), holder);
  let page;
  try {
    page = await call(`/audit/v1/records${query({ ...filters, limit: PAGE, cursor })}`);
  } catch (error) {
    replace(holder, problem(error));
    return;
  }
  if (!page.data.length) {
    replace(holder, h("p", { class: "empty" }, "No records match these filters."));
    return;
  }
  const rows = page.data.map((record) => {
    const header = record.header;
    const used = tokens(header);
    return h("tr", {},
      h("td", {}, h("a", { href: `#record/${record.index}` }, String(record.index))),
      h("td", {}, time(header.created_at)),
      h("td", {}, header.tenant),
      h("td", { class: "mono" }, header.key_id),
      h("td", {}, header.kind === "completion" ? header.model : `(${header.kind})`),
      h("td", {}, header.endpoint || "-"),
      h("td", {}, h("span", { class: `status s-${header.status}` }, header.status)),
      h("td", { class: "num" }, header.kind === "completion" ? String(used.reasoning) : "-"),
      h("td", { class: "num" }, header.kind === "completion" ? String(used.answer) : "-"),
      h("td", {}, header.client_disconnected ? "yes" : ""),
      h("td", {}, (header.guardrails || []).map((acted) =>
        h("span", { class: "tag guardrail", title: "a guardrail policy acted" }, acted)),
        (record.held_by || []).map((hold) =>
          h("span", { class: "tag held", title: "kept by a legal hold" }, `held: ${hold}`))),
      h("td", {}, badgeFor(record.index, header)));
  });
  const next = { ...Object.fromEntries(params), cursor: page.next_cursor };
  replace(holder,
    h("table", { class: "records" },
      h("caption", {}, `${page.data.length} records${cursor ? " (a later page)" : ""}`),
      h("thead", {}, h("tr", {}, ["#", "Time", "Tenant", "Key", "Model", "Endpoint", "Status",
        "Reasoning tokens", "Answer tokens", "Disconnected", "Guardrails", "Verified"].map((t) =>
        h("th", { scope: "col" }, t)))),
      h("tbody", {}, rows)),
    h("nav", { class: "pager", "aria-label": "Pages" },
      cursor ? h("a", { href: `#records${query({ ...Object.fromEntries(params), cursor: "" })}` },
                 "First page") : null,
      page.next_cursor ? h("a", { href: `#records${query(next)}` }, "Next page") : null));
}

// --- one record ----------------------------------------------------------------------------

function headerTable(header) {
  const rows = [];
  const walk = (prefix, value) => {
    if (value && typeof value === "object" && !Array.isArray(value)) {
      for (const [k, v] of Object.entries(value)) walk(prefix ? `${prefix}.${k}` : k, v);
      return;
    }
    const shown = /(_at)$/.test(prefix) && typeof value === "number" ? time(value)
      : Array.isArray(value) ? JSON.stringify(value) : String(value);
    rows.push(h("tr", {}, h("th", { scope: "row" }, prefix), h("td", {}, shown)));
  };
  walk("", header);
  return h("table", { class: "header" }, h("caption", {}, "Header (readable without any key)"),
           h("tbody", {}, rows));
}

function messageBlock(role, text) {
  return h("div", { class: `message role-${role}` }, h("div", { class: "role" }, role), prose(text));
}

function contentText(content) {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content.map((part) => (typeof part === "string" ? part : part.text ?? JSON.stringify(part)))
      .join("");
  }
  return content === null || content === undefined ? "" : JSON.stringify(content);
}

function bodyView(body) {
  const parts = [h("h2", {}, "Messages")];
  for (const message of body.messages || []) {
    parts.push(messageBlock(message.role || "?", contentText(message.content)));
  }
  (body.reasoning || []).forEach((trace, i) => {
    const long = (trace || "").length > 1200;
    parts.push(h("details", { class: "reasoning", open: !long },
      h("summary", {}, `Reasoning trace${body.reasoning.length > 1 ? ` (choice ${i})` : ""}: ` +
        `${(trace || "").length} characters`), prose(trace)));
  });
  (body.content || []).forEach((answer, i) => {
    parts.push(messageBlock(`answer${body.content.length > 1 ? ` (choice ${i})` : ""}`, answer));
  });
  if (body.tool_calls && body.tool_calls.length) {
    parts.push(h("h3", {}, "Tool calls"), h("pre", { class: "code" },
      h("code", {}, JSON.stringify(body.tool_calls, null, 2))));
  }
  if (body.params && Object.keys(body.params).length) {
    parts.push(h("details", {}, h("summary", {}, "Parameters"),
      h("pre", { class: "code" }, h("code", {}, JSON.stringify(body.params, null, 2)))));
  }
  return parts;
}

async function record(index) {
  const top = h("div", {}, h("p", { class: "loading" }, "Loading the record…"));
  replace(main, h("h1", {}, `Record ${index}`), top);
  let listed;
  try {
    listed = await verifyRecord(index, null);
  } catch (error) {
    replace(top, problem(error));
    return;
  }
  const header = listed.header;
  const body = h("section", { "aria-live": "polite" });
  const open = h("button", { type: "button", onclick: () => openBody(index, header, body, open) },
                 "Show the decrypted body");
  replace(top,
    h("p", {}, badgeFor(index, header)),
    headerTable(header),
    header.kind === "completion"
      ? h("div", { class: "card" },
          h("p", {}, "Opening the body decrypts it on the gateway, and that read is itself " +
            "appended to the ledger as an access record naming your key."),
          open, body)
      : null);
}

async function openBody(index, header, holder, button) {
  button.disabled = true;
  replace(holder, h("p", { class: "loading" }, "Decrypting…"));
  let opened;
  try {
    opened = await call(`/audit/v1/records/${index}`);
  } catch (error) {
    button.disabled = false;
    replace(holder, problem(error));
    return;
  }
  const parts = [];
  if (opened.body_status === "destroyed") {
    parts.push(h("p", { class: "destroyed" }, "Destroyed: this tenant's keys were shredded; the " +
      "header and the proofs remain, the body can never be read again."));
    try {
      const shreds = await call(`/audit/v1/records${query({ tenant: header.tenant, kind: "shred" })}`);
      for (const shred of shreds.data) {
        parts.push(h("p", {}, "Shredded by ", h("a", { href: `#record/${shred.index}` },
          `record ${shred.index}`), " at ", time(shred.header.created_at)));
      }
    } catch (error) {
      parts.push(problem(error));
    }
  } else if (opened.body_status === "none") {
    parts.push(h("p", {}, "No body was captured for this record (AUDIT_CAPTURE=metadata)."));
  } else {
    parts.push(...bodyView(opened.body));
  }
  const access = h("p", { class: "access" }, "Finding the access record…");
  parts.push(access);
  replace(holder, parts);
  try {
    const found = await call(`/audit/v1/records${query({ request_id: opened.access_request_id,
                                                          kind: "access" })}`);
    const own = found.data.find((r) => r.header.subject === index) || found.data[0];
    replace(access, own
      ? h("span", {}, "This read was recorded as ", h("a", { href: `#record/${own.index}` },
          `access record ${own.index}`), " at ", time(own.header.created_at), ".")
      : "The access record is not listed yet.");
  } catch (error) {
    replace(access, problem(error));
  }
}

// --- export --------------------------------------------------------------------------------

async function exportPage(params) {
  const filters = { tenant: params.get("tenant") || undefined, ...timeBounds(params) };
  const result = h("div", { "aria-live": "polite" });
  const name = `thinkgate-export-${new Date().toISOString().slice(0, 10)}.jsonl`;
  const button = h("button", { type: "button", onclick: async () => {
      button.disabled = true;
      replace(result, h("p", { class: "loading" }, "Exporting…"));
      try {
        const blob = await call(`/audit/v1/export${query(filters)}`, { accept: "blob" });
        download(blob, name);
        const lines = (await blob.text()).split("\n").filter(Boolean).length;
        replace(result, h("p", {}, `Downloaded ${name}: ${Math.max(0, lines - 1)} records and ` +
          "the checkpoint they are proven against."));
      } catch (error) {
        replace(result, problem(error));
      } finally {
        button.disabled = false;
      }
    } }, "Download export");
  const keyButton = h("button", { type: "button", class: "secondary", onclick: () =>
    download(new Blob([`${pinnedKey()}\n`], { type: "text/plain" }), "verifier.key") },
    "Download the pinned verifier key");
  replace(main, h("h1", {}, "Export"),
    filterForm(params, "export", ["tenant"]),
    h("div", { class: "card" },
      h("p", {}, "The export holds the records' headers and ciphertexts with an inclusion proof " +
        "each, against one signed checkpoint: no prompt, trace or answer."),
      button, " ", keyButton, result,
      h("p", {}, "Verify it offline, with no access to the gateway:"),
      h("pre", { class: "code", id: "verify-command" },
        h("code", {}, `thinkgate ledger verify --export ${name} --public-key verifier.key`))));
}

function download(blob, name) {
  const url = URL.createObjectURL(blob);
  const link = h("a", { href: url, download: name, hidden: true });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

// --- overview ------------------------------------------------------------------------------

async function overview(params) {
  if (!params.get("range")) params.set("range", "7d");
  const holder = h("div", {}, h("p", { class: "loading" }, "Reading headers…"));
  replace(main, h("h1", {}, "Overview"), filterForm(params, "overview", ["tenant", "model"]),
          h("p", { class: "help" }, "Drawn from the records' headers only: nothing is decrypted."),
          holder);
  const filters = { ...apiFilters(params), kind: "completion" };
  const all = [];
  let cursor;
  try {
    do {
      const page = await call(`/audit/v1/records${query({ ...filters, limit: 1000, cursor })}`);
      all.push(...page.data);
      cursor = page.next_cursor;
    } while (cursor && all.length < 20000);
  } catch (error) {
    replace(holder, problem(error));
    return;
  }
  if (!all.length) {
    replace(holder, h("p", { class: "empty" }, "No completions in this range."));
    return;
  }
  const days = new Map();
  const models = new Map();
  const keys = new Map();
  for (const { header } of all) {
    const day = new Date(header.created_at * 1000).toLocaleDateString();
    const entry = days.get(day) || { statuses: {}, reasoning: 0, answer: 0 };
    entry.statuses[header.status] = (entry.statuses[header.status] || 0) + 1;
    const used = tokens(header);
    entry.reasoning += used.reasoning;
    entry.answer += used.answer;
    days.set(day, entry);
    models.set(header.model, (models.get(header.model) || 0) + 1);
    keys.set(header.key_id, (keys.get(header.key_id) || 0) + 1);
  }
  replace(holder,
    h("section", {}, h("h2", {}, "Records per day, by status"),
      barChart([...days].map(([day, e]) => [day, e.statuses]), "records per day by status")),
    h("section", {}, h("h2", {}, "Reasoning and answer tokens per day"),
      barChart([...days].map(([day, e]) => [day, { reasoning: e.reasoning, answer: e.answer }]),
               "tokens per day")),
    h("div", { class: "columns" },
      top("Top models", "Model", models), top("Top keys", "Key id", keys)),
    h("p", { class: "help" }, `${all.length} completions.`));
}

function top(title, label, counts) {
  const rows = [...counts].sort((a, b) => b[1] - a[1]).slice(0, 10);
  return h("table", { class: "top" }, h("caption", {}, title),
    h("thead", {}, h("tr", {}, h("th", { scope: "col" }, label), h("th", { scope: "col" }, "Records"))),
    h("tbody", {}, rows.map(([name, n]) => h("tr", {}, h("td", {}, name), h("td", { class: "num" }, String(n))))));
}

// Stacked bars: one per day, a segment per series; a table under it for screen readers.
function barChart(points, label) {
  const series = [...new Set(points.flatMap(([, values]) => Object.keys(values)))];
  const color = (name, s) => COLORS[name] ?? (s % 6);
  const max = Math.max(1, ...points.map(([, v]) => Object.values(v).reduce((a, b) => a + b, 0)));
  const width = 640;
  const height = 180;
  const bar = Math.max(8, Math.min(60, (width - 40) / Math.max(1, points.length) - 8));
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height + 30}`, role: "img",
                             "aria-label": label, class: "chart" });
  points.forEach(([day, values], i) => {
    let y = height;
    series.forEach((name, s) => {
      const value = values[name] || 0;
      const size = (value / max) * (height - 10);
      y -= size;
      chart.append(svg("rect", { x: 30 + i * (bar + 8), y, width: bar, height: size,
                                 class: `series-${color(name, s)}` },
                             svg("title", {}, `${day} ${name}: ${value}`)));
    });
    chart.append(svg("text", { x: 30 + i * (bar + 8), y: height + 16, class: "axis" }, day));
  });
  const legend = h("ul", { class: "legend" }, series.map((name, s) =>
    h("li", {}, h("span", { class: `swatch series-${color(name, s)}` }), name)));
  chart.append(svg("text", { x: 0, y: 12, class: "axis" }, String(max)));
  const table = h("table", { class: "visually-hidden" }, h("caption", {}, label),
    h("thead", {}, h("tr", {}, h("th", {}, "Day"), series.map((s) => h("th", {}, s)))),
    h("tbody", {}, points.map(([day, values]) =>
      h("tr", {}, h("td", {}, day), series.map((s) => h("td", {}, String(values[s] || 0)))))));
  return h("div", {}, chart, legend, table);
}

// --- keys (admins) -------------------------------------------------------------------------

async function keysPage() {
  const list = h("div", {}, h("p", { class: "loading" }, "Loading keys…"));
  const created = h("div", { "aria-live": "polite" });
  const form = createForm(created, () => loadKeys(list));
  const tenants = h("div", {});
  replace(main, h("h1", {}, "Keys"), form, created, list, h("h2", {}, "Tenant limits"), tenants);
  await Promise.all([loadKeys(list), loadTenants(tenants)]);
}

function createForm(created, reload) {
  const tenant = h("input", { id: "k-tenant", required: true, autocomplete: "off" });
  const role = h("select", { id: "k-role" }, ["client", "auditor", "admin"].map((r) => h("option", { value: r }, r)));
  const reasoning = h("select", { id: "k-reasoning" }, ["hidden", "visible"].map((r) => h("option", { value: r }, r)));
  const rpm = h("input", { id: "k-rpm", type: "number", min: 1, inputmode: "numeric" });
  const tpm = h("input", { id: "k-tpm", type: "number", min: 1, inputmode: "numeric" });
  const field = (id, label, control) => h("div", { class: "field" }, h("label", { for: id }, label), control);
  return h("form", { class: "filters", "aria-label": "Create a key", onsubmit: async (event) => {
      event.preventDefault();
      const spec = { tenant: tenant.value.trim(), role: role.value, reasoning: reasoning.value };
      if (rpm.value) spec.rpm = Number(rpm.value);
      if (tpm.value) spec.tpm = Number(tpm.value);
      try {
        const made = await call("/admin/v1/keys", { method: "POST", body: spec });
        const secret = h("input", { id: "new-secret", readonly: true, value: made.key, class: "mono",
                                    "aria-label": "The new key's secret" });
        const copy = h("button", { type: "button", onclick: async () => {
            secret.select();
            try {
              await navigator.clipboard.writeText(made.key);
              copy.textContent = "Copied";
            } catch {
              copy.textContent = "Press Ctrl+C to copy";
            }
          } }, "Copy");
        replace(created, h("div", { class: "card secret", role: "status" },
          h("p", {}, h("strong", {}, `Key ${made.id} created. `),
            "Its secret is shown this once; only its hash is stored."), secret, copy));
        await reload();
      } catch (error) {
        replace(created, problem(error));
      }
    } },
    field("k-tenant", "Tenant", tenant), field("k-role", "Role", role),
    field("k-reasoning", "Reasoning", reasoning), field("k-rpm", "Requests/min", rpm),
    field("k-tpm", "Tokens/min", tpm),
    h("div", { class: "field actions" }, h("button", { type: "submit" }, "Create key")));
}

async function loadKeys(holder) {
  let keys;
  try {
    keys = await call("/admin/v1/keys");
  } catch (error) {
    replace(holder, problem(error));
    return;
  }
  const rows = keys.data.map((key) => {
    const revoke = h("button", { type: "button", class: "danger", "aria-label": `Revoke key ${key.id}` },
                     "Revoke");
    revoke.addEventListener("click", async () => {
      if (revoke.dataset.armed !== "yes") {
        revoke.dataset.armed = "yes";
        revoke.textContent = "Confirm revoke";
        revoke.setAttribute("aria-label", `Confirm revoking key ${key.id}`);
        return;
      }
      try {
        await call(`/admin/v1/keys/${encodeURIComponent(key.id)}`, { method: "DELETE" });
        await loadKeys(holder);
      } catch (error) {
        holder.prepend(problem(error));
      }
    });
    return h("tr", {},
      h("td", { class: "mono" }, key.id), h("td", {}, key.tenant), h("td", {}, key.role),
      h("td", {}, key.role === "client" ? key.reasoning : "-"),
      h("td", { class: "num" }, key.rpm ?? "-"), h("td", { class: "num" }, key.tpm ?? "-"),
      h("td", {}, time(key.created_at)),
      h("td", {}, key.revoked_at ? h("span", {}, "revoked ", time(key.revoked_at)) : "active"),
      h("td", {}, key.revoked_at ? "" : revoke));
  });
  replace(holder, h("table", { class: "keys" }, h("caption", {}, `${keys.data.length} keys`),
    h("thead", {}, h("tr", {}, ["Key id", "Tenant", "Role", "Reasoning", "RPM", "TPM", "Created",
      "Status", ""].map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, rows)));
}

async function loadTenants(holder) {
  try {
    const tenants = await call("/admin/v1/tenants");
    if (!tenants.data.length) {
      replace(holder, h("p", { class: "empty" }, "No tenant has limits configured (tenants in the settings)."));
      return;
    }
    replace(holder, h("table", {}, h("caption", {}, "Configured in the settings (read-only)"),
      h("thead", {}, h("tr", {}, ["Tenant", "RPM", "TPM", "Weight", "Priority"].map((t) =>
        h("th", { scope: "col" }, t)))),
      h("tbody", {}, tenants.data.map((t) => h("tr", {}, h("td", {}, t.tenant),
        h("td", { class: "num" }, t.rpm || "unlimited"), h("td", { class: "num" }, t.tpm || "unlimited"),
        h("td", { class: "num" }, String(t.weight)), h("td", {}, t.priority))))));
  } catch (error) {
    replace(holder, problem(error));
  }
}

// --- routing -------------------------------------------------------------------------------

// --- retention and legal holds ----------------------------------------------------------------

function days(count) {
  return count === null || count === undefined ? "kept forever" : `${count} days`;
}

async function retentionPage() {
  const kept = await call("/audit/v1/retention");
  const when = (at) => (at === null || at === undefined ? "-" : time(at));
  const sections = kept.data.map((tenant) => h("section", { class: "card" },
    h("h2", {}, `Tenant ${tenant.tenant}`),
    h("p", {}, "Retention: ", h("strong", {}, days(tenant.days)),
      tenant.own ? " (set for this tenant)" : " (the gateway's default)"),
    tenant.holds.length
      ? h("table", { class: "holds" },
          h("caption", {}, "Legal holds (records they cover survive retention and shredding)"),
          h("thead", {}, h("tr", {}, ["Hold", "Reason", "Key", "From", "Until", "Placed",
            "Released"].map((t) => h("th", { scope: "col" }, t)))),
          h("tbody", {}, tenant.holds.map((hold) => h("tr", { class: hold.released_at ? "released" : "" },
            h("td", { class: "mono" }, hold.id), h("td", {}, hold.reason),
            h("td", { class: "mono" }, hold.key_id || "every key"), h("td", {}, when(hold.since)),
            h("td", {}, when(hold.until)), h("td", {}, when(hold.placed_at)),
            h("td", {}, hold.released_at ? when(hold.released_at) : h("span", { class: "tag held" }, "in force"))))))
      : h("p", { class: "empty" }, "No legal holds.")));
  replace(main, h("h1", {}, "Retention and legal holds"),
    h("p", { class: "help" }, `The gateway's default retention: ${days(kept.default_days)}. ` +
      "Records past their tenant's retention become unreadable a UTC day at a time; the tree " +
      "and every proof stay valid."),
    sections.length ? sections : h("p", { class: "empty" }, "No tenant has a retention or a hold of its own."));
}

async function route() {
  const role = sessionStorage.getItem(ROLE);
  if (!session.key || !role) {
    signIn();
    return;
  }
  const { path, params } = parseRoute();
  const [page, arg] = path.split("/");
  document.getElementById("banner").replaceChildren();
  navigation(role, page);
  try {
    if (role === "admin" && page === "spend") {
      await spendPage(main, params, { go, problem });
    } else if (role === "admin") {
      await keysPage();
    } else if (page === "record" && /^[0-9]+$/.test(arg || "")) {
      await record(Number(arg));
    } else if (page === "overview") {
      await overview(params);
    } else if (page === "export") {
      await exportPage(params);
    } else if (page === "retention") {
      await retentionPage();
    } else {
      await records(params);
    }
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) {
      session.key = null;
      signIn(error);
      return;
    }
    main.append(problem(error));
  }
  main.focus();
}

window.addEventListener("hashchange", route);
document.querySelector(".skip").addEventListener("click", (event) => {
  event.preventDefault(); // the fragment is the route: move the focus instead
  main.focus();
});
document.getElementById("forget").addEventListener("click", () => {
  forget();
  say("Forgot the pinned verifier key and checkpoint: the next sign-in pins again.");
});
route();
