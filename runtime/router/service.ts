/**
 * The router service: config → logger → Redis → verify key (and TLS material) → app → listen.
 * `close()` stops accepting, ends forwarded streams, closes upstream connections, disconnects.
 */
import { readFile } from 'node:fs/promises';
import type { Logger } from 'pino';
import { createLogger } from '../core/log-fields.ts';
import { redisConnection } from '../core/redis-connection.ts';
import { loadVerifyKey } from '../core/tokens.ts';
import { buildApp, createRouterDeps, type RouterDeps } from './app.ts';
import type { RouterConfig } from './config.ts';

/** A started router. */
export interface RunningRouter {
  /** `http://host:port`, or `https://…` with TLS. */
  url: string;
  deps: RouterDeps;
  close(signal?: string): Promise<void>;
}

/** Starts the router with `config` (and `log`, default a pino logger at `config.logLevel`). */
export async function startRouter(config: RouterConfig, opts: { log?: Logger } = {}): Promise<RunningRouter> {
  const log = opts.log ?? createLogger('router', config.logLevel);
  // a router that cannot reach Redis answers 503s instead of queueing requests without bound
  const redis = redisConnection(config.redisUrl, { lazyConnect: true, maxRetriesPerRequest: 2 });
  redis.on('error', (err) => log.warn({ err: err.message }, 'redis unreachable'));
  await redis.connect();
  const tls = config.tlsCertFile
    ? { cert: await readFile(config.tlsCertFile), key: await readFile(config.tlsKeyFile) }
    : undefined;
  const deps = createRouterDeps({
    config,
    log,
    redis,
    verifyKey: await loadVerifyKey(config.verifyKeyFile),
    ...(tls ? { tls } : {}),
  });
  const app = await buildApp(deps);
  await app.listen({ host: config.host, port: config.port });
  const port = (app.server.address() as { port: number }).port;
  const url = `${tls ? 'https' : 'http'}://${config.host}:${port}`;
  log.info({ url, protocols: tls ? 'h2,http/1.1' : 'http/1.1' }, 'router listening');

  let closing: Promise<void> | null = null;
  return {
    url,
    deps,
    close(signal = 'close') {
      closing ??= (async () => {
        log.info({ signal }, 'router stopping');
        await app.close();
        await deps.proxy.dispatcher.destroy();
        redis.disconnect();
        log.info('router stopped');
      })();
      return closing;
    },
  };
}
