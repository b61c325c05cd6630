import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { SpaceError } from './errors.ts';
import {
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
