// What this browser has verified and keeps (localStorage, per gateway origin): the verifier key
// pinned on first use and the last checkpoint it verified. Each new checkpoint must be signed by
// the pinned key and extend the kept one (a consistency proof), so a server that rewrites
// history is caught here, whatever it serves afterwards.

import { call, query } from "./api.js";
import {
  VerifyError,
  cosigners,
  fromBase64,
  leafHash,
  parseCosignerKey,
  parseVerifierKey,
  toBase64,
  verifyCheckpoint,
  verifyConsistency,
  verifyInclusion,
} from "./verify.js";

const PINNED = "thinkgate.verifier";
const SEEN = "thinkgate.checkpoint";
const POLICY = "thinkgate.witnesses"; // {keys: [cosigner keys], quorum}

// The witness policy: cosigner keys the auditor trusts and how many must have cosigned the
// checkpoint the page verifies records against. Empty: no witnesses required.
export function policy() {
  return JSON.parse(localStorage.getItem(POLICY) || "null");
}

export async function setPolicy(text, quorum) {
  const keys = String(text || "").split("\n").map((k) => k.trim()).filter(Boolean);
  if (!keys.length) {
    localStorage.removeItem(POLICY);
    return null;
  }
  for (const key of keys) await parseCosignerKey(key); // refuse a bad one now, loudly
  const wanted = quorum ? Number(quorum) : keys.length;
  if (!Number.isInteger(wanted) || wanted < 1 || wanted > keys.length) {
    throw new VerifyError(`the cosignatures required must be 1 to ${keys.length}`);
  }
  const chosen = { keys, quorum: wanted };
  localStorage.setItem(POLICY, JSON.stringify(chosen));
  return chosen;
}

export function pinnedKey() {
  return localStorage.getItem(PINNED);
}

export function forget() {
  localStorage.removeItem(PINNED);
  localStorage.removeItem(SEEN);
  localStorage.removeItem(POLICY);
}

// Pin `expected` (pasted by the auditor) or, the first time, the key the gateway serves.
// Returns {key, pinnedNow}. A served key other than the pinned one is an error.
export async function pin(expected, key) {
  const served = (await call("/audit/v1/public-key", { accept: "text", key })).trim();
  const pinned = (expected || "").trim() || pinnedKey();
  if (pinned && pinned !== served) {
    throw new VerifyError(
      `the gateway serves the verifier key ${served}, not the pinned ${pinned}: its ` +
        "checkpoints are not trusted (if the log's key was rotated, forget the pinned key)",
    );
  }
  await parseVerifierKey(served);
  const pinnedNow = !pinnedKey();
  localStorage.setItem(PINNED, served);
  return { key: served, pinnedNow };
}

let current = null; // the verification of this page's checkpoint: a Promise of {size, root}

// The gateway's latest checkpoint, verified: the pinned key's signature, and consistent with
// the last one this browser verified. Then it becomes the kept one. Callers during a refresh
// wait for it.
export function checkpoint({ refresh = false } = {}) {
  if (!current || refresh) {
    current = latest();
    current.catch(() => {}); // each caller sees the failure; none goes unhandled
  }
  return current;
}

async function latest() {
  const vkey = pinnedKey();
  if (!vkey) throw new VerifyError("no verifier key is pinned: sign in again");
  const verifier = await parseVerifierKey(vkey);
  const note = await call("/audit/v1/checkpoint", { accept: "text" });
  let cp = await verifyCheckpoint(note, verifier);
  const rules = policy();
  if (rules) cp = await witnessed(cp, verifier, rules);
  const seen = JSON.parse(localStorage.getItem(SEEN) || "null");
  if (seen && rules && BigInt(seen.size) > cp.size) {
    // the witnessed head is older than one verified before (without witnesses): it must be
    // a prefix of that one; the kept checkpoint stays the larger
    await consistent(cp.size, cp.root, BigInt(seen.size), fromBase64(seen.root));
    return cp;
  }
  if (seen) await consistent(BigInt(seen.size), fromBase64(seen.root), cp.size, cp.root);
  localStorage.setItem(SEEN, JSON.stringify({ size: cp.size.toString(), root: toBase64(cp.root) }));
  return cp;
}

