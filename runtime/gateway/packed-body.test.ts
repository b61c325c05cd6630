import { gunzipSync, gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { maskPackedBody, PackedBodyError } from './packed-body.ts';
import { needlesFor } from './reflection.ts';
import { gzipNamed } from './test-gzip.ts';

const VALUE = 'sk-live-0123456789abcdef0123';
const needles = needlesFor([VALUE]);
const MASKED = '*'.repeat(VALUE.length);
const MiB = 1024 * 1024;

/** Every text the body holds once unpacked, as a client could read it: the raw bytes and each member at any offset. */
function readable(body: Buffer, depth = 0): string {
  let out = body.toString('latin1');
  if (depth > 3) return out;
  for (let at = body.indexOf(0x1f); at >= 0; at = body.indexOf(0x1f, at + 1)) {
    try {
      out += readable(gunzipSync(body.subarray(at)), depth + 1);
    } catch {}
  }
  return out;
}

function problem(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    if (err instanceof PackedBodyError) return err.problem;
    throw err;
  }
  return 'none';
}

describe('maskPackedBody (E16: the whole body is understood, or refused)', () => {
  it.each([
    ['a member, then NUL and the value', Buffer.concat([gzipSync('x'), Buffer.from(`\0Bearer ${VALUE}`)])],
    ['a member, then the value directly', Buffer.concat([gzipSync('x'), Buffer.from(`v=${VALUE}`)])],
    [
      'a member, then NUL and the value in base64',
      Buffer.concat([gzipSync('x'), Buffer.from(`\0${Buffer.from(VALUE).toString('base64')}`)]),
    ],
    ['the value in a member header (FNAME)', gzipNamed(VALUE, 'plain text')],
    ['the value inside gzip inside gzip', gzipSync(gzipSync(`echo ${VALUE}`))],
    ['two members, the second holding the value', Buffer.concat([gzipSync('x'), gzipSync(VALUE)])],
    ['the value in the member and after it', Buffer.concat([gzipSync(VALUE), Buffer.from(VALUE)])],
  ])('%s: masked in every reading', (_what, body) => {
    const out = maskPackedBody(body, needles, MiB);
    const text = readable(out).toLowerCase();
    expect(text).not.toContain(VALUE.toLowerCase());
    expect(text).not.toContain(Buffer.from(VALUE).toString('base64').slice(0, 20).toLowerCase());
  });

  it('a body without the value is sent as it came (same buffer)', () => {
    const body = Buffer.concat([gzipSync('hello'), Buffer.from('\0trailer')]);
    expect(maskPackedBody(body, needles, MiB)).toBe(body);
  });

  it('a member holding the value is packed again with the value masked', () => {
    const out = maskPackedBody(gzipSync(`echo ${VALUE} end`), needles, MiB);
    expect(gunzipSync(out).toString()).toBe(`echo ${MASKED} end`);
  });

  it.each([
    ['a member hidden behind a NUL', Buffer.concat([gzipSync('x'), Buffer.from([0]), gzipSync(VALUE)])],
    ['a truncated member', gzipSync(`x ${VALUE}`).subarray(0, 15)],
    [
      'a CRC that does not match',
      Buffer.from(gzipSync('abc').map((b, i, a) => (i === a.length - 6 ? b ^ 1 : b))),
    ],
    ['reserved header flags', Buffer.from(gzipSync('abc').map((b, i) => (i === 3 ? 0x80 : b)))],
    ['gzip nested four deep', gzipSync(gzipSync(gzipSync(gzipSync('x'))))],
  ])('refuses %s (undecodable)', (_what, body) => {
    expect(problem(() => maskPackedBody(body, needles, MiB))).toBe('undecodable');
  });

  it('bounds the unpacked size over all members and layers (too-large)', () => {
    expect(problem(() => maskPackedBody(gzipSync(Buffer.alloc(2 * MiB)), needles, MiB))).toBe('too-large');
    const halves = Buffer.concat([
      gzipSync(Buffer.alloc(Math.floor(0.6 * MiB))),
      gzipSync(Buffer.alloc(Math.floor(0.6 * MiB))),
    ]);
    expect(problem(() => maskPackedBody(halves, needles, MiB))).toBe('too-large');
    expect(problem(() => maskPackedBody(gzipSync(gzipSync(Buffer.alloc(2 * MiB))), needles, MiB))).toBe(
      'too-large',
    );
  });
});
