// What the browser checks itself, with Web Crypto only (SHA-256, Ed25519): nothing here trusts
// the server that sent the bytes.
//
// - leaf:        SHA-256(0x00 || len(header) as 4 bytes big-endian || header || ciphertext)
// - inclusion:   RFC 9162 §2.1.3.2, from the leaf and the proof to the checkpoint's root
// - consistency: RFC 9162 §2.1.4.2, from the pinned checkpoint's root to a newer one's
// - checkpoint:  C2SP signed-note + tlog-checkpoint; Ed25519 over the note's text, by the key
//                the auditor pinned (its name and key ID must match the signature line)
//
// Every failure throws VerifyError with what failed, in words an auditor can act on.

export class VerifyError extends Error {}

const encoder = new TextEncoder();

function subtle() {
  if (!globalThis.crypto || !globalThis.crypto.subtle) {
    throw new VerifyError(
      "this page is not a secure context (serve the console over HTTPS, or open it on " +
        "localhost): the browser offers no Web Crypto to verify with",
    );
  }
  return globalThis.crypto.subtle;
}

export function fromBase64(text) {
  let binary;
  try {
    binary = atob(text);
  } catch {
    throw new VerifyError(`not base64: ${String(text).slice(0, 40)}`);
  }
  const out = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) out[i] = binary.charCodeAt(i);
  return out;
}

export function toBase64(bytes) {
  let binary = "";
  for (const b of bytes) binary += String.fromCharCode(b);
  return btoa(binary);
}

