import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtemp, rm, stat } from 'node:fs/promises';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from '../../test/redis-server.ts';
import { gatewayConfigWith } from './config.ts';
import { startGateway } from './service.ts';

let dir = '';
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gwt-svc-'));
});
afterAll(() => rm(dir, { recursive: true, force: true }));

function get(opts: {
  port?: number;
  socketPath?: string;
  path: string;
}): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', ...opts }, (res) => {
      let body = '';
      res.on('data', (d: Buffer) => {
        body += d.toString();
      });
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

/**
 * Spawns server.ts with metrics on `metricsPort`. Resolves once it logs that it listens; rejects
 * with its output if it exits first.
 */
function startServer(metricsPort: number): Promise<ChildProcess> {
  const env = {
    ...process.env,
    SPACE_GATEWAY_BIND_HOST: '127.0.0.1',
    SPACE_GATEWAY_DNS_PORT: '0',
    SPACE_GATEWAY_HTTP_PORT: '0',
    SPACE_GATEWAY_TLS_PORT: '0',
    SPACE_GATEWAY_METRICS_PORT: String(metricsPort),
    SPACE_GATEWAY_CONTROL_SOCKET: join(dir, 'server.sock'),
    SPACE_GATEWAY_CA_CERT_FILE: join(dir, 'srv-ca.crt'),
    SPACE_GATEWAY_CA_KEY_FILE: join(dir, 'srv-ca.key'),
    SPACE_LOG_LEVEL: 'info',
  };
  const child = spawn(process.execPath, [fileURLToPath(new URL('./server.ts', import.meta.url))], { env });
  let out = '';
  return new Promise<ChildProcess>((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`not listening: ${out}`));
    }, 15_000);
    child.stdout.on('data', (d: Buffer) => {
      out += d.toString();
      if (out.includes('gateway listening')) {
        clearTimeout(timer);
        resolve(child);
      }
    });
    child.stderr.on('data', (d: Buffer) => {
      out += d.toString();
    });
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`exited ${code}: ${out}`));
    });
  });
}

describe('startGateway', () => {
  it('binds every port, a 0600 control socket and the optional metrics port; close() removes the socket', async () => {
    const controlSocket = join(dir, 'sub', 'gateway.sock');
    const gw = await startGateway(
      gatewayConfigWith({
        bindHost: '127.0.0.1',
        dnsPort: 0,
        httpPort: 0,
        tlsPort: 0,
        metricsPort: 0,
        controlSocket,
        caCertFile: join(dir, 'ca.crt'),
        caKeyFile: join(dir, 'ca.key'),
        upstreamDns: '127.0.0.1:9',
      }),
      { log: pino({ level: 'silent' }) },
    );
    try {
      expect(gw.dnsPort).toBeGreaterThan(0);
      expect(gw.httpPort).toBeGreaterThan(0);
      expect(gw.tlsPort).toBeGreaterThan(0);
      expect((await stat(controlSocket)).mode & 0o777).toBe(0o600);
      expect((await stat(join(dir, 'ca.key'))).mode & 0o777).toBe(0o600);
      expect(await get({ socketPath: controlSocket, path: '/v1/sandboxes' })).toEqual({
        status: 200,
        body: '{"sandboxes":[]}',
      });
    } finally {
      await gw.close();
    }
    await expect(stat(controlSocket)).rejects.toThrow();
  });

  it('server.ts starts from the environment, serves metrics on 127.0.0.1 and exits 0 on SIGTERM', async () => {
    // The metrics port must be named (0 turns metrics off), so a port the kernel just handed out
    // can still be taken by another test's socket before the child binds it: that one case is
    // retried with a new port, a bounded number of times.
    let child: ChildProcess | null = null;
    let metricsPort = 0;
    for (let attempt = 1; child === null; attempt += 1) {
      metricsPort = await freePort();
      try {
        child = await startServer(metricsPort);
      } catch (err) {
        if (attempt >= 3 || !String(err).includes('EADDRINUSE')) throw err;
      }
    }
    try {
      const metrics = await get({ port: metricsPort, path: '/metrics' });
      expect(metrics.status).toBe(200);
      expect(metrics.body).toContain('space_gateway_connections');
      const running = child;
      const exited = new Promise<number | null>((resolve) => running.once('exit', (code) => resolve(code)));
      child.kill('SIGTERM');
      expect(await exited).toBe(0);
    } finally {
      if (child.exitCode === null) child.kill('SIGKILL');
    }
  }, 30_000);
});
