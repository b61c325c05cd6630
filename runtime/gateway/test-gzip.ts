/**
 * Test-only gzip bodies for the packed-body cases (E16): `packed-body.test.ts` and the attack
 * suite's far side (`test/attack-world.ts`). Not shipped in the image (`test-*.ts`).
 */
import { crc32, deflateRawSync } from 'node:zlib';

/**
 * One gzip member of `text` whose header carries the FNAME field `name` (RFC 1952 §2.3.1: FLG bit
 * 3, a NUL-terminated name after the fixed 10-byte header), built by hand since zlib writes no
 * FNAME. Trailer: CRC-32 and size of `text` (mod 2^32), little-endian.
 */
export function gzipNamed(name: string, text: string): Buffer {
  const data = Buffer.from(text);
  const trailer = Buffer.alloc(8);
  trailer.writeUInt32LE(crc32(data), 0);
  trailer.writeUInt32LE(data.length, 4);
  return Buffer.concat([
    Buffer.from([0x1f, 0x8b, 0x08, 0x08, 0, 0, 0, 0, 0, 0xff]),
    Buffer.from(`${name}\0`),
    deflateRawSync(data),
    trailer,
  ]);
}
