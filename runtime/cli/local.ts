/**
 * Where the local stack keeps its things (`$SPACE_HOME`, default `~/.space`) and how the CLI finds
 * the API endpoint and key without flags.
 *
 * ```
 * $SPACE_HOME/               0700
 *   api-key                  the bootstrap API key (0600, written by the API on first start)
 *   signing-key.pem          Ed25519 private key that signs tokens (0600)
 *   verify-key.pem           its public key (agents verify tokens with it)
 *   local.json               { apiUrl, agentUrl, routerUrl?, redisUrl, apiKeyFile, pid, startedAt } of `space up`
 *   logs/{api,router,agent,gateway,redis}.log
 *   redis/                   Redis data dir (append-only file: operations survive restarts)
 * ```
 * Endpoint: `--api-url` > `SPACE_API_URL` > `local.json` apiUrl > http://127.0.0.1:8080.
 * Key: `--api-key` > `SPACE_API_KEY` > `$SPACE_HOME/api-key`.
 */
import { readFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join, resolve } from 'node:path';
import { CliError } from './output.ts';

export const DEFAULT_API_URL = 'http://127.0.0.1:8080';

/** `$SPACE_HOME`, or `~/.space`. */
export function spaceHome(env: NodeJS.ProcessEnv = process.env): string {
  return resolve(env['SPACE_HOME'] || join(homedir(), '.space'));
}

/** The files under `home`. Pure. */
export function localPaths(home: string) {
  return {
    home,
    apiKey: join(home, 'api-key'),
    signingKey: join(home, 'signing-key.pem'),
    verifyKey: join(home, 'verify-key.pem'),
    localJson: join(home, 'local.json'),
    logs: join(home, 'logs'),
    redisDir: join(home, 'redis'),
  };
}

/** What `space up` writes to `local.json`. */
export interface LocalState {
  apiUrl: string;
  agentUrl?: string;
  /** The router's URL (absent with --no-router). */
  routerUrl?: string;
  redisUrl?: string;
  apiKeyFile?: string;
  pid?: number;
  startedAt?: string;
}

/** Contents of `local.json`, or null when absent or unreadable. */
export function readLocalState(home: string): LocalState | null {
  try {
    const v = JSON.parse(readFileSync(localPaths(home).localJson, 'utf8')) as LocalState;
    return typeof v?.apiUrl === 'string' ? v : null;
  } catch {
    return null;
  }
}

export interface Endpoint {
  apiUrl: string;
  apiKey: string;
  /** Where each came from, for error messages. */
  source: { apiUrl: string; apiKey: string };
}

/**
 * Finds the API URL and key: flags, then environment, then the files `space up` writes.
 * @throws CliError NO_API_KEY when no key can be found.
 */
export function resolveEndpoint(
  flags: { apiUrl?: string; apiKey?: string },
  env: NodeJS.ProcessEnv = process.env,
): Endpoint {
  const home = spaceHome(env);
  let apiUrl: string;
  let urlSource: string;
  if (flags.apiUrl) [apiUrl, urlSource] = [flags.apiUrl, '--api-url'];
  else if (env['SPACE_API_URL']) [apiUrl, urlSource] = [env['SPACE_API_URL'], 'SPACE_API_URL'];
  else {
    const local = readLocalState(home);
    if (local) [apiUrl, urlSource] = [local.apiUrl, localPaths(home).localJson];
    else [apiUrl, urlSource] = [DEFAULT_API_URL, 'default'];
  }
  let apiKey: string | undefined;
  let keySource = '';
  if (flags.apiKey) [apiKey, keySource] = [flags.apiKey, '--api-key'];
  else if (env['SPACE_API_KEY']) [apiKey, keySource] = [env['SPACE_API_KEY'], 'SPACE_API_KEY'];
  else {
    const file = localPaths(home).apiKey;
    try {
      apiKey = readFileSync(file, 'utf8').trim() || undefined;
      keySource = file;
    } catch {
      apiKey = undefined;
    }
  }
  if (!apiKey) {
    throw new CliError('NO_API_KEY', 'no API key found', {
      hint: `pass --api-key, set SPACE_API_KEY, or start the local stack with \`space up\` (it writes ${localPaths(home).apiKey})`,
    });
  }
  return { apiUrl: apiUrl.replace(/\/+$/, ''), apiKey, source: { apiUrl: urlSource, apiKey: keySource } };
}
