/** The streaming mask of real values in response bodies (reflection.ts), cut at every position. */
import { describe, expect, it } from 'vitest';
import { needlesFor, SecretMask } from './reflection.ts';

const REAL = 'sk-REAL-7f3a9c1e5b2d4f60';

describe('SecretMask', () => {
  it('masks a secret split across chunks at every position, keeping the length', async () => {
    const text = `before ${REAL} middle ${REAL}${REAL} after`;
    for (let cut = 1; cut < text.length; cut++) {
      const m = new SecretMask(needlesFor([REAL, 'unused-secret']), 10_000);
      const out: Buffer[] = [];
      m.on('data', (d: Buffer) => out.push(d));
      const ended = new Promise((r) => m.on('end', r));
      m.write(Buffer.from(text.slice(0, cut)));
      m.end(Buffer.from(text.slice(cut)));
      await ended;
      const result = Buffer.concat(out).toString();
      expect(result).toHaveLength(text.length);
      expect(result).not.toContain(REAL);
      expect(result.startsWith('before ')).toBe(true);
    }
  });
});
