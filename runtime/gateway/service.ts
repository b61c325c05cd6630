/**
 * The gateway service: config → logger → deps → servers → listen (DNS udp+tcp, HTTP, TLS on
 * `bindHost`; control API on a 0600 Unix socket; optional metrics on `metricsHost`, 127.0.0.1 by default). `close()` stops
 * accepting, closes every proxied connection and removes the socket.
 */
import { mkdir, readFile, rm } from 'node:fs/promises';
import { createServer as createHttpServer, type Server as HttpServer } from 'node:http';
import type { Server } from 'node:net';
import { dirname } from 'node:path';
import type { Logger } from 'pino';
import { createLogger } from '../core/log-fields.ts';
import { redisConnection } from '../core/redis-connection.ts';
import { buildGateway, createGatewayDeps, type GatewayDeps } from './app.ts';
import { loadOrCreateCa } from './ca.ts';
import type { GatewayConfig } from './config.ts';
import { redisCredentialSource } from './credential-source.ts';
import { UnpackPool } from './unpack-pool.ts';

/** A started gateway: the ports it bound (useful with port 0) and `close()`. */
export interface RunningGateway {
  readonly dnsPort: number;
  readonly httpPort: number;
  readonly tlsPort: number;
  /** 0 when not enabled. */
  readonly metricsPort: number;
  readonly controlSocket: string;
  readonly deps: GatewayDeps;
  close(signal?: string): Promise<void>;
}

function listenTcp(server: Server, port: number, host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve((server.address() as { port: number }).port);
    });
  });
}

/** Starts the gateway with `config` (and `log`, default a pino logger at `config.logLevel`). */
export async function startGateway(
  config: GatewayConfig,
  opts: { log?: Logger } = {},
): Promise<RunningGateway> {
  const log = opts.log ?? createLogger('gateway', config.logLevel);
  const ca = await loadOrCreateCa(config.caCertFile, config.caKeyFile);
  const upstreamCa = config.upstreamCaFile ? [await readFile(config.upstreamCaFile)] : [];
  // credential values are read from the state of record when a request needs them (never kept)
  const redis = redisConnection(config.redisUrl, {
    lazyConnect: true,
    maxRetriesPerRequest: 1,
    enableOfflineQueue: false,
  });
  redis.on('error', (err) => log.warn({ err: err.message }, 'credential store unreachable'));
  const credentials = redisCredentialSource(redis, { ttlMs: config.credentialCacheMs });
  const unpack = new UnpackPool({
    workers: config.unpackWorkers,
    timeoutMs: config.unpackTimeoutMs,
    maxUnpackedBytes: config.maxUnpackedBytes,
  });
  const deps = createGatewayDeps(config, log, { ca, upstreamCa, credentials, unpack });
  await deps.denySet.start();
  await redis
    .connect()
    .catch((err: unknown) =>
      log.warn(
        { err },
        'credential store unreachable at start; credential requests are refused until it answers',
      ),
    );
  const servers = await buildGateway(deps);

  const dnsPort = await servers.dns.listen(config.bindHost, config.dnsPort);
  const httpPort = await listenTcp(servers.http, config.httpPort, config.bindHost);
  const tlsPort = await listenTcp(servers.tls, config.tlsPort, config.bindHost);

  await mkdir(dirname(config.controlSocket), { recursive: true, mode: 0o700 });
  await rm(config.controlSocket, { force: true }); // a stale socket of a previous run
  // the umask makes the socket 0600 from its creation: there is no window where others can connect
  const umask = process.umask(0o177);
  try {
    await servers.control.listen({ path: config.controlSocket });
  } finally {
    process.umask(umask);
  }

  let metricsServer: HttpServer | null = null;
  let metricsPort = 0;
  if (config.metricsPort !== 0) {
    const registry = deps.audit.metrics.registry;
    metricsServer = createHttpServer((req, res) => {
      if (req.url !== '/metrics') {
        res.writeHead(404).end();
        return;
      }
      void registry
        .metrics()
        .then((text) => res.writeHead(200, { 'content-type': registry.contentType }).end(text));
    });
    metricsPort = await listenTcp(metricsServer, config.metricsPort, config.metricsHost);
  }
  log.info(
    { dnsPort, httpPort, tlsPort, metricsPort, controlSocket: config.controlSocket },
    'gateway listening',
  );

  let closing: Promise<void> | null = null;
  return {
    dnsPort,
    httpPort,
    tlsPort,
    metricsPort,
    controlSocket: config.controlSocket,
    deps,
    close(signal = 'close') {
      closing ??= (async () => {
        log.info({ signal }, 'gateway stopping');
        const closeServer = (s: Server | HttpServer) =>
          new Promise<void>((resolve) => s.close(() => resolve()));
        const stopped = Promise.all([
          closeServer(servers.http),
          closeServer(servers.tls),
          servers.dns.close(),
        ]);
        deps.registry.closeAll();
        servers.http.closeAllConnections();
        await stopped;
        await servers.control.close();
        if (metricsServer) await closeServer(metricsServer);
        await rm(config.controlSocket, { force: true });
        deps.denySet.stop();
        await unpack.close();
        redis.disconnect();
        log.info('gateway stopped');
      })();
      return closing;
    },
  };
}
