/**
 * How every service reaches the state of record: one parser for `SPACE_REDIS_URL` and one factory
 * for the ioredis client, so the API, the agent, the router, the gateway and the tools all follow
 * a failover the same way.
 *
 * Accepted forms:
 * - `redis://[[user]:password@]host[:port][/db]` and `rediss://…` (TLS): one Redis server.
 * - `/absolute/path.sock`: one Redis server's Unix socket (`space up` uses it on one machine).
 * - `redis-sentinel://[[user]:password@]host[:port][,host[:port]…]/<primary name>[/db]` with an
 *   optional `?sentinelPassword=…`: the primary that Redis Sentinel names (port default 26379).
 *   The password is the data servers'. The sentinels use the same password unless
 *   `sentinelPassword` is given. An empty `sentinelPassword=` means the sentinels have none.
 *   There is no standard URL for Sentinel; the scheme name matches what Redis clients in other
 *   languages (e.g. redis-py's `redis+sentinel`, Spring's `redis-sentinel`) use for the same idea.
 *
 * Failover (Sentinel, https://redis.io/docs/latest/operate/oss_and_stack/management/sentinel/):
 * the client asks the sentinels for the primary at every (re)connect and checks its role. It also
 * listens for `+switch-master` (`failoverDetector`) and reconnects when the sentinels promote
 * another server. A command answered `READONLY` (we still hold a demoted primary, e.g. one that
 * was partitioned away and came back as a replica) makes it reconnect and resend that command.
 *
 * ioredis (v5) can give a Sentinel client up for good during a failover: when its failover
 * detector closes the connection while a reconnect is still asking the sentinels for the primary,
 * that connect attempt fails with "Connection is closed." and the client ends (status `end`), never
 * to reconnect; every later command fails at once. The failover suite saw the node agent stay cut
 * off that way after a kill -9 of the primary, its heartbeats failing until it was restarted. A
 * client made here therefore connects again when it ends without its owner closing it
 * (`disconnect()`/`quit()`), and so do its `duplicate()`s.
 */
import { Redis, type RedisOptions } from 'ioredis';

/** Where Redis is, parsed from `SPACE_REDIS_URL`. */
export type RedisEndpoint =
  | { kind: 'direct'; url: string }
  | { kind: 'socket'; path: string }
  | {
      kind: 'sentinel';
      /** The sentinels, in the order given. */
      sentinels: { host: string; port: number }[];
      /** The primary's name in the sentinels' configuration (`sentinel monitor <name> …`). */
      primaryName: string;
      username?: string;
      password?: string;
      /** The sentinels' own password (defaults to `password`; `null`: none). */
      sentinelPassword?: string | null;
      /** Database number, default 0. */
      db: number;
    };

/** The scheme of the Sentinel form. */
export const SENTINEL_SCHEME = 'redis-sentinel:';
const SENTINEL_DEFAULT_PORT = 26379;

/**
 * Parses a `SPACE_REDIS_URL` value (forms in the module's comment).
 * Throws an `Error` naming the fault for a malformed value (no host, a bad port, no primary name).
 */