async function consistent(first, firstRoot, second, secondRoot) {
  let hashes = [];
  if (first > 0n && first < second) {
    const proof = await call(`/audit/v1/proof/consistency${query({
      first: first.toString(), second: second.toString() })}`);
    hashes = proof.hashes.map(fromBase64);
  }
  await verifyConsistency(first, second, firstRoot, secondRoot, hashes);
}

// The newest checkpoint that carries the policy's quorum of cosignatures: the latest one if
// it does, else the one the log publishes (/tlog/checkpoint: cosigned by the witnesses the
// gateway is configured with) if it does, else the newest such among the stored ones
// (witnesses cosign a moment after the log signs). Records past it show as not yet signed.
async function witnessed(latest, verifier, rules) {
  const witnesses = await Promise.all(rules.keys.map(parseCosignerKey));
  const enough = async (candidate) => {
    const names = await cosigners(candidate.text, witnesses);
    return names.length >= rules.quorum ? { ...candidate, witnesses: names } : null;
  };
  const direct = await enough(latest);
  if (direct) return direct;
  const publishedNote = await call("/tlog/checkpoint", { accept: "text" }).catch((error) => {
    if (error.status === 404) return null; // none published yet: look among the stored ones
    throw error;
  });
  if (publishedNote) {
    const published = await enough(await verifyCheckpoint(publishedNote, verifier));
    if (published) return published;
  }
  const seen = JSON.parse(localStorage.getItem(SEEN) || "null");
  let size = seen ? seen.size : "1";
  let best = null;
  while (size) {
    const page = await call(`/audit/v1/checkpoints${query({ size, limit: 1000 })}`);
    for (const stored of page.data) {
      const checked = await enough(await verifyCheckpoint(stored.note, verifier));
      if (checked) best = checked;
    }
    size = page.next_size;
  }
  if (!best) {
    throw new VerifyError(
      `no checkpoint carries ${rules.quorum} cosignatures of the trusted witnesses ` +
        `(${witnesses.map((w) => w.name).join(", ")})`,
    );
  }
  return best;
}

export function kept() {
  return JSON.parse(localStorage.getItem(SEEN) || "null");
}

function canonical(value) {
  if (Array.isArray(value)) return value.map(canonical);
  if (value && typeof value === "object") {
    return Object.fromEntries(Object.keys(value).sort().map((k) => [k, canonical(value[k])]));
  }
  return value;
}

// One record checked end to end: its stored bytes hash to the leaf, the leaf is in the signed
// tree, and the header shown (`shown`, what the listing said) is the one in those bytes.
// Returns {state: "verified" | "pending", header} or throws VerifyError.
export async function verifyRecord(index, shown) {
  const cp = await checkpoint();
  const raw = await call(`/audit/v1/records/${index}/raw`);
  const headerBytes = fromBase64(raw.header);
  const leaf = await leafHash(headerBytes, fromBase64(raw.ciphertext));
  let header;
  try {
    header = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(headerBytes));
  } catch {
    throw new VerifyError("the record's stored header is not JSON");
  }
  if (shown && JSON.stringify(canonical(shown)) !== JSON.stringify(canonical(header))) {
    throw new VerifyError("the header the listing shows is not the one in the record's bytes");
  }
  if (BigInt(index) >= cp.size) return { state: "pending", header };
  const proof = await call(
    `/audit/v1/proof/inclusion${query({ index, tree_size: cp.size.toString() })}`,
  );
  if (proof.leaf_hash !== toBase64(leaf)) {
    throw new VerifyError("the record's bytes do not hash to its leaf in the tree");
  }
  await verifyInclusion(index, cp.size, leaf, proof.hashes.map(fromBase64), cp.root);
  return { state: "verified", header };
}
