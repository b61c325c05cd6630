/**
 * A strict TLS ClientHello reader: enough of RFC 8446 §4.1.2 / RFC 6066 §3 to take the SNI from the
 * first flight (which may span several handshake records) without trusting any length field. Pure;
 * malformed input of any shape yields an error result, never an exception.
 */

/** TLS record type of handshake messages. */
const RECORD_HANDSHAKE = 0x16;
/** Handshake message type of ClientHello. */
const HANDSHAKE_CLIENT_HELLO = 0x01;
/** Largest TLS plaintext record payload, bytes. */
const MAX_RECORD = 16_384;
/** Extension type server_name. */
const EXT_SERVER_NAME = 0;

/** Result of {@link parseClientHello}. */
export type HelloResult =
  /** More bytes are needed; `need` is the smallest total length worth parsing again. */
  | { status: 'incomplete'; need: number }
  | { status: 'error'; reason: 'not-tls' | 'malformed-hello' | 'hello-too-large' }
  /** `sni` is the raw host_name (printable ASCII) or null when absent; `length` the bytes the hello used. */
  | { status: 'ok'; sni: string | null; length: number };

class Malformed extends Error {}

/** A bounds-checked reader over one buffer. */
class Cursor {
  pos = 0;
  readonly buf: Buffer;
  constructor(buf: Buffer) {
    this.buf = buf;
  }
  need(n: number): void {
    if (this.pos + n > this.buf.length) throw new Malformed();
  }
  u8(): number {
    this.need(1);
    return this.buf[this.pos++]!;
  }
  u16(): number {
    this.need(2);
    const v = this.buf.readUInt16BE(this.pos);
    this.pos += 2;
    return v;
  }
  bytes(n: number): Buffer {
    this.need(n);
    const b = this.buf.subarray(this.pos, this.pos + n);
    this.pos += n;
    return b;
  }
  get left(): number {
    return this.buf.length - this.pos;
  }
}

/**
 * Parses the start of a TLS connection. `buf` holds every byte received so far; `maxBytes` caps the
 * whole hello (records included): a hello that claims more is `hello-too-large` as soon as the
 * claim is seen. Extra bytes after the hello are allowed (they are replayed, not parsed).
 */
export function parseClientHello(buf: Buffer, maxBytes: number): HelloResult {
  if (buf.length === 0) return { status: 'incomplete', need: 1 };
  if (buf[0] !== RECORD_HANDSHAKE) return { status: 'error', reason: 'not-tls' };
  if (buf.length >= 2 && buf[1] !== 3) return { status: 'error', reason: 'not-tls' };
  const payloads: Buffer[] = [];
  let collected = 0;
  let offset = 0;
  let messageLength = -1;
  for (;;) {
    if (buf.length < offset + 5) return { status: 'incomplete', need: offset + 5 };
    if (buf[offset] !== RECORD_HANDSHAKE || buf[offset + 1] !== 3 || buf[offset + 2]! > 4) {
      return {
        status: 'error',
        reason: offset === 0 && buf[offset + 1] !== 3 ? 'not-tls' : 'malformed-hello',
      };
    }
    const len = buf.readUInt16BE(offset + 3);
    if (len === 0 || len > MAX_RECORD) return { status: 'error', reason: 'malformed-hello' };
    if (offset + 5 + len > maxBytes) return { status: 'error', reason: 'hello-too-large' };
    if (buf.length < offset + 5 + len) return { status: 'incomplete', need: offset + 5 + len };
    payloads.push(buf.subarray(offset + 5, offset + 5 + len));
    collected += len;
    offset += 5 + len;
    if (messageLength < 0 && collected >= 4) {
      const head = Buffer.concat(payloads);
      if (head[0] !== HANDSHAKE_CLIENT_HELLO) return { status: 'error', reason: 'malformed-hello' };
      messageLength = head.readUIntBE(1, 3);
      if (messageLength < 38) return { status: 'error', reason: 'malformed-hello' };
      // records add 5 bytes per 16 KiB at most: the message alone must fit the cap
      if (4 + messageLength > maxBytes) return { status: 'error', reason: 'hello-too-large' };
    }
    if (messageLength >= 0 && collected >= 4 + messageLength) {
      // a ClientHello is alone in its flight: no other handshake message may share its records
      if (collected !== 4 + messageLength) return { status: 'error', reason: 'malformed-hello' };
      const body = Buffer.concat(payloads).subarray(4);
      try {
        return { status: 'ok', sni: readSni(new Cursor(body)), length: offset };
      } catch {
        return { status: 'error', reason: 'malformed-hello' };
      }
    }
  }
}

/**
 * The SNI of one ClientHello message body (the handshake message without its 4-byte header), as
 * {@link parseClientHello} reads it: the raw host_name, null when absent, or `malformed`. Pure.
 */
export function sniOfHelloBody(body: Buffer): string | null | 'malformed' {
  try {
    return readSni(new Cursor(body));
  } catch {
    return 'malformed';
  }
}

/** Walks a ClientHello body; returns the SNI host_name or null. Throws Malformed. */
function readSni(c: Cursor): string | null {
  if (c.u8() !== 3) throw new Malformed(); // legacy_version major
  c.u8();
  c.bytes(32); // random
  const sid = c.u8();
  if (sid > 32) throw new Malformed();
  c.bytes(sid);
  const suites = c.u16();
  if (suites < 2 || suites % 2 !== 0) throw new Malformed();
  c.bytes(suites);
  const compression = c.u8();
  if (compression < 1) throw new Malformed();
  c.bytes(compression);
  if (c.left === 0) return null; // no extensions at all (old clients): no SNI
  const extLen = c.u16();
  if (extLen !== c.left) throw new Malformed();
  const seen = new Set<number>();
  let sni: string | null = null;
  while (c.left > 0) {
    const type = c.u16();
    const len = c.u16();
    const data = c.bytes(len);
    if (seen.has(type)) throw new Malformed();
    seen.add(type);
    if (type === EXT_SERVER_NAME) sni = readServerName(new Cursor(data));
  }
  return sni;
}

/** Reads a server_name extension body: exactly one host_name of printable ASCII. Throws Malformed. */
function readServerName(c: Cursor): string {
  const listLen = c.u16();
  if (listLen !== c.left || listLen === 0) throw new Malformed();
  let host: string | null = null;
  while (c.left > 0) {
    const type = c.u8();
    const len = c.u16();
    const name = c.bytes(len);
    if (type !== 0) continue; // unknown name types are skipped (RFC 6066)
    if (host !== null || len === 0 || len > 255) throw new Malformed();
    for (const b of name) if (b < 0x21 || b > 0x7e) throw new Malformed();
    host = name.toString('latin1');
  }
  if (host === null) throw new Malformed();
  return host;
}
