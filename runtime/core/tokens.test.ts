import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { SpaceError } from './errors.ts';
import {
  DISPATCH_TOKEN_TTL_SEC,
  DispatchTokenVerifier,
  loadSigningKey,
  loadVerifyKey,
  mintDispatchToken,
  mintSessionToken,
  verifyDispatchToken,
  verifySessionToken,
  writeNewKeyPair,
} from './tokens.ts';

async function keys(name = 'k') {
  const dir = await mkdtemp(join(tmpdir(), 'space-tokens-'));
  try {
    await writeNewKeyPair(join(dir, `${name}.pem`), join(dir, `${name}.pub.pem`));
    return {
      sign: await loadSigningKey(join(dir, `${name}.pem`)),
      verify: await loadVerifyKey(join(dir, `${name}.pub.pem`)),
    };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

const codeOf = async (p: Promise<unknown>) => {
  try {
    await p;
    return 'ok';
  } catch (e) {
    return e instanceof SpaceError ? e.code : String(e);
  }
};

describe('session and dispatch tokens', () => {
  it('verifies offline and binds sandbox, session, scope and expiry', async () => {
    const k = await keys();
    const { token, expiresAt } = await mintSessionToken(k.sign, {
      team: 'default',
      sandboxId: 'sbx_a',
      sessionId: 'ses_1',
      scopes: ['commands'],
      ttlSec: 60,
    });
    expect(expiresAt).toBeGreaterThan(Date.now() / 1000);
    const claims = await verifySessionToken(k.verify, token, { sandboxId: 'sbx_a', scope: 'commands' });
    expect(claims).toMatchObject({ sandboxId: 'sbx_a', sessionId: 'ses_1', scopes: ['commands'] });
    expect(await codeOf(verifySessionToken(k.verify, token, { sandboxId: 'sbx_b', scope: 'commands' }))).toBe(
      'TOKEN_SCOPE',
    );
    expect(await codeOf(verifySessionToken(k.verify, token, { sandboxId: 'sbx_a', scope: 'files' }))).toBe(
      'TOKEN_SCOPE',
    );
    const old = await mintSessionToken(k.sign, {
      team: 'default',
      sandboxId: 'sbx_a',
      sessionId: 'ses_1',
      scopes: ['commands'],
      ttlSec: -5,
    });
    expect(
      await codeOf(verifySessionToken(k.verify, old.token, { sandboxId: 'sbx_a', scope: 'commands' })),
    ).toBe('TOKEN_EXPIRED');
    const other = await keys('other');
    expect(
      await codeOf(verifySessionToken(other.verify, token, { sandboxId: 'sbx_a', scope: 'commands' })),
    ).toBe('TOKEN_INVALID');
    const tampered = `${token.slice(0, -4)}AAAA`;
    expect(
      await codeOf(verifySessionToken(k.verify, tampered, { sandboxId: 'sbx_a', scope: 'commands' })),
    ).toBe('TOKEN_INVALID');
  });

  it('keeps session tokens and dispatch tokens apart', async () => {
    const k = await keys();
    const dispatch = await mintDispatchToken(k.sign, 'node-1');
    expect(await codeOf(verifyDispatchToken(k.verify, dispatch, 'node-1'))).toBe('ok');
    expect(await codeOf(verifyDispatchToken(k.verify, dispatch, 'node-2'))).toBe('TOKEN_SCOPE');
    expect(
      await codeOf(verifySessionToken(k.verify, dispatch, { sandboxId: 'node-1', scope: 'files' })),
    ).toBe('TOKEN_SCOPE');
    const session = await mintSessionToken(k.sign, {
      team: 'default',
      sandboxId: 'sbx_a',
      sessionId: 's',
      scopes: ['files'],
      ttlSec: 60,
    });
    expect(await codeOf(verifyDispatchToken(k.verify, session.token, 'sbx_a'))).toBe('TOKEN_SCOPE');
  });
});

describe('dispatch token verifier (remembers verified tokens)', () => {
  it('answers as verifyDispatchToken does, and a remembered token still expires', async () => {
    const k = await keys();
    const other = await keys('other');
    const t0 = Date.now();
    const v = new DispatchTokenVerifier(k.verify, 'node-1');
    const good = await mintDispatchToken(k.sign, 'node-1', t0);
    expect(await codeOf(v.verify(good, t0))).toBe('ok');
    expect(await codeOf(v.verify(good, t0 + 1000))).toBe('ok'); // remembered
    // what is refused stays refused, however often it is tried
    const forged = await mintDispatchToken(other.sign, 'node-1', t0);
    const elsewhere = await mintDispatchToken(k.sign, 'node-2', t0);
    for (let i = 0; i < 2; i++) {
      expect(await codeOf(v.verify(forged, t0))).toBe('TOKEN_INVALID');
      expect(await codeOf(v.verify(elsewhere, t0))).toBe('TOKEN_SCOPE');
      expect(await codeOf(v.verify(`${good.slice(0, -4)}AAAA`, t0))).toBe('TOKEN_INVALID');
    }
    // past its exp (whole seconds from its iat) the remembered token is refused
    const expMs = (Math.floor(t0 / 1000) + DISPATCH_TOKEN_TTL_SEC) * 1000;
    expect(await codeOf(v.verify(good, expMs - 1))).toBe('ok');
    expect(await codeOf(v.verify(good, expMs))).toBe('TOKEN_EXPIRED');
    expect(await codeOf(v.verify(good, expMs + 5000))).toBe('TOKEN_EXPIRED');
  });

  it('holds a bounded number of tokens and keeps verifying once it forgot them', async () => {
    const k = await keys();
    const v = new DispatchTokenVerifier(k.verify, 'node-1', 4);
    const t0 = Date.now();
    // tokens minted a second apart differ (iat); 7 of them overflow a verifier holding 4
    const tokens = await Promise.all(
      Array.from({ length: 7 }, (_, i) => mintDispatchToken(k.sign, 'node-1', t0 - i * 1000)),
    );
    expect(new Set(tokens).size).toBe(7);
    for (const t of tokens) expect(await codeOf(v.verify(t, t0))).toBe('ok');
    for (const t of tokens) expect(await codeOf(v.verify(t, t0))).toBe('ok');
  });
});
