// The Spend page (admins, #spend?since=&until=&tenant=&key=): budgets with what their window
// spent, set and removed here; and what the ledger says was spent, per tenant, key and model
// (GET /admin/v1/spend, the figures `thinkgate spend report` gives). Amounts stay decimal
// strings from the gateway: nothing is summed or rounded in the browser.

import { call, query } from "./api.js";
import { h, replace } from "./dom.js";

const PERIODS = { day: "per day", month: "per month" };

// Share of a budget used, for the meter: decimals as numbers only to draw, never to show.
function share(spent, amount) {
  const used = Number(spent) / Number(amount);
  return Number.isFinite(used) ? Math.max(0, used) : 0;
}

function meter(budget) {
  const used = share(budget.spent, budget.amount);
  const level = used >= 1 ? "bad" : used >= 0.8 ? "warn" : "ok";
  return h("meter", { min: 0, max: 1, low: 0.8, high: 0.99, optimum: 0, value: Math.min(used, 1),
                      class: level, "aria-label": `${Math.round(used * 100)} % used` });
}

function budgetRows(budgets, reload, report) {
  return budgets.map((b) => {
    const remove = h("button", { type: "button", class: "danger",
                                 "aria-label": `Remove the ${b.scope} ${b.subject} budget ${PERIODS[b.period]}` },
                     "Remove");
    remove.addEventListener("click", async () => {
      if (remove.dataset.armed !== "yes") {
        remove.dataset.armed = "yes";
        remove.textContent = "Confirm remove";
        remove.setAttribute("aria-label", `Confirm removing the ${b.scope} ${b.subject} budget ${PERIODS[b.period]}`);
        return;
      }
      try {
        await call(`/admin/v1/budgets/${b.scope}/${encodeURIComponent(b.subject)}/${b.period}`,
                   { method: "DELETE" });
        await reload();
      } catch (error) {
        report(error);
      }
    });
    const used = share(b.spent, b.amount);
    return h("tr", { class: used >= 1 ? "spent" : "" },
      h("td", {}, b.scope), h("td", { class: "mono" }, b.subject), h("td", {}, PERIODS[b.period]),
      h("td", { class: "num" }, `${b.amount} ${b.currency}`),
      h("td", { class: "num" }, `${b.spent} ${b.currency}`), h("td", {}, meter(b)),
      h("td", { class: "num" }, `${b.remaining} ${b.currency}`),
      h("td", {}, b.soft ? "soft (alerts only)" : "hard (refuses)"),
      h("td", {}, h("time", { datetime: b.resets_at }, b.resets_at)),
      h("td", {}, remove));
  });
}