export function toHex(bytes) {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function concat(...parts) {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

export function equal(a, b) {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a[i] ^ b[i];
  return diff === 0;
}

export async function sha256(bytes) {
  return new Uint8Array(await subtle().digest("SHA-256", bytes));
}

const LEAF = new Uint8Array([0]);
const NODE = new Uint8Array([1]);

export async function leafHash(header, ciphertext) {
  const length = new Uint8Array(4);
  new DataView(length.buffer).setUint32(0, header.length, false);
  return sha256(concat(LEAF, length, header, ciphertext));
}

// RFC 9162's "right-shift both until LSB(fn) is set or fn is 0".
function shiftToOdd(fn, sn) {
  while ((fn & 1n) === 0n && fn !== 0n) {
    fn >>= 1n;
    sn >>= 1n;
  }
  return [fn, sn];
}

function node(left, right) {
  return sha256(concat(NODE, left, right));
}

// RFC 9162 §2.1.3.2. Sizes and indexes as BigInt: JavaScript's bit operators are 32-bit.
export async function verifyInclusion(index, size, leaf, proof, root) {
  let fn = BigInt(index);
  let sn = BigInt(size) - 1n;
  if (fn > sn) throw new VerifyError(`record ${index} is not in a tree of size ${size}`);
  let r = leaf;
  for (const p of proof) {
    if (sn === 0n) throw new VerifyError("the inclusion proof is longer than the tree allows");
    if ((fn & 1n) === 1n || fn === sn) {
      r = await node(p, r);
      if ((fn & 1n) === 0n) [fn, sn] = shiftToOdd(fn, sn);
    } else {
      r = await node(r, p);
    }
    fn >>= 1n;
    sn >>= 1n;
  }
  if (sn !== 0n) throw new VerifyError("the inclusion proof is too short for the tree");
  if (!equal(r, root)) {
    throw new VerifyError("the inclusion proof does not lead to the signed root");
  }
}

// RFC 9162 §2.1.4.2: the tree of size `second` (root `secondRoot`) extends the tree of size
// `first` (root `firstRoot`).
export async function verifyConsistency(first, second, firstRoot, secondRoot, proof) {
  const m = BigInt(first);
  const n = BigInt(second);
  if (m > n) throw new VerifyError(`the log shrank from ${first} to ${second} records`);
  if (m === n) {
    if (proof.length !== 0 || !equal(firstRoot, secondRoot)) {
      throw new VerifyError(`two different trees of size ${first}: the log was rewritten`);
    }
    return;
  }
  if (m === 0n) return; // the empty tree is a prefix of every tree
  let path = proof.slice();
  if ((m & (m - 1n)) === 0n) path = [firstRoot, ...path]; // a power of two: its own root
  if (path.length === 0) throw new VerifyError("the consistency proof is empty");
  let fn = m - 1n;
  let sn = n - 1n;
  while ((fn & 1n) === 1n) {
    fn >>= 1n;
    sn >>= 1n;
  }
  let fr = path[0];
  let sr = path[0];
  for (const c of path.slice(1)) {
    if (sn === 0n) throw new VerifyError("the consistency proof is longer than the trees allow");
    if ((fn & 1n) === 1n || fn === sn) {
      fr = await node(c, fr);
      sr = await node(c, sr);
      if ((fn & 1n) === 0n) [fn, sn] = shiftToOdd(fn, sn);
    } else {
      sr = await node(sr, c);
    }
    fn >>= 1n;
    sn >>= 1n;
  }
  if (sn !== 0n || !equal(fr, firstRoot) || !equal(sr, secondRoot)) {
    throw new VerifyError(
      `the checkpoint of size ${second} does not extend the one of size ${first} this ` +
        "browser verified before: the log was rewritten",
    );
  }
}

// A verifier key: <name>+<key ID, 8 hex>+<base64(0x01 || 32-byte Ed25519 key)>.
export async function parseVerifierKey(text) {
  const vkey = String(text).trim();
  const first = vkey.indexOf("+");
  const second = vkey.indexOf("+", first + 1);
  const [name, idHex, encoded] = [vkey.slice(0, first), vkey.slice(first + 1, second),
                                  vkey.slice(second + 1)]; // base64 may itself hold "+"
  if (first < 1 || second < 0 || !/^[0-9a-f]{8}$/i.test(idHex)) {
    throw new VerifyError("not a note verifier key (<name>+<key id>+<key>)");
  }
  const typed = fromBase64(encoded);
  if (typed.length !== 33 || typed[0] !== 1) {
    throw new VerifyError("the verifier key is not an Ed25519 key");
  }
  const id = (await sha256(concat(encoder.encode(name + "\n"), typed))).slice(0, 4);
  if (toHex(id) !== idHex.toLowerCase()) {
    throw new VerifyError("the verifier key's ID does not match its key");
  }
  let key;
  try {
    key = await subtle().importKey("raw", typed.slice(1), { name: "Ed25519" }, false, ["verify"]);
  } catch (error) {
    throw new VerifyError(`this browser cannot use Ed25519 keys (${error.name})`);
  }
  return { text: vkey, name, id, key };
}

// A checkpoint (signed note) verified by `verifier`: {origin, size, root, text}.
export async function verifyCheckpoint(note, verifier) {
  const split = note.lastIndexOf("\n\n");
  if (split < 0 || !note.endsWith("\n")) throw new VerifyError("the checkpoint is not a signed note");
  const text = note.slice(0, split + 1);
  const lines = note.slice(split + 2, -1).split("\n");
  let signed = false;
  for (const line of lines) {
    const match = /^\u2014 (\S+) ([A-Za-z0-9+/=]+)$/.exec(line);
    if (!match) throw new VerifyError("the checkpoint has a malformed signature line");
    const raw = fromBase64(match[2]);
    if (match[1] !== verifier.name || raw.length !== 68 || !equal(raw.slice(0, 4), verifier.id)) {
      continue; // another key's signature (a witness): not ours to check
    }
    const ok = await subtle().verify({ name: "Ed25519" }, verifier.key, raw.slice(4),
                                     encoder.encode(text));
    if (!ok) throw new VerifyError("the checkpoint's signature is invalid");
    signed = true;
    break;
  }
  if (!signed) throw new VerifyError("the checkpoint is not signed by the pinned key");
  const body = text.split("\n");
  if (body.length < 4 || body[0] !== verifier.name) {
    throw new VerifyError(`the checkpoint is for another log (${body[0]})`);
  }
  if (!/^(0|[1-9][0-9]*)$/.test(body[1])) throw new VerifyError("the checkpoint's size is malformed");
  const root = fromBase64(body[2]);
  if (root.length !== 32) throw new VerifyError("the checkpoint's root is not a SHA-256 hash");
  return { origin: body[0], size: BigInt(body[1]), root, text: note };
}

// A witness's cosigner key: <name>+<key ID>+<base64(0x04 || 32-byte Ed25519 key)> (C2SP
// tlog-cosignature, cosignature/v1).
export async function parseCosignerKey(text) {
  const vkey = String(text).trim();
  const first = vkey.indexOf("+");
  const second = vkey.indexOf("+", first + 1);
  const [name, idHex, encoded] = [vkey.slice(0, first), vkey.slice(first + 1, second),
                                  vkey.slice(second + 1)];
  if (first < 1 || second < 0 || !/^[0-9a-f]{8}$/i.test(idHex)) {
    throw new VerifyError(`not a witness key: ${vkey.slice(0, 40)}`);
  }
  const typed = fromBase64(encoded);
  if (typed.length !== 33 || typed[0] !== 4) {
    throw new VerifyError(`not an Ed25519 cosignature/v1 key: ${name}`);
  }
  const id = (await sha256(concat(encoder.encode(name + "\n"), typed))).slice(0, 4);
  if (toHex(id) !== idHex.toLowerCase()) {
    throw new VerifyError(`the witness key's ID does not match its key: ${name}`);
  }
  const key = await subtle().importKey("raw", typed.slice(1), { name: "Ed25519" }, false,
                                       ["verify"]);
  return { text: vkey, name, id, key };
}

// The names of the trusted witnesses whose valid cosignature the (log-verified) note carries.
export async function cosigners(note, witnesses) {
  const split = note.lastIndexOf("\n\n");
  const body = note.slice(0, split + 1);
  const lines = note.slice(split + 2).split("\n").filter(Boolean);
  const found = [];
  for (const witness of witnesses) {
    for (const line of lines) {
      const match = /^\u2014 (\S+) ([A-Za-z0-9+/=]+)$/.exec(line);
      if (!match || match[1] !== witness.name) continue;
      const raw = fromBase64(match[2]);
      if (raw.length !== 76 || !equal(raw.slice(0, 4), witness.id)) continue;
      const time = new DataView(raw.buffer, raw.byteOffset + 4, 8).getBigUint64(0, false);
      const message = encoder.encode(`cosignature/v1\ntime ${time}\n${body}`);
      if (await subtle().verify({ name: "Ed25519" }, witness.key, raw.slice(12), message)) {
        found.push(witness.name);
        break;
      }
    }
  }
  return found;
}
