import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { collect, leftovers, NO_LEFTOVERS, readEvents, type Stack, startStack } from './stack.ts';

describe('create → exec → stream → files → delete', () => {
  let s: Stack;
  beforeAll(async () => {
    s = await startStack();
  });
  afterAll(async () => {
    if (!s) return;
    await s.stop();
    expect(await leftovers(s)).toEqual(NO_LEFTOVERS);
  });

  it('runs a command and reports its output and exit code', async () => {
    const id = await s.createSandbox({ metadata: { suite: 'e2e' }, env: { GREETING: 'hi' } });
    const got = await s.call<{ state: string; nodeId: string }>('GET', `/v1/sandboxes/${id}`);
    expect(got.body.state).toBe('running');
    expect(got.body.nodeId).toBe('test-node');

    const r = await s.exec(id, { cmd: 'sh', args: ['-c', 'echo hello; echo "$GREETING" >&2; exit 3'] });
    expect(r.stdout.toString()).toBe('hello\n');
    expect(r.stderr.toString()).toBe('hi\n');
    expect(r.exit).toMatchObject({ exitCode: 3, signal: null, timedOut: false });

    const { url, token } = await s.token(id, ['files']);
    const put = await request(`${url}/files?path=${encodeURIComponent('/home/user/data.bin')}`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/octet-stream' },
      body: Buffer.from('0123456789'),
    });
    expect(put.statusCode).toBe(200);
    await put.body.dump();
    const cat = await s.exec(id, { cmd: 'cat', args: ['/home/user/data.bin'] });
    expect(cat.stdout.toString()).toBe('0123456789');

    // everyday tools work inside the sandbox (ls and stat come from busybox: see templates/base.json)
    const ls = await s.exec(id, {
      cmd: 'sh',
      args: ['-c', 'ls /home/user && stat -c %s /home/user/data.bin'],
    });
    expect(ls.stdout.toString()).toBe('data.bin\n10\n');
    expect(ls.exit.exitCode).toBe(0);

    // a signal reaches the command's process group and is reported as such
    const sleeper = await s.call<{ command: { id: string }; stream: { url: string; token: string } }>(
      'POST',
      `/v1/sandboxes/${id}/commands`,
      { cmd: 'sh', args: ['-c', 'echo started; sleep 30'] },
    );
    const events = readEvents(sleeper.body.stream.url, sleeper.body.stream.token);
    await new Promise((r) => setTimeout(r, 300));
    const sig = await request(`${url}/commands/${sleeper.body.command.id}/signal`, {
      method: 'POST',
      headers: { authorization: `Bearer ${sleeper.body.stream.token}`, 'content-type': 'application/json' },
      body: JSON.stringify({ signal: 'SIGTERM' }),
    });
    expect(sig.statusCode).toBe(204);
    await sig.body.dump();
    const ended = collect(await events);
    expect(ended.stdout.toString()).toBe('started\n');
    expect(ended.exit).toMatchObject({ exitCode: null, signal: 'SIGTERM' });

    const del = await s.call<{ operation: { id: string } }>('DELETE', `/v1/sandboxes/${id}`);
    expect(del.status).toBe(202);
    const op = await s.call<{ state: string }>('GET', `/v1/operations/${del.body.operation.id}?waitMs=30000`);
    expect(op.body.state).toBe('succeeded');
    const after = await s.call<{ state: string; killReason: string }>('GET', `/v1/sandboxes/${id}`);
    expect(after.body).toMatchObject({ state: 'killed', killReason: 'request' });
  });

  it('a create with ?waitMs= answers once the sandbox runs, in one request (and so does its replay)', async () => {
    type Made = { sandbox: { id: string; state: string }; operation: { id: string; state: string } };
    const headers = { 'idempotency-key': `e2e-wait-${Date.now()}` };
    const made = await s.call<Made>('POST', '/v1/sandboxes?waitMs=30000', { template: 'base' }, headers);
    expect(made.status).toBe(202);
    expect(made.body.operation.state).toBe('succeeded');
    expect(made.body.sandbox.state).toBe('running');
    const r = await s.exec(made.body.sandbox.id, { cmd: 'echo', args: ['ready'] });
    expect(r.stdout.toString()).toBe('ready\n');
    // the same key and body: the same sandbox and operation, as they are now
    const again = await s.call<Made>('POST', '/v1/sandboxes?waitMs=30000', { template: 'base' }, headers);
    expect(again.body).toMatchObject({
      sandbox: { id: made.body.sandbox.id, state: 'running' },
      operation: { id: made.body.operation.id, state: 'succeeded' },
    });
    // without waitMs the answer does not wait: the operation is pending or under way
    const quick = await s.call<Made>('POST', '/v1/sandboxes', { template: 'base' });
    expect(['pending', 'running']).toContain(quick.body.operation.state);
    expect((await s.call('POST', '/v1/sandboxes?waitMs=60001', { template: 'base' })).status).toBe(400);
    for (const id of [made.body.sandbox.id, quick.body.sandbox.id]) {
      const del = await s.call<{ operation: { id: string } }>('DELETE', `/v1/sandboxes/${id}`);
      await s.call('GET', `/v1/operations/${del.body.operation.id}?waitMs=30000`);
    }
  });
});
