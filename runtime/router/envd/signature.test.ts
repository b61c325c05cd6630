import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { checkEnvdSignature, envdSignature } from './signature.ts';

const token = 'tok.en.value';
const now = 1_800_000_000;

describe('envd signed URLs', () => {
  it('signs path:operation:user:token[:expiration] as v1_ + unpadded base64 SHA-256', () => {
    // the string an SDK hashes for downloadUrl('/home/user/a.txt') with no user and no expiration
    const digest = createHash('sha256').update(`/home/user/a.txt:read::${token}`).digest('base64');
    expect(digest.endsWith('=')).toBe(true); // 32 bytes always pad: the prefix form drops it
    expect(envdSignature({ path: '/home/user/a.txt', operation: 'read', user: '', token })).toBe(
      `v1_${digest.slice(0, -1)}`,
    );
    const withExp = createHash('sha256').update(`a.txt:write:root:${token}:${now}`).digest('base64');
    expect(envdSignature({ path: 'a.txt', operation: 'write', user: 'root', token, expiration: now })).toBe(
      `v1_${withExp.replace(/=+$/, '')}`,
    );
  });

  it('accepts a good signature, with or without an expiration in the future', () => {
    const base = { path: 'a.txt', operation: 'read', user: '' } as const;
    expect(
      checkEnvdSignature({ ...base, signature: envdSignature({ ...base, token }) }, token, now),
    ).toBeNull();
    const sig = envdSignature({ ...base, token, expiration: now + 60 });
    expect(
      checkEnvdSignature({ ...base, signature: sig, expiration: String(now + 60) }, token, now),
    ).toBeNull();
  });

  it('refuses another path, operation, user or token, a tampered signature and a moved expiration', () => {
    const base = { path: 'a.txt', operation: 'read', user: '' } as const;
    const signature = envdSignature({ ...base, token });
    expect(checkEnvdSignature({ ...base, path: 'b.txt', signature }, token, now)).toBe('invalid signature');
    expect(checkEnvdSignature({ ...base, operation: 'write', signature }, token, now)).toBe(
      'invalid signature',
    );
    expect(checkEnvdSignature({ ...base, user: 'root', signature }, token, now)).toBe('invalid signature');
    expect(checkEnvdSignature({ ...base, signature }, 'other', now)).toBe('invalid signature');
    const flipped = `${signature.slice(0, -1)}${signature.endsWith('A') ? 'B' : 'A'}`;
    expect(checkEnvdSignature({ ...base, signature: flipped }, token, now)).toBe('invalid signature');
    expect(checkEnvdSignature({ ...base, signature: '' }, token, now)).toBe('invalid signature');
    // an expiration added to (or moved on) a signature is not covered by it
    const exp = envdSignature({ ...base, token, expiration: now + 10 });
    expect(checkEnvdSignature({ ...base, signature: exp, expiration: String(now + 99) }, token, now)).toBe(
      'invalid signature',
    );
    expect(checkEnvdSignature({ ...base, signature: exp, expiration: '1e10' }, token, now)).toBe(
      'invalid signature',
    );
  });

  it('refuses an expired URL as expired, before looking at the signature', () => {
    const base = { path: 'a.txt', operation: 'read', user: '' } as const;
    const sig = envdSignature({ ...base, token, expiration: now - 1 });
    expect(checkEnvdSignature({ ...base, signature: sig, expiration: String(now - 1) }, token, now)).toBe(
      'signature is already expired',
    );
    expect(checkEnvdSignature({ ...base, signature: 'v1_x', expiration: String(now - 1) }, token, now)).toBe(
      'signature is already expired',
    );
  });
});
