/**
 * The clear-text part of a spliced TLS handshake, watched both ways (E13). The TLS proxy decides on
 * the first ClientHello's SNI, but a TLS 1.3 server that answers HelloRetryRequest reads a second
 * ClientHello (RFC 8446 §4.1.2), still in the clear, and may pick its virtual host from that one.
 * So until the server's real ServerHello has passed, every handshake message the client sends must
 * be a ClientHello naming the same server (the RFC requires the second hello to repeat the first
 * apart from listed changes, server_name is not one of them), at most two of them; the server may
 * answer HelloRetryRequest once. Anything else, or records that do not parse, ends the connection.
 * After the real ServerHello the client's handshake is encrypted (TLS 1.3) or holds no hello (TLS
 * 1.2), and the watch stops: from then on bytes are only copied.
 */
import { normaliseName } from '../core/egress.ts';
import { sniOfHelloBody } from './client-hello.ts';

/** Why the watch ends a connection: a hello naming another server, or a handshake it cannot read. */
export type WatchProblem = 'sni-changed' | 'malformed-handshake';

/** TLS record content types (RFC 8446 §5.1). */
const CHANGE_CIPHER_SPEC = 20;
const ALERT = 21;
const HANDSHAKE = 22;
const APPLICATION_DATA = 23;
/** Handshake message types (RFC 8446 §4). */
const CLIENT_HELLO = 1;
const SERVER_HELLO = 2;
/** Largest record payload: TLSCiphertext may add 2048 bytes to 2^14 (RFC 5246 §6.2.3). */
const MAX_RECORD = 16_384 + 2048;
/** The ServerHello.random of a HelloRetryRequest: SHA-256 of "HelloRetryRequest" (RFC 8446 §4.1.3). */
const HRR_RANDOM = Buffer.from('cf21ad74e59a6111be1d8c021e65b891c2a211167abb8c5e079e09e2c8a8339c', 'hex');

/** Splits a byte stream into TLS records; `onRecord` returns a problem to stop. */
class Records {
  private buf: Buffer = Buffer.alloc(0);

  /** Parses what `chunk` completes; stops early when `over()` turns true (bytes after that are not read). */
  push(
    chunk: Buffer,
    onRecord: (type: number, payload: Buffer) => WatchProblem | null,
    over: () => boolean,
  ): WatchProblem | null {
    this.buf = this.buf.length > 0 ? Buffer.concat([this.buf, chunk]) : chunk;
    while (this.buf.length >= 5 && !over()) {
      const len = this.buf.readUInt16BE(3);
      if (this.buf[1] !== 3 || len > MAX_RECORD) return 'malformed-handshake';
      if (this.buf.length < 5 + len) break;
      const problem = onRecord(this.buf[0]!, this.buf.subarray(5, 5 + len));
      this.buf = this.buf.subarray(5 + len);
      if (problem) return problem;
    }
    return null;
  }
}

/**
 * Watches one spliced connection whose first ClientHello (already read and allowed) named `sni`
 * (canonical). Feed it every client byte after that hello and every server byte, in order and
 * before they are forwarded; a non-null answer means: close the connection, forward nothing more.
 * Memory is bounded by one record plus one hello (`maxHelloBytes`).
 */
export class HandshakeWatch {
  private readonly sni: string;
  private readonly maxHelloBytes: number;
  private readonly client = new Records();
  private readonly server = new Records();
  private clientHandshake: Buffer = Buffer.alloc(0);
  private serverHandshake: Buffer = Buffer.alloc(0);
  private hellos = 1;
  private retries = 0;
  private failed: WatchProblem | null = null;
  /** True once the server's real ServerHello has passed: nothing more to check. */
  done = false;

  constructor(sni: string, maxHelloBytes: number) {
    this.sni = sni;
    this.maxHelloBytes = maxHelloBytes;
  }

  /** Client → server bytes. */
  fromClient(chunk: Buffer): WatchProblem | null {
    if (this.failed || this.done) return this.failed;
    return this.fail(
      this.client.push(
        chunk,
        (type, payload) => this.clientRecord(type, payload),
        () => this.done,
      ),
    );
  }

  /** Server → client bytes. */
  fromServer(chunk: Buffer): WatchProblem | null {
    if (this.failed || this.done) return this.failed;
    return this.fail(
      this.server.push(
        chunk,
        (type, payload) => this.serverRecord(type, payload),
        () => this.done,
      ),
    );
  }

  private fail(problem: WatchProblem | null): WatchProblem | null {
    if (problem) this.failed = problem;
    return problem;
  }

  private clientRecord(type: number, payload: Buffer): WatchProblem | null {
    if (this.done) return null;
    // change_cipher_spec (middlebox compatibility), alerts and 0-RTT data carry no hello
    if (type === CHANGE_CIPHER_SPEC || type === ALERT || type === APPLICATION_DATA) return null;
    if (type !== HANDSHAKE) return 'malformed-handshake';
    this.clientHandshake = Buffer.concat([this.clientHandshake, payload]);
    while (this.clientHandshake.length >= 4) {
      if (this.clientHandshake[0] !== CLIENT_HELLO) return 'malformed-handshake';
      const len = this.clientHandshake.readUIntBE(1, 3);
      if (4 + len > this.maxHelloBytes) return 'malformed-handshake';
      if (this.clientHandshake.length < 4 + len) break;
      const sni = sniOfHelloBody(this.clientHandshake.subarray(4, 4 + len));
      this.clientHandshake = this.clientHandshake.subarray(4 + len);
      if (sni === 'malformed') return 'malformed-handshake';
      if (sni === null || normaliseName(sni) !== this.sni) return 'sni-changed';
      if (++this.hellos > 2) return 'malformed-handshake';
    }
    if (this.clientHandshake.length > this.maxHelloBytes) return 'malformed-handshake';
    return null;
  }

  private serverRecord(type: number, payload: Buffer): WatchProblem | null {
    if (this.done) return null;
    if (type === CHANGE_CIPHER_SPEC || type === ALERT) return null;
    if (type !== HANDSHAKE) return 'malformed-handshake';
    this.serverHandshake = Buffer.concat([this.serverHandshake, payload]);
    while (this.serverHandshake.length >= 4) {
      if (this.serverHandshake[0] !== SERVER_HELLO) return 'malformed-handshake';
      const len = this.serverHandshake.readUIntBE(1, 3);
      if (len < 34) return 'malformed-handshake';
      // legacy_version (2 bytes), then the 32-byte random
      if (this.serverHandshake.length < 4 + 34) break;
      const retry = this.serverHandshake.subarray(6, 38).equals(HRR_RANDOM);
      if (!retry) {
        this.done = true; // the real ServerHello: the client's hellos are over
        this.serverHandshake = Buffer.alloc(0);
        this.clientHandshake = Buffer.alloc(0);
        return null;
      }
      if (++this.retries > 1 || len > this.maxHelloBytes) return 'malformed-handshake';
      if (this.serverHandshake.length < 4 + len) break;
      this.serverHandshake = this.serverHandshake.subarray(4 + len);
    }
    return null;
  }
}
