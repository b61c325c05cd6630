/**
 * Masking of a response body that starts like gzip (E10, E16). Pure and synchronous: the gateway
 * runs it in a worker thread under a time limit (`unpack-pool.ts`, E17), never on its event loop.
 *
 * The whole body is understood or refused: it is read as a run of gzip members (RFC 1952 §2.3;
 * each header parsed here, the deflate data inflated with a cap on the total unpacked size, the
 * CRC-32 and ISIZE of every member checked), then whatever follows them. Real values are masked
 * in the raw bytes of the whole body (header fields, trailing data, anything between), in the
 * unpacked text of every member, and again inside a member's text that is itself gzip (to a small
 * depth). Bytes after the members that hold a gzip magic again (a member hidden behind something
 * that is not one) cannot be understood: the body is refused.
 */
import { crc32, gzipSync, inflateRawSync } from 'node:zlib';
import { maskBuffer, type Needles } from './reflection.ts';

/** Why a packed body could not be masked (the caller refuses the response). */
export type PackedBodyProblem = 'too-large' | 'undecodable';

/** Thrown by {@link maskPackedBody}. */
export class PackedBodyError extends Error {
  readonly problem: PackedBodyProblem;
  constructor(problem: PackedBodyProblem, message: string) {
    super(message);
    this.name = 'PackedBodyError';
    this.problem = problem;
  }
}

/** gzip magic and method deflate (RFC 1952 §2.3.1: ID1 ID2 CM). */
const GZIP_MAGIC = Buffer.from([0x1f, 0x8b, 0x08]);
/** How many gzip layers inside one another are unpacked; a deeper one is refused. */
const MAX_DEPTH = 3;

/** True when `buf` starts (at `at`) like a gzip member: magic 1f 8b, method 8. */
export function looksGzipped(buf: Buffer, at = 0): boolean {
  return buf.length >= at + 3 && buf[at] === 0x1f && buf[at + 1] === 0x8b && buf[at + 2] === 0x08;
}

/** Unpacked-size budget shared by every member and layer of one body. */
interface Budget {
  left: number;
}

/** Offset just past the header of the member starting at `at`; throws when it is malformed. */
function memberHeaderEnd(buf: Buffer, at: number): number {
  const fail = () => {
    throw new PackedBodyError('undecodable', 'malformed gzip header');
  };
  if (!looksGzipped(buf, at) || buf.length < at + 10) fail();
  const flags = buf[at + 3]!;
  if (flags & 0xe0) fail(); // reserved bits must be zero (§2.3.1.2)
  let p = at + 10;
  if (flags & 0x04) {
    // FEXTRA: XLEN then XLEN bytes
    if (buf.length < p + 2) fail();
    p += 2 + buf.readUInt16LE(p);
  }
  for (const bit of [0x08, 0x10]) {
    // FNAME, FCOMMENT: zero-terminated
    if (!(flags & bit)) continue;
    const end = buf.indexOf(0, p);
    if (end < 0) fail();
    p = end + 1;
  }
  if (flags & 0x02) p += 2; // FHCRC
  if (p > buf.length) fail();
  return p;
}

/** Inflates the member at `at`; returns its text and the offset past its trailer. Throws PackedBodyError. */
function inflateMember(buf: Buffer, at: number, budget: Budget): { plain: Buffer; end: number } {
  const start = memberHeaderEnd(buf, at);
  let result: { buffer: Buffer; engine: { bytesWritten: number } };
  try {
    result = inflateRawSync(buf.subarray(start), {
      maxOutputLength: Math.max(1, budget.left),
      info: true,
    }) as unknown as { buffer: Buffer; engine: { bytesWritten: number } };
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ERR_BUFFER_TOO_LARGE')
      throw new PackedBodyError('too-large', 'unpacked body over the limit');
    throw new PackedBodyError('undecodable', 'deflate data does not inflate');
  }
  const plain = result.buffer;
  budget.left -= plain.length;
  if (budget.left < 0) throw new PackedBodyError('too-large', 'unpacked body over the limit');
  const trailer = start + result.engine.bytesWritten;
  if (buf.length < trailer + 8) throw new PackedBodyError('undecodable', 'gzip trailer missing');
  // §2.3.1: CRC-32 of the text, then its length mod 2^32, both little-endian
  if (buf.readUInt32LE(trailer) !== crc32(plain) || buf.readUInt32LE(trailer + 4) !== plain.length % 2 ** 32)
    throw new PackedBodyError('undecodable', 'gzip trailer does not match');
  return { plain, end: trailer + 8 };
}

/** Masks one gzip-led body at `depth`; returns the body to send (the same buffer when nothing changed). */
function maskLayer(body: Buffer, needles: Needles, budget: Budget, depth: number): Buffer {
  if (depth > MAX_DEPTH) throw new PackedBodyError('undecodable', 'gzip nested too deep');
  const members: Buffer[] = [];
  let at = 0;
  while (looksGzipped(body, at)) {
    const { plain, end } = inflateMember(body, at, budget);
    members.push(plain);
    at = end;
  }
  const rest = body.subarray(at);
  if (rest.indexOf(GZIP_MAGIC) >= 0)
    throw new PackedBodyError('undecodable', 'gzip data after bytes that are not a member');
  // raw bytes first: header fields, trailing data and anything else the text does not cover (E16)
  const raw = Buffer.from(body);
  const rawFound = maskBuffer(raw, needles);
  let textFound = 0;
  const texts = members.map((plain) => {
    let text = plain;
    if (looksGzipped(text)) {
      const inner = maskLayer(text, needles, budget, depth + 1);
      if (inner !== text) textFound++;
      text = inner;
    }
    textFound += maskBuffer(text, needles);
    return text;
  });
  if (textFound > 0) return Buffer.concat([gzipSync(Buffer.concat(texts)), raw.subarray(at)]);
  return rawFound > 0 ? raw : body;
}

/**
 * Masks every needle in `body`, a response body that starts with a gzip magic (sent without a
 * Content-Encoding label): in its raw bytes, in the unpacked text of each of its members, and in
 * gzip text inside them up to 3 layers. When a member's text held a value, the members are packed
 * again as one (the trailing raw bytes, masked, follow). Returns `body` itself when nothing was
 * found. `maxUnpackedBytes` bounds the unpacked text of all members and layers together.
 * @throws PackedBodyError `too-large` past `maxUnpackedBytes`; `undecodable` for a malformed member
 *   (header, deflate data, CRC-32/ISIZE trailer), gzip nested deeper than 3, or a gzip magic after
 *   the last member (a member that is not read as one).
 */
export function maskPackedBody(body: Buffer, needles: Needles, maxUnpackedBytes: number): Buffer {
  return maskLayer(body, needles, { left: maxUnpackedBytes }, 1);
}
