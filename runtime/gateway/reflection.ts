/**
 * Reflection masking (E10, T20): an upstream that echoes what it received must not hand a real
 * credential value back to the sandbox. Every occurrence of a value this sandbox holds is overwritten
 * with `*` (same length, so framing stays right) in the forms the gateway can recognise: the bytes as
 * sent, any ASCII case folding of them, lower/upper-case hex, and standard and URL-safe base64 at each
 * of the three byte alignments (the aligned middle of the encoding, which does not depend on the
 * neighbouring bytes). Compressed bodies are handled by the caller (gunzip, mask, gzip again).
 * What is NOT recognised (the residual risk in docs/egress.md, Credentials): other encodings
 * (base32, URL-encoding of non-ASCII, MIME-wrapped base64 with line breaks inside the value, custom
 * ciphers), fragments shorter than the whole value, and anything the sandbox can derive from side
 * channels.
 */
import { Transform, type TransformCallback } from 'node:stream';

/** The byte patterns to mask for a set of secrets. */
export interface Needles {
  /** Matched byte for byte. */
  readonly exact: readonly Buffer[];
  /** Lower-case ASCII; matched against the lower-cased text (any case of the original matches). */
  readonly folded: readonly Buffer[];
  /** Longest needle, bytes (how much a stream must hold back between chunks). */
  readonly longest: number;
}

const toUrlSafe = (b64: string) => b64.replace(/\+/g, '-').replace(/\//g, '_');

/** The base64 characters of `secret` that do not depend on neighbours, when it starts at byte offset `k` of a 3-byte group. */
function alignedBase64(secret: Buffer, k: number): string {
  const enc = Buffer.concat([Buffer.alloc(k), secret]).toString('base64');
  const first = Math.ceil((8 * k) / 6);
  const end = Math.floor((8 * (k + secret.length)) / 6);
  return enc.slice(first, end);
}

/** Builds the needles for `secrets` (empty strings ignored). Pure. */
export function needlesFor(secrets: readonly string[]): Needles {
  const exact = new Set<string>();
  const folded = new Set<string>();
  for (const s of secrets) {
    if (s.length === 0) continue;
    const raw = Buffer.from(s);
    folded.add(s.toLowerCase());
    folded.add(raw.toString('hex'));
    for (let k = 0; k < 3; k++) {
      const b64 = alignedBase64(raw, k);
      if (b64.length < 4) continue;
      exact.add(b64);
      exact.add(toUrlSafe(b64));
    }
  }
  const ex = [...exact].map((t) => Buffer.from(t, 'latin1'));
  const fo = [...folded].map((t) => Buffer.from(t, 'latin1'));
  return {
    exact: ex,
    folded: fo,
    longest: Math.max(0, ...ex.map((b) => b.length), ...fo.map((b) => b.length)),
  };
}

/** ASCII lower-casing of a copy of `buf`. */
function lowerAscii(buf: Buffer): Buffer {
  const out = Buffer.from(buf);
  for (let i = 0; i < out.length; i++) if (out[i]! >= 0x41 && out[i]! <= 0x5a) out[i] = out[i]! + 0x20;
  return out;
}

/** Overwrites every needle in `buf` with `*` in place; returns how many were found. */
export function maskBuffer(buf: Buffer, needles: Needles): number {
  let found = 0;
  const fill = (hay: Buffer, n: Buffer) => {
    for (let at = hay.indexOf(n); at !== -1; at = hay.indexOf(n, at + n.length)) {
      buf.fill(0x2a, at, at + n.length);
      found++;
    }
  };
  for (const n of needles.exact) fill(buf, n);
  if (needles.folded.length > 0) {
    const lower = lowerAscii(buf);
    for (const n of needles.folded) fill(lower, n);
  }
  return found;
}

/** `text` (a header name, value or reason phrase, read as latin1) with every needle masked. Pure. */
export function maskText(text: string, needles: Needles): string {
  const buf = Buffer.from(text, 'latin1');
  return maskBuffer(buf, needles) > 0 ? buf.toString('latin1') : text;
}

/** Raised by {@link SecretMask} past its byte limit. */
export class TooLarge extends Error {}

/**
 * Streams bytes through {@link maskBuffer}, including needles split across chunks: the last
 * `longest - 1` bytes are held back until more data (or the end) arrives. Fails with
 * {@link TooLarge} past `maxBytes`. `onProgress` is called per chunk (idle timers).
 */
export class SecretMask extends Transform {
  private readonly needles: Needles;
  private readonly keep: number;
  private readonly maxBytes: number;
  private readonly onProgress: () => void;
  private carry: Buffer = Buffer.alloc(0);
  private seen = 0;

  constructor(needles: Needles, maxBytes: number, onProgress: () => void = () => {}) {
    super();
    this.needles = needles;
    this.keep = Math.max(0, needles.longest - 1);
    this.maxBytes = maxBytes;
    this.onProgress = onProgress;
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, cb: TransformCallback): void {
    this.seen += chunk.length;
    this.onProgress();
    if (this.seen > this.maxBytes) {
      cb(new TooLarge('response body over the limit'));
      return;
    }
    const buf = this.carry.length > 0 ? Buffer.concat([this.carry, chunk]) : Buffer.from(chunk);
    maskBuffer(buf, this.needles);
    const emit = Math.max(0, buf.length - this.keep);
    this.carry = Buffer.from(buf.subarray(emit));
    cb(null, emit > 0 ? buf.subarray(0, emit) : undefined);
  }

  override _flush(cb: TransformCallback): void {
    cb(null, this.carry.length > 0 ? this.carry : undefined);
  }
}
