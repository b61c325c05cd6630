/**
 * The CLI waits out retryable refusals (issue 49: a create right after `space up` starts got
 * TEMPLATE_NOT_READY): the real `space` program against a loopback server that refuses first.
 */
import { execFile } from 'node:child_process';
import { once } from 'node:events';
import { createServer, type IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterEach, describe, expect, it } from 'vitest';
import { waitable } from './client.ts';
import { CliError } from './output.ts';

const CLI = fileURLToPath(new URL('./space.ts', import.meta.url));
const run = promisify(execFile);

/** A fake API: answers POST /v1/sandboxes with `refusals` refusals (`code`), then a create. */
async function fakeApi(code: string, status: number, refusals: number) {
  const seen: IncomingHttpHeaders[] = [];
  const server = createServer((req, res) => {
    req.resume();
    seen.push(req.headers);
    res.setHeader('content-type', 'application/json');
    if (seen.length <= refusals) {
      res.statusCode = status;
      res.end(JSON.stringify({ error: { code, message: `refused (${code})` } }));
      return;
    }
    res.statusCode = 202;
    res.end(JSON.stringify({ sandbox: { id: 'sbx_aaaaaaaaaaaaaaaaaaaa' }, operation: { id: 'op_x' } }));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return { url, seen, close: () => new Promise((r) => server.close(r)) };
}

/** Runs `space <args>` against `url`; resolves with exit code, stdout and stderr. */
async function space(url: string, args: string[]) {
  return run(process.execPath, [CLI, ...args], {
    env: { ...process.env, SPACE_API_URL: url, SPACE_API_KEY: 'space_test' },
    timeout: 30_000,
  }).then(
    (r) => ({ code: 0, stdout: r.stdout, stderr: r.stderr }),
    (e: { code: number; stdout: string; stderr: string }) => ({
      code: e.code,
      stdout: e.stdout,
      stderr: e.stderr,
    }),
  );
}

const servers: { close(): Promise<unknown> }[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close()));
});

describe('the CLI waits out retryable refusals', () => {
  it('a create refused TEMPLATE_NOT_READY twice is asked again, notes each wait on stderr, and succeeds', async () => {
    const api = await fakeApi('TEMPLATE_NOT_READY', 409, 2);
    servers.push(api);
    const r = await space(api.url, ['sandbox', 'create', '--no-wait']);
    expect(r.code).toBe(0);
    expect(r.stdout.trim()).toBe('sbx_aaaaaaaaaaaaaaaaaaaa');
    expect(r.stderr.match(/^waiting: TEMPLATE_NOT_READY: /gm)).toHaveLength(2);
    expect(api.seen).toHaveLength(3);
    // one Idempotency-Key for every attempt: at most one sandbox however many were sent
    const keys = new Set(api.seen.map((h) => h['idempotency-key']));
    expect(keys.size).toBe(1);
    expect([...keys][0]).toBeTruthy();
  });

  it('with --json the waits are JSON lines on stderr and stdout holds only the answer', async () => {
    const api = await fakeApi('NODE_UNAVAILABLE', 503, 1);
    servers.push(api);
    const r = await space(api.url, ['--json', 'sandbox', 'create', '--no-wait']);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.stdout)).toMatchObject({ sandbox: { id: 'sbx_aaaaaaaaaaaaaaaaaaaa' } });
    const lines = r.stderr
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { waiting: { code: string } });
    expect(lines.map((l) => l.waiting.code)).toEqual(['NODE_UNAVAILABLE']);
  });

  it('gives up within --retry-for with the refusal’s code, and never repeats a refusal that is not one to wait out', async () => {
    const api = await fakeApi('TEMPLATE_NOT_READY', 409, 1000);
    servers.push(api);
    const r = await space(api.url, ['--retry-for', '1', 'sandbox', 'create', '--no-wait']);
    expect(r.code).toBe(125);
    expect(r.stderr).toMatch(/TEMPLATE_NOT_READY/);
    expect(r.stderr).toMatch(/^waiting: TEMPLATE_NOT_READY/m);
    const hard = await fakeApi('TEMPLATE_NOT_FOUND', 404, 1000);
    servers.push(hard);
    const h = await space(hard.url, ['sandbox', 'create', '--no-wait']);
    expect(h.code).toBe(125);
    expect(h.stderr).not.toMatch(/waiting/);
    expect(hard.seen).toHaveLength(1);
  });

  it('repeats a POST only for refusals made before the API acted', () => {
    const err = (code: string) => new CliError(code, 'x');
    expect(waitable(err('TEMPLATE_NOT_READY'), 'POST')).toBe(true);
    expect(waitable(err('NODE_UNAVAILABLE'), 'POST')).toBe(false);
    expect(waitable(err('NODE_UNAVAILABLE'), 'POST', true)).toBe(true);
    expect(waitable(err('CONTROL_PLANE_UNAVAILABLE'), 'GET')).toBe(true);
    expect(waitable(err('INTERNAL'), 'GET')).toBe(false);
    expect(waitable(err('SANDBOX_PAUSED'), 'GET')).toBe(false);
  });
});
