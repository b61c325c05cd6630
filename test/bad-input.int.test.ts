/** Bad input gets a clear coded 4xx and changes nothing. */
import { readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadSigningKey, mintSessionToken, writeNewKeyPair } from '../runtime/core/tokens.ts';
import { collect, leftovers, NO_LEFTOVERS, readEvents, type Stack, startStack } from './stack.ts';

const UPLOAD_LIMIT = 1024 * 1024;
const SPOOL_LIMIT = 2 * 1024 * 1024;

describe('bad input', () => {
  let s: Stack;
  let a: string;
  let b: string;
  beforeAll(async () => {
    // small limits so the tests can reach them: 1 MiB uploads, 4 streams per sandbox, 2 MiB of
    // output kept per command
    s = await startStack({
      SPACE_MAX_UPLOAD_BYTES: String(UPLOAD_LIMIT),
      SPACE_MAX_STREAMS: '4',
      SPACE_SPOOL_LIMIT_BYTES: String(SPOOL_LIMIT),
    });
    [a, b] = await Promise.all([s.createSandbox(), s.createSandbox()]);
  });
  afterAll(async () => {
    if (!s) return;
    await s.stop();
    expect(await leftovers(s)).toEqual(NO_LEFTOVERS);
  });

  const code = (body: unknown) => (body as { error: { code: string } }).error.code;

  it('refuses an unknown template, bad bodies and oversized bodies with stable codes', async () => {
    const before = (await s.call<{ sandboxes: unknown[] }>('GET', '/v1/sandboxes')).body.sandboxes.length;
    const unknown = await s.call('POST', '/v1/sandboxes', { template: 'no-such-template' });
    expect([unknown.status, code(unknown.body)]).toEqual([404, 'TEMPLATE_NOT_FOUND']);
    const badType = await s.call('POST', '/v1/sandboxes', { template: 'base', vcpus: 'many' });
    expect([badType.status, code(badType.body)]).toEqual([400, 'BAD_REQUEST']);
    const extra = await s.call('POST', '/v1/sandboxes', { template: 'base', privileged: true });
    expect([extra.status, code(extra.body)]).toEqual([400, 'BAD_REQUEST']);
    const tooLong = await s.call('POST', '/v1/sandboxes', { template: 'base', timeoutSec: 10_000_000 });
    expect([tooLong.status, code(tooLong.body)]).toEqual([400, 'BAD_REQUEST']);
    // bodies are checked strictly: no quiet casts, no silently dropped fields
    for (const bad of [
      { template: 5 },
      { template: 'base', vcpus: '1' },
      { template: 'base', env: { X: 5 } },
      { template: 'base', env: { 'A B': 'x' } },
      { template: 'base', metadata: { team: 7 } },
    ]) {
      const r = await s.call('POST', '/v1/sandboxes', bad);
      expect([r.status, code(r.body)], JSON.stringify(bad)).toEqual([400, 'BAD_REQUEST']);
    }
    const huge = await s.call('POST', '/v1/sandboxes', {
      template: 'base',
      metadata: { big: 'x'.repeat(2_000_000) },
    });
    expect([huge.status, code(huge.body)]).toEqual([413, 'BODY_TOO_LARGE']);
    const after = (await s.call<{ sandboxes: unknown[] }>('GET', '/v1/sandboxes')).body.sandboxes.length;
    expect(after).toBe(before);
  });

  it('refuses missing and unknown API keys', async () => {
    const none = await request(`${s.apiUrl}/v1/sandboxes`);
    expect(none.statusCode).toBe(401);
    expect(code(await none.body.json())).toBe('UNAUTHENTICATED');
    const wrong = await s.call('GET', '/v1/sandboxes', undefined, {
      authorization: 'Bearer space_not_a_key',
    });
    expect([wrong.status, code(wrong.body)]).toEqual([401, 'UNAUTHENTICATED']);
  });

  it('answers unknown sandboxes, operations and malformed ids with 404/400', async () => {
    const ghost = 'sbx_aaaaaaaaaaaaaaaaaaaa';
    for (const [method, path, body] of [
      ['GET', `/v1/sandboxes/${ghost}`, undefined],
      ['DELETE', `/v1/sandboxes/${ghost}`, undefined],
      ['POST', `/v1/sandboxes/${ghost}/commands`, { cmd: 'true' }],
      ['POST', `/v1/sandboxes/${ghost}/timeout`, { timeoutSec: 10 }],
    ] as const) {
      const r = await s.call(method, path, body);
      expect([r.status, code(r.body)], `${method} ${path}`).toEqual([404, 'SANDBOX_NOT_FOUND']);
    }
    const op = await s.call('GET', '/v1/operations/op_aaaaaaaaaaaaaaaaaaaa');
    expect([op.status, code(op.body)]).toEqual([404, 'OPERATION_NOT_FOUND']);
    const malformed = await s.call('GET', '/v1/sandboxes/..%2F..%2Fetc');
    expect([malformed.status, code(malformed.body)]).toEqual([400, 'BAD_REQUEST']);
    const both = await s.call('POST', `/v1/sandboxes/${a}/commands`, {
      cmd: 'echo',
      args: ['x'],
      shell: true,
    });
    expect([both.status, code(both.body)]).toEqual([400, 'BAD_REQUEST']);
  });

  it('refuses an Idempotency-Key reused with another body, and replays the same body', async () => {
    const h = { 'idempotency-key': 'bad-input-key-1' };
    const first = await s.call<{ sandbox: { id: string } }>(
      'POST',
      '/v1/sandboxes',
      { template: 'base', metadata: { n: '1' } },
      h,
    );
    expect(first.status).toBe(202);
    const again = await s.call<{ sandbox: { id: string } }>(
      'POST',
      '/v1/sandboxes',
      { metadata: { n: '1' }, template: 'base' },
      h,
    );
    expect(again.body.sandbox.id).toBe(first.body.sandbox.id);
    const other = await s.call('POST', '/v1/sandboxes', { template: 'base', metadata: { n: '2' } }, h);
    expect([other.status, code(other.body)]).toEqual([422, 'IDEMPOTENCY_CONFLICT']);
  });

  it('idempotent create racing itself: concurrent creates with one key make one sandbox and one operation', async () => {
    const h = { 'idempotency-key': `race-${Date.now()}` };
    const body = { template: 'base', metadata: { race: h['idempotency-key'] } };
    const all = await Promise.all(
      Array.from({ length: 6 }, () =>
        s.call<{ sandbox: { id: string }; operation: { id: string } }>('POST', '/v1/sandboxes', body, h),
      ),
    );
    expect(all.map((r) => r.status)).toEqual(Array(6).fill(202));
    expect(new Set(all.map((r) => r.body.sandbox.id)).size).toBe(1);
    expect(new Set(all.map((r) => r.body.operation.id)).size).toBe(1);
    const listed = await s.call<{ sandboxes: { id: string }[] }>(
      'GET',
      `/v1/sandboxes?metadata=${encodeURIComponent(`race=${h['idempotency-key']}`)}`,
    );
    expect(listed.body.sandboxes.map((x) => x.id)).toEqual([all[0]!.body.sandbox.id]);
    await s.call('DELETE', `/v1/sandboxes/${all[0]!.body.sandbox.id}`);
  });

  it('limits: metadata, env, inline stdin and long-poll at their limit pass, one past it is refused', async () => {
    const keys = (n: number, v = 'x') =>
      Object.fromEntries(Array.from({ length: n }, (_, i) => [`k${i}`, v]));
    const env = (n: number) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`E${i}`, 'x']));
    const refused = [
      ['metadata keys', '/v1/sandboxes', { template: 'base', metadata: keys(33) }],
      ['metadata value', '/v1/sandboxes', { template: 'base', metadata: { k: 'x'.repeat(257) } }],
      ['env vars', '/v1/sandboxes', { template: 'base', env: env(129) }],
      ['stdin', `/v1/sandboxes/${a}/commands`, { cmd: 'true', stdin: 'x'.repeat(512 * 1024 + 1) }],
      ['command env', `/v1/sandboxes/${a}/commands`, { cmd: 'true', env: env(129) }],
    ] as const;
    for (const [what, path, body] of refused) {
      const r = await s.call('POST', path, body);
      expect([r.status, code(r.body)], what).toEqual([400, 'BAD_REQUEST']);
    }
    const atLimit = await s.call<{ sandbox: { id: string } }>('POST', '/v1/sandboxes', {
      template: 'base',
      metadata: keys(32, 'y'.repeat(256)),
      env: env(128),
    });
    expect(atLimit.status).toBe(202);
    await s.call('DELETE', `/v1/sandboxes/${atLimit.body.sandbox.id}`);
    const stdin = 'z'.repeat(512 * 1024);
    const cat = await s.exec(a, { cmd: 'wc', args: ['-c'], stdin, env: env(128) });
    expect(cat.stdout.toString().trim()).toBe(String(512 * 1024));
    const op = (
      await s.call<{ operation: { id: string } }>('DELETE', `/v1/sandboxes/${atLimit.body.sandbox.id}`)
    ).body.operation.id;
    const over = await s.call('GET', `/v1/operations/${op}?waitMs=60001`);
    expect([over.status, code(over.body)]).toEqual([400, 'BAD_REQUEST']);
    expect((await s.call('GET', `/v1/operations/${op}?waitMs=60000`)).status).toBe(200);
  });

  it('limits: an upload one byte past SPACE_MAX_UPLOAD_BYTES is refused (declared or streamed); one at it lands', async () => {
    const f = await s.token(a, ['files']);
    const put = async (size: number, chunked: boolean) => {
      const data = Buffer.alloc(size, 7);
      const r = await request(`${f.url}/files?path=${encodeURIComponent('/home/user/limit.bin')}`, {
        method: 'PUT',
        headers: { authorization: `Bearer ${f.token}`, 'content-type': 'application/octet-stream' },
        // an async iterable has no length: the body goes chunked, with no Content-Length to refuse early
        body: chunked ? Readable.from([data]) : data,
      });
      const text = await r.body.text();
      return [r.statusCode, r.statusCode >= 400 ? code(JSON.parse(text)) : 'ok'];
    };
    expect(await put(UPLOAD_LIMIT, false)).toEqual([200, 'ok']);
    expect(await put(UPLOAD_LIMIT + 1, false)).toEqual([413, 'BODY_TOO_LARGE']);
    expect(await put(UPLOAD_LIMIT + 1, true)).toEqual([413, 'BODY_TOO_LARGE']);
    const st = await request(`${f.url}/fs/stat?path=${encodeURIComponent('/home/user/limit.bin')}`, {
      headers: { authorization: `Bearer ${f.token}` },
    });
    expect(((await st.body.json()) as { size: number }).size).toBe(UPLOAD_LIMIT);
  });

  it('limits: output past SPACE_SPOOL_LIMIT_BYTES ends in one `truncated` event; the exit still comes', async () => {
    const res = await s.call<{ stream: { url: string; token: string } }>(
      'POST',
      `/v1/sandboxes/${a}/commands`,
      {
        cmd: 'sh',
        args: ['-c', 'head -c 3000000 /dev/zero; echo tail >&2; exit 7'],
      },
    );
    expect(res.status).toBe(201);
    const events = await readEvents(res.body.stream.url, res.body.stream.token);
    const truncated = events.filter((e) => e.event === 'truncated');
    expect(truncated).toHaveLength(1);
    const { droppedAfter } = JSON.parse(truncated[0]!.data) as { droppedAfter: number };
    const out = collect(events);
    // what was kept is whole frames up to the limit, and the truncated event says where it stopped
    expect(droppedAfter).toBeLessThanOrEqual(SPOOL_LIMIT);
    expect(out.stdout.length).toBeGreaterThan(SPOOL_LIMIT / 2);
    expect(out.stdout.length).toBeLessThan(3_000_000);
    expect(out.stdout.equals(Buffer.alloc(out.stdout.length))).toBe(true);
    expect(out.exit.exitCode).toBe(7);
    expect(events.at(-1)?.event).toBe('exit');
  });

  it('limits: the fifth concurrent stream of a sandbox (SPACE_MAX_STREAMS=4) is RATE_LIMITED; closing one frees a place', async () => {
    const c = await s.call<{ command: { id: string }; stream: { url: string; token: string } }>(
      'POST',
      `/v1/sandboxes/${a}/commands`,
      { cmd: 'sleep', args: ['60'] },
    );
    const open = () =>
      request(c.body.stream.url, { headers: { authorization: `Bearer ${c.body.stream.token}` } });
    const streams = [];
    for (let i = 0; i < 4; i++) {
      const r = await open();
      expect(r.statusCode).toBe(200);
      streams.push(r);
    }
    const fifth = await open();
    expect([fifth.statusCode, code(await fifth.body.json())]).toEqual([429, 'RATE_LIMITED']);
    streams.pop()!.body.destroy();
    let again = await open();
    for (let i = 0; i < 50 && again.statusCode === 429; i++) {
      await again.body.dump();
      await new Promise((r) => setTimeout(r, 100));
      again = await open();
    }
    expect(again.statusCode).toBe(200);
    again.body.destroy();
    for (const r of streams) r.body.destroy();
    const sig = await request(c.body.stream.url.replace(/\/events$/, '/signal'), {
      method: 'POST',
      headers: { authorization: `Bearer ${c.body.stream.token}`, 'content-type': 'application/json' },
      body: JSON.stringify({ signal: 'SIGKILL' }),
    });
    await sig.body.dump();
  });

  it('refuses data-plane requests with expired, foreign, mis-scoped or forged tokens', async () => {
    const grantA = await s.token(a, ['files']);
    const urlB = grantA.url.replace(a, b);
    const path = `/files?path=${encodeURIComponent('/etc/hostname')}`;
    const get = async (url: string, token: string) => {
      const r = await request(`${url}${path}`, { headers: { authorization: `Bearer ${token}` } });
      return [r.statusCode, code(await r.body.json())];
    };
    const ok = await request(`${grantA.url}${path}`, {
      headers: { authorization: `Bearer ${grantA.token}` },
    });
    expect(ok.statusCode).toBe(200);
    await ok.body.dump();
    expect(await get(urlB, grantA.token)).toEqual([403, 'TOKEN_SCOPE']);

    const key = await loadSigningKey(join(s.dir, 'key.pem'));
    const sessionA = (await s.call<{ sessionId: string }>('GET', `/v1/sandboxes/${a}`)).body.sessionId;
    const expired = await mintSessionToken(key, {
      team: 'default',
      sandboxId: a,
      sessionId: sessionA,
      scopes: ['files'],
      ttlSec: -60,
    });
    expect(await get(grantA.url, expired.token)).toEqual([401, 'TOKEN_EXPIRED']);
    const commandsOnly = await mintSessionToken(key, {
      team: 'default',
      sandboxId: a,
      sessionId: sessionA,
      scopes: ['commands'],
      ttlSec: 60,
    });
    expect(await get(grantA.url, commandsOnly.token)).toEqual([403, 'TOKEN_SCOPE']);
    const oldSession = await mintSessionToken(key, {
      team: 'default',
      sandboxId: a,
      sessionId: 'ses_aaaaaaaaaaaaaaaaaaaa',
      scopes: ['files'],
      ttlSec: 60,
    });
    expect(await get(grantA.url, oldSession.token)).toEqual([403, 'TOKEN_SCOPE']);
    await writeNewKeyPair(join(s.dir, 'other.pem'), join(s.dir, 'other.pub.pem'));
    const forged = await mintSessionToken(await loadSigningKey(join(s.dir, 'other.pem')), {
      team: 'default',
      sandboxId: a,
      sessionId: sessionA,
      scopes: ['files'],
      ttlSec: 60,
    });
    expect(await get(grantA.url, forged.token)).toEqual([401, 'TOKEN_INVALID']);
    expect(await get(grantA.url, 'not.a.jwt')).toEqual([401, 'TOKEN_INVALID']);
    const none = await request(`${grantA.url}${path}`);
    expect(none.statusCode).toBe(401);
    await none.body.dump();
    const traversal = await request(`${grantA.url}/files?path=${encodeURIComponent('../../../etc/passwd')}`, {
      headers: { authorization: `Bearer ${grantA.token}` },
    });
    expect([traversal.statusCode, code(await traversal.body.json())]).toEqual([400, 'PATH_INVALID']);
    // the internal dispatch routes take no session tokens
    const internal = await request(`${grantA.url.replace(/\/v1\/sandboxes\/.*/, '')}/internal/v1/sandboxes`, {
      headers: { authorization: `Bearer ${grantA.token}` },
    });
    expect(internal.statusCode).toBe(403);
    await internal.body.dump();
    expect((await readFile(join(s.dir, 'api-key'), 'utf8')).length).toBeGreaterThan(10);
  });

  it('refuses bad egress policies and unknown credentials before writing anything', async () => {
    const before = (await s.call<{ sandboxes: unknown[] }>('GET', '/v1/sandboxes?limit=1000')).body.sandboxes
      .length;
    for (const egress of [
      { allow: ['bad..name'] },
      { allow: ['127.0.0.1'] },
      { cidrs: [{ cidr: '10.0.0.0/33', ports: [443] }] },
      { mode: 'everything' },
    ]) {
      const r = await s.call('POST', '/v1/sandboxes', { template: 'base', egress });
      expect([r.status, code(r.body)], JSON.stringify(egress)).toEqual([400, 'BAD_REQUEST']);
    }
    const missing = await s.call('POST', '/v1/sandboxes', {
      template: 'base',
      credentials: ['no-such-cred'],
    });
    expect([missing.status, code(missing.body)]).toEqual([404, 'CREDENTIAL_NOT_FOUND']);
    const after = (await s.call<{ sandboxes: unknown[] }>('GET', '/v1/sandboxes?limit=1000')).body.sandboxes
      .length;
    expect(after).toBe(before);
  });

  it('keeps credential values out of API answers and out of the sandbox', async () => {
    const secret = 'sk-real-value-that-must-never-leak-0123456789';
    const put = await s.call('PUT', '/v1/credentials/model-api', {
      domains: ['api.model.test'],
      value: secret,
    });
    expect(put.status).toBe(200);
    expect(JSON.stringify(put.body)).not.toContain(secret);
    expect(put.body).toMatchObject({ name: 'model-api', envVar: 'MODEL_API', header: 'authorization' });
    const list = await s.call('GET', '/v1/credentials');
    expect(JSON.stringify(list.body)).not.toContain(secret);
    const bad = await s.call('PUT', '/v1/credentials/broken', {
      domains: ['x.test'],
      format: 'no placeholder',
      value: 'v',
    });
    expect([bad.status, code(bad.body)]).toEqual([400, 'BAD_REQUEST']);

    const id = await s.createSandbox({ credentials: ['model-api'] });
    const rec = await s.call<{ credentials: { name: string; envVar: string }[] }>(
      'GET',
      `/v1/sandboxes/${id}`,
    );
    expect(rec.body.credentials).toEqual([{ name: 'model-api', envVar: 'MODEL_API' }]);
    expect(JSON.stringify(rec.body)).not.toContain(secret);
    // the node's state file for the sandbox holds the grant, never the value (the gateway fetches it)
    const stateFile = join(s.dir, 'agent', 'sandboxes', id, 'sandbox.json');
    expect(await readFile(stateFile, 'utf8')).toContain('model-api');
    expect(await readFile(stateFile, 'utf8')).not.toContain(secret);
    expect((await stat(stateFile)).mode & 0o777).toBe(0o600);
    const inside = await s.exec(id, {
      cmd: 'sh',
      args: [
        '-c',
        'echo "$MODEL_API"; cat /proc/*/environ 2>/dev/null | tr "\\0" "\\n" | grep -c "sk-real" || true',
      ],
    });
    const [placeholder, hits] = inside.stdout.toString().trim().split('\n');
    expect(placeholder).toMatch(/^space_ph_[a-z0-9]{32}$/);
    expect(hits).toBe('0');
    const grep = await s.exec(id, {
      cmd: 'sh',
      args: ['-c', 'grep -rl "sk-real" /etc /home /tmp /opt 2>/dev/null | wc -l'],
    });
    expect(grep.stdout.toString().trim()).toBe('0');
    expect((await s.call('DELETE', '/v1/credentials/model-api')).status).toBe(204);
    expect((await s.call('DELETE', '/v1/credentials/model-api')).status).toBe(404);
  });

  it('serves the OpenAPI document, health and metrics without a key', async () => {
    const doc = (await (await request(`${s.apiUrl}/openapi.json`)).body.json()) as {
      paths: Record<string, unknown>;
    };
    expect(Object.keys(doc.paths)).toEqual(expect.arrayContaining(['/v1/sandboxes', '/v1/operations/{id}']));
    const metrics = await (await request(`${s.apiUrl}/metrics`)).body.text();
    expect(metrics).toContain('space_api_requests_total');
    expect((await request(`${s.apiUrl}/readyz`)).statusCode).toBe(200);
  });

  it('r18-bodiless-requests: a request with no body is accepted whatever its Content-Type', async () => {
    const id = await s.createSandbox();
    const send = (method: 'DELETE' | 'POST' | 'GET', path: string, type: string) =>
      request(`${s.apiUrl}${path}`, {
        method,
        headers: { authorization: `Bearer ${s.apiKey}`, 'content-type': type },
      }).then(async (r) => ({
        status: r.statusCode,
        body: (await r.body.json()) as Record<string, unknown>,
      }));
    expect((await send('GET', `/v1/sandboxes/${id}`, 'application/json')).status).toBe(200);
    const del = await send('DELETE', `/v1/sandboxes/${id}`, 'application/json');
    expect(del.status).toBe(202);
    expect(del.body).toHaveProperty('operation');
    expect((await send('DELETE', `/v1/sandboxes/${id}`, 'text/plain; charset=utf-8')).status).toBe(202);
    // a route that needs a body still says so, with a stable code
    const create = await send('POST', '/v1/sandboxes', 'application/json');
    expect([create.status, code(create.body)]).toEqual([400, 'BAD_REQUEST']);
  });
});
