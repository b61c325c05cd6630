/**
 * Test-only fixture for the proxy tests that run on 127.0.0.1 (`http-framing.test.ts`,
 * `http-proxy.fuzz.test.ts`, `splice-watch.test.ts`): a plain HTTP or TLS proxy whose one caller,
 * 127.0.0.1, is a sandbox allowed to reach {@link ALLOWED}, in front of an upstream the test runs;
 * and the raw client those tests talk to it with. Not shipped in the image (`test-*.ts`).
 */
import { once } from 'node:events';
import net, { type AddressInfo } from 'node:net';
import { pino } from 'pino';
import { createAudit } from './audit.ts';
import { createHttpProxy } from './http-proxy.ts';
import type { ConnectionLimits } from './limits.ts';
import { normalisePolicy } from './policy.ts';
import { Registry } from './registry.ts';
import { createTlsProxy, type ProxyDeps } from './tls-proxy.ts';

/** The one name the test sandbox's policy allows; any other is refused. */
export const ALLOWED = 'allowed.test';

/** Limits of the test proxies: timeouts in ms, sizes in bytes. */
const LIMITS: ConnectionLimits = {
  handshakeTimeoutMs: 2000,
  idleTimeoutMs: 5000,
  dialTimeoutMs: 2000,
  maxConnectionBytes: 1 << 20,
  maxHelloBytes: 16384,
  maxHeaderBytes: 16384,
  maxBodyBytes: 1 << 20,
};

/** A server listening on 127.0.0.1 (its port chosen by the kernel); resolves with the port. */
export async function listenOnLoopback(server: net.Server): Promise<number> {
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return (server.address() as AddressInfo).port;
}

/**
 * Starts a proxy of `kind` on 127.0.0.1: 127.0.0.1 is registered as sandbox `sandboxId` with a
 * policy that allows {@link ALLOWED}; every name resolves to 127.0.0.1; audit and log are silent;
 * it dials 127.0.0.1:`upstreamPort`. The TLS proxy has no credential interception.
 * @returns the proxy's port and its close.
 */
export async function startTestProxy(
  kind: 'http' | 'tls',
  sandboxId: string,
  upstreamPort: number,
): Promise<{ port: number; close: () => void }> {
  const registry = new Registry({ maxConnections: 64, dnsQueriesPerSec: 100 });
  registry.put('127.0.0.1', {
    sandboxId,
    policy: normalisePolicy({ allow: [ALLOWED] }),
    credentials: [],
  });
  const deps: ProxyDeps = {
    registry,
    resolver: {
      resolve: async () => ({ allowed: ['127.0.0.1'], denied: [], ttlSec: 30, chain: [] }),
      clear() {},
    },
    audit: createAudit(pino({ level: 'silent' })),
    log: pino({ level: 'silent' }),
    limits: LIMITS,
    upstreamPort,
  };
  const proxy = kind === 'http' ? createHttpProxy(deps) : createTlsProxy(deps);
  const port = await listenOnLoopback(proxy);
  return { port, close: () => proxy.close() };
}

/**
 * A raw client of 127.0.0.1:`port`: writes `first`, then `second` (if given) once the first bytes
 * come back; resolves with every byte read (as latin1) when the connection closes. A 3 s guard
 * destroys it if it is still open then.
 */
export function rawExchange(port: number, first: string | Buffer, second?: Buffer): Promise<string> {
  return new Promise((resolve) => {
    let text = '';
    let answered = false;
    const c = net.connect(port, '127.0.0.1', () => c.write(first));
    const guard = setTimeout(() => c.destroy(), 3000);
    c.on('data', (d: Buffer) => {
      text += d.toString('latin1');
      if (!answered && second) c.write(second);
      answered = true;
    });
    c.on('error', () => {});
    c.on('close', () => {
      clearTimeout(guard);
      resolve(text);
    });
  });
}
