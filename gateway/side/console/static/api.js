// The auditor and admin APIs, called with the pasted key (sessionStorage only).

const KEY = "thinkgate.key";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export const session = {
  get key() {
    return sessionStorage.getItem(KEY);
  },
  set key(value) {
    if (value) sessionStorage.setItem(KEY, value);
    else sessionStorage.removeItem(KEY);
  },
};

export async function call(path, { method = "GET", body, accept = "json", key } = {}) {
  const headers = { authorization: `Bearer ${key ?? session.key ?? ""}` };
  if (body !== undefined) headers["content-type"] = "application/json";
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "omit",
      cache: "no-store",
    });
  } catch (error) {
    throw new ApiError(0, `the gateway cannot be reached (${error.message})`);
  }
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try {
      const payload = await response.json();
      if (payload && payload.error && payload.error.message) message = payload.error.message;
    } catch {
      /* not JSON: the status says it */
    }
    throw new ApiError(response.status, message);
  }
  if (accept === "text") return response.text();
  if (accept === "blob") return response.blob();
  return response.json();
}

export function query(params) {
  const given = Object.entries(params).filter(([, v]) => v !== undefined && v !== null && v !== "");
  return given.length ? `?${new URLSearchParams(given)}` : "";
}