export function parseRedisUrl(value: string): RedisEndpoint {
  if (value.startsWith('/')) return { kind: 'socket', path: value };
  if (!value.startsWith(SENTINEL_SCHEME)) {
    const u = safeUrl(value);
    if (u.protocol !== 'redis:' && u.protocol !== 'rediss:')
      throw new Error(
        `Redis URL must start with redis://, rediss://, redis-sentinel:// or /, got ${u.protocol}`,
      );
    return { kind: 'direct', url: value };
  }
  // URL() keeps only one host, so the host list is split off by hand before the rest is parsed
  const rest = value.slice(SENTINEL_SCHEME.length).replace(/^\/\//, '');
  const at = rest.lastIndexOf('@', rest.indexOf('/') === -1 ? rest.length : rest.indexOf('/'));
  const auth = at === -1 ? '' : rest.slice(0, at);
  const afterAuth = at === -1 ? rest : rest.slice(at + 1);
  const slash = afterAuth.indexOf('/');
  if (slash === -1)
    throw new Error('Sentinel URL needs the primary name: redis-sentinel://host:26379/<name>');
  const hostList = afterAuth.slice(0, slash);
  const tail = safeUrl(`redis://placeholder${afterAuth.slice(slash)}`);
  const [name, dbText, ...extra] = tail.pathname.slice(1).split('/');
  if (!name) throw new Error('Sentinel URL needs the primary name: redis-sentinel://host:26379/<name>');
  if (extra.length > 0 || (dbText !== undefined && !/^[0-9]+$/.test(dbText)))
    throw new Error(`Sentinel URL path must be /<name>[/<db>], got ${tail.pathname}`);
  const sentinels = hostList.split(',').map((h) => parseHostPort(h.trim()));
  if (sentinels.length === 0 || hostList.trim() === '') throw new Error('Sentinel URL names no sentinel');
  const [user, ...pw] = auth.split(':');
  const endpoint: RedisEndpoint = {
    kind: 'sentinel',
    sentinels,
    primaryName: decodeURIComponent(name),
    db: dbText === undefined ? 0 : Number(dbText),
  };
  if (user) endpoint.username = decodeURIComponent(user);
  if (pw.length > 0) endpoint.password = decodeURIComponent(pw.join(':'));
  const sp = tail.searchParams.get('sentinelPassword');
  if (sp !== null) endpoint.sentinelPassword = sp === '' ? null : sp;
  return endpoint;
}

/**
 * The password the sentinels of `e` take: `sentinelPassword` when the URL gives one (none when it
 * gives it empty), else the data servers' password; undefined for none.
 */
export function sentinelPasswordOf(e: Extract<RedisEndpoint, { kind: 'sentinel' }>): string | undefined {
  return e.sentinelPassword === undefined ? e.password : (e.sentinelPassword ?? undefined);
}

/** `url` without its password, for logs and errors. */
export function redactRedisUrl(url: string): string {
  return url.replace(/(\/\/[^/@]*?:)[^@/]*@/, '$1***@').replace(/(sentinelPassword=)[^&]*/, '$1***');
}

/**
 * The ioredis client for `url` with the caller's `options` (retries, lazy connect). Sentinel URLs
 * get the failover behaviour described above. `client.duplicate()` keeps all of it.
 * Throws as `parseRedisUrl` does.
 */
export function redisConnection(url: string, options: RedisOptions = {}): Redis {
  const endpoint = parseRedisUrl(url);
  const readonlyReconnect: RedisOptions['reconnectOnError'] = (err) =>
    err.message.startsWith('READONLY') ? 2 : false;
  switch (endpoint.kind) {
    case 'socket':
      return new Redis({ ...options, path: endpoint.path });
    case 'direct':
      return new Redis(endpoint.url, { reconnectOnError: readonlyReconnect, ...options });
    case 'sentinel': {
      const sentinelPassword = sentinelPasswordOf(endpoint);
      return reconnectingAfterEnd(
        new Redis({
          reconnectOnError: readonlyReconnect,
          ...options,
          sentinels: endpoint.sentinels,
          name: endpoint.primaryName,
          role: 'master',
          db: endpoint.db,
          failoverDetector: true,
          ...(endpoint.username ? { username: endpoint.username } : {}),
          ...(endpoint.password ? { password: endpoint.password } : {}),
          ...(sentinelPassword ? { sentinelPassword } : {}),
        }),
      );
    }
  }
}

/** Delay before a client that ended on its own connects again, ms. */
const REVIVE_AFTER_MS = 250;

/**
 * `client`, made to connect again whenever it ends (`end` event) without `disconnect()` or
 * `quit()` having been called on it; its duplicates get the same. Returns `client`.
 */
function reconnectingAfterEnd(client: Redis): Redis {
  let closedByOwner = false;
  const disconnect = client.disconnect.bind(client);
  client.disconnect = (reconnect?: boolean) => {
    if (!reconnect) closedByOwner = true;
    disconnect(reconnect);
  };
  const quit = client.quit.bind(client);
  client.quit = ((...args: Parameters<Redis['quit']>) => {
    closedByOwner = true;
    return quit(...args);
  }) as Redis['quit'];
  const duplicate = client.duplicate.bind(client);
  client.duplicate = ((...args: Parameters<Redis['duplicate']>) =>
    reconnectingAfterEnd(duplicate(...args))) as Redis['duplicate'];
  client.on('end', () => {
    if (closedByOwner) return;
    setTimeout(() => {
      if (!closedByOwner && client.status === 'end') client.connect().catch(() => {});
    }, REVIVE_AFTER_MS).unref();
  });
  return client;
}

function safeUrl(value: string): URL {
  try {
    return new URL(value);
  } catch {
    throw new Error(`not a Redis URL: ${redactRedisUrl(value)}`);
  }
}

function parseHostPort(text: string): { host: string; port: number } {
  const m = /^(\[[0-9a-fA-F:.]+\]|[^:[\]]+)(?::([0-9]+))?$/.exec(text);
  if (!m) throw new Error(`Sentinel URL: bad sentinel address "${text}" (want host[:port])`);
  const port = m[2] === undefined ? SENTINEL_DEFAULT_PORT : Number(m[2]);
  if (port < 1 || port > 65535) throw new Error(`Sentinel URL: port out of range in "${text}"`);
  return { host: m[1]!.replace(/^\[|\]$/g, ''), port };
}
