/**
 * The deployment's VM configuration and the deployment-provisioned key, against a real Redis and a
 * started API: Pulumi holds a key as a secret and hands the API only its SHA-256
 * (`SPACE_BOOTSTRAP_API_KEY_SHA256`), then writes `PUT /v1/deployment/vm-config` with it; VMs read
 * the hash `space:deploy:vm-config` (one env file per service) from Redis.
 */
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { ConfigError } from '../core/config.ts';
import { DEPLOY_VM_CONFIG_KEY } from '../core/redis-keys.ts';
import { writeNewKeyPair } from '../core/tokens.ts';
import { ApiKeyStore, importBootstrapKey } from './api-keys.ts';
import { loadApiConfig } from './config.ts';
import { type RunningApi, startApi } from './service.ts';

const DB = 11;
const url = `${inject('redisUrl')}/${DB}`;
const redis = new Redis(url);
const dir = mkdtempSync(join(tmpdir(), 'space-vm-config-'));
const KEY = 'space_deploymentkey0123456789abcdefghijklmnop';
const sha = (s: string) => createHash('sha256').update(s).digest('hex');
let api: RunningApi;

async function call(method: string, path: string, key: string, body?: unknown) {
  const res = await fetch(`${api.url}${path}`, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(body ? { 'content-type': 'application/json' } : {}) },
    ...(body ? { body: JSON.stringify(body) } : {}),
  });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

beforeAll(async () => {
  await redis.flushdb();
  await writeNewKeyPair(join(dir, 'signing.pem'), join(dir, 'verify.pem'));
  api = await startApi(
    loadApiConfig({
      SPACE_API_PORT: '0',
      SPACE_REDIS_URL: url,
      SPACE_SIGNING_KEY_FILE: join(dir, 'signing.pem'),
      SPACE_BOOTSTRAP_API_KEY_SHA256: sha(KEY),
      SPACE_LOG_LEVEL: 'silent',
    }),
  );
});
afterAll(async () => {
  await api?.close();
  redis.disconnect();
  rmSync(dir, { recursive: true, force: true });
});

describe('deployment-provisioned API key (SPACE_BOOTSTRAP_API_KEY_SHA256)', () => {
  it('a malformed hash is refused at start', () => {
    expect(() =>
      loadApiConfig({ SPACE_SIGNING_KEY_FILE: 'k', SPACE_BOOTSTRAP_API_KEY_SHA256: 'not-a-hash' }),
    ).toThrow(ConfigError);
  });

  it('the key whose hash the API was given works, with every scope', async () => {
    const me = await call('GET', '/v1/deployment/vm-config', KEY);
    expect(me.status).toBe(200);
    expect(await redis.hget(`space:v1:apikey:${sha(KEY)}`, 'scopes')).toContain('deployment:admin');
  });

  it('is imported once: a revoked key stays revoked at the next start', async () => {
    expect(await importBootstrapKey(redis, sha(KEY))).toBe(false);
    const other = 'space_anotherkey0123456789abcdefghijklmnopqr';
    expect(await importBootstrapKey(redis, sha(other))).toBe(true);
    const id = await redis.hget(`space:v1:apikey:${sha(other)}`, 'id');
    await new ApiKeyStore(redis).revoke('default', id!);
    expect(await importBootstrapKey(redis, sha(other))).toBe(false);
    expect((await call('GET', '/v1/deployment/vm-config', other)).status).toBe(401);
  });
});

describe('PUT/GET /v1/deployment/vm-config', () => {
  const services = {
    // names out of order: the stored document sorts them
    'space-api': { SPACE_ROUTER_URL: 'https://router.example.com:8082', SPACE_LOG_LEVEL: 'debug' },
    'space-agent@default': { SPACE_DRIVER: 'gvisor', SPACE_WARM_POOL_SIZE: '4' },
  };

  it('stores one JSON document per service (names sorted) in the hash the VMs read, and reads it back', async () => {
    const put = await call('PUT', '/v1/deployment/vm-config', KEY, { services });
    expect(put).toEqual({ status: 200, body: { services } });
    expect(await redis.hgetall(DEPLOY_VM_CONFIG_KEY)).toEqual({
      'space-api': '{"SPACE_LOG_LEVEL":"debug","SPACE_ROUTER_URL":"https://router.example.com:8082"}',
      'space-agent@default': '{"SPACE_DRIVER":"gvisor","SPACE_WARM_POOL_SIZE":"4"}',
    });
    expect(await call('GET', '/v1/deployment/vm-config', KEY)).toEqual({ status: 200, body: { services } });
    // a field stored by a version before the typed document (an env file) still reads back
    await redis.hset(DEPLOY_VM_CONFIG_KEY, 'space-router', 'A=1\n');
    expect((await call('GET', '/v1/deployment/vm-config', KEY)).body).toMatchObject({
      services: { 'space-router': { A: '1' } },
    });
  });

  it('replaces the whole document: a service left out is gone from the hash', async () => {
    await call('PUT', '/v1/deployment/vm-config', KEY, { services });
    await call('PUT', '/v1/deployment/vm-config', KEY, { services: { 'space-router': { A: '1' } } });
    expect(await redis.hgetall(DEPLOY_VM_CONFIG_KEY)).toEqual({ 'space-router': '{"A":"1"}' });
  });

  it('refuses a value that would smuggle a line into an env file, and names that are not services or variables', async () => {
    for (const bad of [
      { 'space-api': { SPACE_LOG_LEVEL: 'info\nSPACE_DRIVER=qemu' } },
      { 'space-api': { 'BAD NAME': 'x' } },
      { '../etc/passwd': { A: '1' } },
      { 'space-agent@Pool': { A: '1' } },
    ]) {
      const r = await call('PUT', '/v1/deployment/vm-config', KEY, { services: bad });
      expect(r.status, JSON.stringify(bad)).toBe(400);
    }
    expect(await redis.hgetall(DEPLOY_VM_CONFIG_KEY)).toEqual({ 'space-router': '{"A":"1"}' });
  });

  it('is for deployment admins only: an everyday key gets SCOPE_DENIED both ways', async () => {
    const { secret } = await new ApiKeyStore(redis).create({
      team: 'default',
      name: 'tenant',
      scopes: ['sandboxes:read', 'sandboxes:write', 'nodes:read'],
    });
    for (const [m, body] of [
      ['GET', undefined],
      ['PUT', { services: {} }],
    ] as const) {
      const r = await call(m, '/v1/deployment/vm-config', secret, body);
      expect(r.status).toBe(403);
      expect(r.body).toMatchObject({ error: { code: 'SCOPE_DENIED' } });
    }
  });
});
