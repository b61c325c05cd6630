/** The dispatch token reuse of the API's agent client: reused per node within its margin, fresh after. */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { decodeJwt } from 'jose';
import { describe, expect, it } from 'vitest';
import {
  DISPATCH_TOKEN_TTL_SEC,
  loadSigningKey,
  loadVerifyKey,
  verifyDispatchToken,
  writeNewKeyPair,
} from '../core/tokens.ts';
import { AgentClient, DISPATCH_TOKEN_REUSE_MARGIN_MS } from './agent-client.ts';

async function keyPair() {
  const dir = await mkdtemp(join(tmpdir(), 'space-agent-client-'));
  try {
    await writeNewKeyPair(join(dir, 'k.pem'), join(dir, 'k.pub.pem'));
    return {
      sign: await loadSigningKey(join(dir, 'k.pem')),
      verify: await loadVerifyKey(join(dir, 'k.pub.pem')),
    };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

describe('dispatch token reuse', () => {
  it('one token per node while more than the margin is left; each verifies for its own node only', async () => {
    const k = await keyPair();
    const client = new AgentClient(k.sign, 1000);
    const now = Date.now();
    const a1 = await client.dispatchToken('node-a', now);
    const a2 = await client.dispatchToken('node-a', now + 1000);
    const b = await client.dispatchToken('node-b', now);
    expect(a2).toBe(a1);
    expect(b).not.toBe(a1);
    await verifyDispatchToken(k.verify, a1, 'node-a');
    await verifyDispatchToken(k.verify, b, 'node-b');
    await expect(verifyDispatchToken(k.verify, a1, 'node-b')).rejects.toThrow();
    // the margin is honest: the reused token's real exp leaves at least the margin
    const exp = decodeJwt(a1).exp! * 1000;
    expect(exp - (now + 1000)).toBeGreaterThanOrEqual(DISPATCH_TOKEN_REUSE_MARGIN_MS);
  });

  it('a token with the margin or less to live is replaced', async () => {
    const k = await keyPair();
    const client = new AgentClient(k.sign, 1000);
    const now = Date.now();
    const first = await client.dispatchToken('node-a', now);
    const later = now + DISPATCH_TOKEN_TTL_SEC * 1000 - DISPATCH_TOKEN_REUSE_MARGIN_MS + 1000;
    const second = await client.dispatchToken('node-a', later);
    expect(second).not.toBe(first);
  });
});
