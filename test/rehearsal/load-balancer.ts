/**
 * The load balancer stand-in (Akamai's NodeBalancer in TCP mode): listens on the host's rehearsal
 * address and pipes each connection to one backend. Health checks and TLS termination are not
 * rehearsed.
 */
import { connect, createServer, type Server } from 'node:net';

/** A listening forwarder; `close()` stops it and drops open connections. */
export interface Forwarder {
  readonly port: number;
  close(): Promise<void>;
}

/** Forwards `listenHost:listenPort` to `targetHost:targetPort`. Rejects if the port is taken. */
export function forward(
  listenHost: string,
  listenPort: number,
  targetHost: string,
  targetPort: number,
): Promise<Forwarder> {
  const sockets = new Set<import('node:net').Socket>();
  const server: Server = createServer((client) => {
    const upstream = connect({ host: targetHost, port: targetPort });
    sockets.add(client).add(upstream);
    const done = () => {
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    client.on('error', done).on('close', done);
    upstream.on('error', done).on('close', done);
    client.pipe(upstream).pipe(client);
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(listenPort, listenHost, () =>
      resolve({
        port: listenPort,
        close: () =>
          new Promise<void>((r) => {
            for (const s of sockets) s.destroy();
            server.close(() => r());
          }),
      }),
    );
  });
}
