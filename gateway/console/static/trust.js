// What this browser has verified and keeps (localStorage, per gateway origin): the verifier key
// pinned on first use and the last checkpoint it verified. Each new checkpoint must be signed by
// the pinned key and extend the kept one (a consistency proof), so a server that rewrites
// history is caught here, whatever it serves afterwards.

import { call, query } from "./api.js";
import {
  VerifyError,
  fromBase64,
  leafHash,
  parseVerifierKey,
  toBase64,
  verifyCheckpoint,
  verifyConsistency,
  verifyInclusion,
} from "./verify.js";

const PINNED = "thinkgate.verifier";
const SEEN = "thinkgate.checkpoint";

export function pinnedKey() {
  return localStorage.getItem(PINNED);
}

export function forget() {
  localStorage.removeItem(PINNED);
  localStorage.removeItem(SEEN);
}

// Pin `expected` (pasted by the auditor) or, the first time, the key the gateway serves.
// Returns {key, pinnedNow}. A served key other than the pinned one is an error.
export async function pin(expected) {
  const served = (await call("/audit/v1/public-key", { accept: "text" })).trim();
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
  const cp = await verifyCheckpoint(note, verifier);
  const seen = JSON.parse(localStorage.getItem(SEEN) || "null");
  if (seen) {
    const seenRoot = fromBase64(seen.root);
    const seenSize = BigInt(seen.size);
    let hashes = [];
    if (seenSize > 0n && seenSize < cp.size) {
      const proof = await call(
        `/audit/v1/proof/consistency${query({ first: seen.size, second: cp.size.toString() })}`,
      );
      hashes = proof.hashes.map(fromBase64);
    }
    await verifyConsistency(seenSize, cp.size, seenRoot, cp.root, hashes);
  }
  localStorage.setItem(SEEN, JSON.stringify({ size: cp.size.toString(), root: toBase64(cp.root) }));
  return cp;
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
