import { execFile } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { defaultHaPorts, frontErrorResponse, haproxyConfig, runUpHa } from './up-ha.ts';

const run = promisify(execFile);

describe('space up --ha', () => {
  it("writes a configuration Debian's haproxy accepts: one front per pair, each member checked on /readyz", async () => {
    const ports = defaultHaPorts(9080, 9081, 9082);
    expect(ports.apis).toEqual([9090, 9091]);
    expect(ports.routers).toEqual([9092, 9093]);
    const dir = await mkdtemp(join(tmpdir(), 'space-haproxy-'));
    const cfg = haproxyConfig(ports, dir);
    try {
      for (const st of [502, 503, 504] as const)
        await writeFile(join(dir, `${st}.http`), frontErrorResponse(st));
      await writeFile(join(dir, 'haproxy.cfg'), cfg);
      const { stdout } = await run('haproxy', ['-c', '-f', join(dir, 'haproxy.cfg')]);
      expect(stdout).toContain('Configuration file is valid');
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
    expect(cfg.match(/option httpchk GET \/readyz/g)).toHaveLength(2);
    for (const p of [9090, 9091, 9092, 9093])
      expect(cfg).toMatch(new RegExp(`server \\S+ 127\\.0\\.0\\.1:${p} check`));
    expect(cfg).toContain('bind 127.0.0.1:9080');
    expect(cfg).toContain('bind 127.0.0.1:9082');
    expect(cfg).toContain(`errorfile 503 ${join(dir, '503.http')}`);
  });

  it("answers the front's own refusals in SPACE's envelope: 503 UPSTREAM_UNAVAILABLE with Retry-After", () => {
    const raw = frontErrorResponse(502);
    const [head, body] = raw.split('\r\n\r\n') as [string, string];
    expect(head.split('\r\n')[0]).toBe('HTTP/1.1 503 Service Unavailable');
    expect(head).toContain('retry-after: 2');
    expect(head).toContain(`content-length: ${Buffer.byteLength(body)}`);
    expect(JSON.parse(body).error.code).toBe('UPSTREAM_UNAVAILABLE');
  });

  it('refuses --redis-url and --no-router with a usage error', async () => {
    const base = { apiPort: 9080, agentPort: 9081, routerPort: 9082, router: true };
    await expect(runUpHa({ ...base, redisUrl: 'redis://x:6379' }, false)).rejects.toMatchObject({
      code: 'USAGE',
    });
    await expect(runUpHa({ ...base, router: false }, false)).rejects.toMatchObject({ code: 'USAGE' });
  });
});
