/**
 * The API service: config → logger → Redis → signing key → app + operation worker + reaper →
 * listen. `close()` stops taking requests and operations, finishes in-flight ones, disconnects.
 */
import { readFile } from 'node:fs/promises';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { createLogger } from '../core/log-fields.ts';
import { redisConnection } from '../core/redis-connection.ts';
import { DEFAULT_TEAM } from '../core/tenancy.ts';
import { loadSigningKey } from '../core/tokens.ts';
import { bootstrapApiKeyFile, importBootstrapKey } from './api-keys.ts';
import { buildApp, createApiDeps, createApiRuntime } from './app.ts';
import type { ApiConfig } from './config.ts';

/** A started API. */
export interface RunningApi {
  url: string;
  close(signal?: string): Promise<void>;
}

/**
 * Starts the API: makes the default team if missing and migrates API keys from before teams into
 * it. With `bootstrapKeyFile`, a first API key (an admin of the default team: every scope) is
 * created and written there (0600) unless that file exists. With `SPACE_BOOTSTRAP_API_KEY_SHA256`
 * the key the deployment made is imported (once; see `importBootstrapKey`).
 */
export async function startApi(
  config: ApiConfig,
  opts: { bootstrapKeyFile?: string } = {},
): Promise<RunningApi> {
  const log = createLogger('api', config.logLevel);
  const redis = watchConnection(
    // named, so `space backup restore` can see a running API (CLIENT LIST) and refuse
    redisConnection(config.redisUrl, {
      lazyConnect: true,
      maxRetriesPerRequest: 3,
      connectionName: 'space-api',
    }),
    log,
    'main',
  );
  await redis.connect();
  const deps = createApiDeps({
    config,
    log,
    redis,
    subscriber: watchConnection(redis.duplicate(), log, 'subscriber'),
    signingKey: await loadSigningKey(config.signingKeyFile),
  });
  // the default team owns everything made before teams; keys from then join it with every scope
  await deps.teams.ensure(DEFAULT_TEAM);
  const migrated = await deps.apiKeys.migrateLegacyKeys();
  if (migrated > 0) log.info({ keys: migrated, team: DEFAULT_TEAM }, 'api keys from before teams migrated');
  const indexed = await deps.sandboxes.indexTeams();
  if (indexed.teamIndex + indexed.liveIndex > 0) {
    log.info(
      { sandboxes: indexed.teamIndex, live: indexed.liveIndex },
      'sandboxes added to their teams’ indexes',
    );
  }
  if (opts.bootstrapKeyFile && (await bootstrapApiKeyFile(deps.apiKeys, opts.bootstrapKeyFile))) {
    log.info({ file: opts.bootstrapKeyFile, team: DEFAULT_TEAM }, 'api key created');
  }
  if (config.bootstrapKeySha256 && (await importBootstrapKey(redis, config.bootstrapKeySha256))) {
    log.info({ team: DEFAULT_TEAM }, 'deployment api key imported');
  }
  const tls = config.tlsCertFile
    ? { cert: await readFile(config.tlsCertFile), key: await readFile(config.tlsKeyFile) }
    : undefined;
  const app = await buildApp(deps, tls ? { tls } : {});
  const runtime = createApiRuntime(deps, watchConnection(redis.duplicate(), log, 'worker'));
  await runtime.start();
  await app.listen({ host: config.host, port: config.port });
  const port = (app.server.address() as { port: number }).port;

  let closing: Promise<void> | null = null;
  return {
    url: `${tls ? 'https' : 'http'}://${config.host}:${port}`,
    close(signal = 'close') {
      closing ??= (async () => {
        log.info({ signal }, 'api stopping');
        await app.close();
        await runtime.stop();
        redis.disconnect();
        log.info('api stopped');
      })();
      return closing;
    },
  };
}

/**
 * Logs a Redis connection's outage once when it begins (`redis connection lost`, warn) and once
 * when it ends (`redis connection ready`), instead of ioredis's "Unhandled error event" with a
 * stack on stderr for every failed reconnect. Returns `conn`.
 */
function watchConnection(conn: Redis, log: Logger, role: string): Redis {
  let down = false;
  conn.on('error', (err: Error) => {
    if (down) return;
    down = true;
    log.warn({ redis: role, cause: String(err) }, 'redis connection lost');
  });
  conn.on('ready', () => {
    if (!down) return;
    down = false;
    log.info({ redis: role }, 'redis connection ready');
  });
  return conn;
}
