/**
 * The load balancer stand-in (Akamai's NodeBalancer in TCP mode): listens on the host's rehearsal
 * address and pipes each connection to one of its backends, the one with the fewest open
 * connections (`leastconn`, as the stack configures it; ties in turn). With a health check (the stack's
 * `NodeBalancerConfig` `check: http`, `checkPath`, `checkInterval`, `checkTimeout`,
 * `checkAttempts`) a backend leaves the rotation after `attempts` failed checks in a row and comes
 * back after one that passes; a connection the backend refuses counts as a failed check (Linode's
 * passive checks, on by default). With no backend in rotation a new connection is closed at once.
 * TLS termination is not rehearsed.
 */
import { connect, createServer, type Server, type Socket } from 'node:net';
import { request } from 'undici';

/** One backend: where connections go. */
export interface Backend {
  readonly host: string;
  readonly port: number;
}

/**
 * The NodeBalancer's HTTP health check as the program renders it (Linode API
 * `NodeBalancerConfig`: `check_path`, `check_interval`, `check_timeout`, `check_attempts`;
 * https://techdocs.akamai.com/linode-api/reference/post-node-balancer-config). Seconds.
 */
export interface HealthCheck {
  readonly path: string;
  readonly intervalSec: number;
  readonly timeoutSec: number;
  readonly attempts: number;
}

/** A listening forwarder; `close()` stops it, its checks, and drops open connections. */
export interface Forwarder {
  readonly port: number;
  /** Backends in rotation now (`host:port`). */
  inRotation(): string[];
  close(): Promise<void>;
}

interface BackendState {
  readonly backend: Backend;
  up: boolean;
  failures: number;
  open: number;
}

/** One HTTP check of `b`: true when `GET path` answers 2xx within the timeout. */
async function check(b: Backend, c: HealthCheck): Promise<boolean> {
  try {
    const res = await request(`http://${b.host}:${b.port}${c.path}`, {
      headersTimeout: c.timeoutSec * 1000,
      bodyTimeout: c.timeoutSec * 1000,
      signal: AbortSignal.timeout(c.timeoutSec * 1000),
    });
    await res.body.dump();
    return res.statusCode >= 200 && res.statusCode < 300;
  } catch {
    return false;
  }
}

/**
 * Forwards `listenHost:listenPort` to `backends` (leastconn), with `health` checks when given
 * (without, every backend stays in rotation). Backends start in rotation, as a NodeBalancer's new
 * nodes do until a check fails. Rejects if the port is taken or `backends` is empty.
 */
export function balance(
  listenHost: string,
  listenPort: number,
  backends: readonly Backend[],
  health?: HealthCheck,
): Promise<Forwarder> {
  if (backends.length === 0) return Promise.reject(new Error('balance: no backends'));
  const states: BackendState[] = backends.map((backend) => ({ backend, up: true, failures: 0, open: 0 }));
  const failed = (s: BackendState) => {
    s.failures++;
    if (health && s.failures >= health.attempts) s.up = false;
  };
  const sockets = new Set<Socket>();
  let turn = 0;
  const server: Server = createServer((client) => {
    const live = states.filter((s) => s.up);
    if (live.length === 0) {
      client.destroy();
      return;
    }
    // fewest open connections; ties taken in turn
    const fewest = Math.min(...live.map((x) => x.open));
    const tied = live.filter((x) => x.open === fewest);
    const s = tied[turn++ % tied.length]!;
    s.open++;
    const upstream = connect({ host: s.backend.host, port: s.backend.port });
    sockets.add(client).add(upstream);
    let connected = false;
    upstream.once('connect', () => {
      connected = true;
    });
    let closed = false;
    const done = () => {
      if (closed) return;
      closed = true;
      s.open--;
      if (!connected) failed(s);
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    client.on('error', done).on('close', done);
    upstream.on('error', done).on('close', done);
    client.pipe(upstream).pipe(client);
  });
  let timer: NodeJS.Timeout | undefined;
  let stopped = false;
  if (health) {
    const round = async () => {
      await Promise.all(
        states.map(async (s) => {
          if (await check(s.backend, health)) {
            s.failures = 0;
            s.up = true;
          } else failed(s);
        }),
      );
      if (!stopped) timer = setTimeout(round, health.intervalSec * 1000);
    };
    timer = setTimeout(round, 0);
  }
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(listenPort, listenHost, () =>
      resolve({
        port: listenPort,
        inRotation: () => states.filter((s) => s.up).map((s) => `${s.backend.host}:${s.backend.port}`),
        close: () =>
          new Promise<void>((r) => {
            stopped = true;
            clearTimeout(timer);
            for (const x of sockets) x.destroy();
            server.close(() => r());
          }),
      }),
    );
  });
}
