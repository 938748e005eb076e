// Building the page without HTML strings: every text goes in as a text node, so a record whose
// reasoning holds <script> or a javascript: link shows it, inert.

export function h(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  append(node, children);
  return node;
}

export function append(node, children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  append(node, children);
  return node;
}

export function replace(node, ...children) {
  node.replaceChildren();
  return append(node, children);
}

// A time in the auditor's time zone, UTC on hover.
export function time(seconds) {
  if (seconds === null || seconds === undefined) return h("span", {}, "-");
  const date = new Date(seconds * 1000);
  return h("time", { datetime: date.toISOString(), title: `${date.toISOString()} (UTC)` },
           date.toLocaleString());
}

// Text with ``` fences as code blocks, the rest as paragraphs: all of it text nodes.
export function prose(text) {
  const parts = String(text ?? "").split(/```[^\n]*\n?/);
  return parts
    .map((part, i) =>
      i % 2 === 1
        ? h("pre", { class: "code" }, h("code", {}, part))
        : h("p", { class: "text" }, part.replace(/^\n+|\s+$/g, "")),
    )
    .filter((node) => node.textContent !== "" || node.tagName === "PRE");
}