async function loadBudgets(holder, report) {
  const reload = () => loadBudgets(holder, report);
  const budgets = await call("/admin/v1/budgets");
  if (!budgets.data.length) {
    replace(holder, h("p", { class: "empty" }, "No budgets yet."));
    return;
  }
  replace(holder, h("table", { class: "budgets" },
    h("caption", {}, `${budgets.data.length} budgets, each in its current UTC window`),
    h("thead", {}, h("tr", {}, ["Scope", "Subject", "Period", "Budget", "Spent", "Used",
      "Remaining", "Kind", "Resets", ""].map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, budgetRows(budgets.data, reload, report))));
}

function budgetForm(holder, report) {
  const field = (id, label, control) => h("div", { class: "field" }, h("label", { for: id }, label), control);
  const scope = h("select", { id: "b-scope" }, ["tenant", "key"].map((s) => h("option", { value: s }, s)));
  const subject = h("input", { id: "b-subject", required: true, autocomplete: "off",
                               placeholder: "tenant name or key id" });
  const amount = h("input", { id: "b-amount", required: true, inputmode: "decimal",
                              pattern: "[0-9]+(\\.[0-9]+)?", autocomplete: "off" });
  const period = h("select", { id: "b-period" }, Object.entries(PERIODS).map(([v, l]) =>
    h("option", { value: v }, l)));
  const soft = h("input", { id: "b-soft", type: "checkbox" });
  return h("form", { class: "filters", "aria-label": "Set a budget", onsubmit: async (event) => {
      event.preventDefault();
      const path = `/admin/v1/budgets/${scope.value}/${encodeURIComponent(subject.value.trim())}/${period.value}`;
      try {
        await call(path, { method: "PUT", body: { amount: amount.value.trim(), soft: soft.checked } });
        await loadBudgets(holder, report);
      } catch (error) {
        report(error);
      }
    } },
    field("b-scope", "Scope", scope), field("b-subject", "Tenant or key id", subject),
    field("b-amount", "Amount", amount), field("b-period", "Period", period),
    field("b-soft", "Soft (alert only)", soft),
    h("div", { class: "field actions" }, h("button", { type: "submit" }, "Set budget")));
}

function reportForm(params, go) {
  const input = (name, label, type = "text") => h("div", { class: "field" },
    h("label", { for: `s-${name}` }, label),
    h("input", { id: `s-${name}`, name, type, value: params.get(name) || "", autocomplete: "off" }));
  return h("form", { class: "filters", role: "search", "aria-label": "Spend report",
                     onsubmit: (event) => {
      event.preventDefault();
      const next = {};
      for (const control of event.target.querySelectorAll("input")) next[control.name] = control.value.trim();
      go("spend", next);
    } },
    input("tenant", "Tenant"), input("key", "Key id"),
    input("since", "Since (RFC 3339 or Unix time)"), input("until", "Until"),
    h("div", { class: "field actions" }, h("button", { type: "submit" }, "Report")));
}

async function loadReport(holder, params) {
  const wanted = Object.fromEntries(["tenant", "key", "since", "until"].map((n) => [n, params.get(n)]));
  const found = await call(`/admin/v1/spend${query(wanted)}`);
  const totals = Object.entries(found.totals).map(([currency, amount]) =>
    h("li", {}, h("strong", { class: "num" }, `${amount} ${currency}`)));
  const rows = found.data.map((r) => h("tr", {},
    h("td", {}, r.tenant), h("td", { class: "mono" }, r.key_id), h("td", {}, r.model),
    h("td", { class: "num" }, String(r.requests)), h("td", { class: "num" }, String(r.prompt_tokens)),
    h("td", { class: "num" }, String(r.completion_tokens)),
    h("td", { class: "num" }, String(r.reasoning_tokens)),
    h("td", { class: "num" }, `${r.amount} ${r.currency}`)));
  replace(holder,
    h("ul", { class: "totals", "aria-label": "Totals" }, totals.length ? totals : h("li", {}, "Nothing spent")),
    found.unpriced ? h("p", { class: "help" }, `${found.unpriced} records carry no price (made before prices were set, or a model served unpriced).`) : null,
    rows.length
      ? h("table", { class: "spend" }, h("caption", {}, "From the ledger's records (their cost, as each header holds it)"),
          h("thead", {}, h("tr", {}, ["Tenant", "Key id", "Model", "Requests", "Prompt tokens",
            "Completion tokens", "Reasoning tokens", "Spent"].map((t) => h("th", { scope: "col" }, t)))),
          h("tbody", {}, rows))
      : h("p", { class: "empty" }, "No records in this range."));
}

export async function spendPage(main, params, { go, problem }) {
  const notes = h("div", { "aria-live": "polite" });
  const report = (error) => replace(notes, problem(error));
  const budgets = h("div", {}, h("p", { class: "loading" }, "Loading budgets…"));
  const spent = h("div", {}, h("p", { class: "loading" }, "Loading the report…"));
  replace(main, h("h1", {}, "Spend"),
    h("h2", {}, "Budgets"), budgetForm(budgets, report), notes, budgets,
    h("h2", {}, "Spent, from the ledger"), reportForm(params, go), spent);
  const settled = await Promise.allSettled([loadBudgets(budgets, report), loadReport(spent, params)]);
  const [byBudgets, byReport] = settled;
  if (byBudgets.status === "rejected") replace(budgets, problem(byBudgets.reason));
  if (byReport.status === "rejected") replace(spent, problem(byReport.reason));
}
