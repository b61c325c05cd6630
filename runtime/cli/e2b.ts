/**
 * `space e2b env`: the environment that points the official `e2b` SDK at this SPACE, so that
 * `eval "$(space e2b env)"` is the whole migration (docs/e2b.md; the SDK reads E2B_API_URL for
 * the control plane, E2B_SANDBOX_URL for every envd call, E2B_API_KEY as its `X-API-KEY`: its
 * connection config, https://github.com/e2b-dev/E2B/blob/main/packages/js-sdk/src/connectionConfig.ts).
 */
import type { Command } from 'commander';
import { globals, isJson } from './context.ts';
import { readLocalState, resolveEndpoint, spaceHome } from './local.ts';
import { CliError, printJson, println } from './output.ts';

/** The E2B variables for a SPACE API, router and key. */
export interface E2bEnv {
  E2B_API_URL: string;
  E2B_SANDBOX_URL: string;
  E2B_API_KEY: string;
  /**
   * The domain of `getHost(port)` = `<port>-<id>.<E2B_DOMAIN>`, the router's host form for servers
   * in sandboxes (docs/e2b.md). Only when known: a loopback router's is `localhost:<its port>`
   * (browsers and curl resolve `*.localhost` to loopback, RFC 6761 §6.3); a deployment's is the
   * wildcard name it was given (`--domain`).
   */
  E2B_DOMAIN?: string;
  /**
   * `false` when the key is not shaped `e2b_<hex>`: SDK 2.45 checks that shape client-side
   * unless told not to (2.51 does not check).
   */
  E2B_VALIDATE_API_KEY?: 'false';
}

/** Hosts of a router on this machine. */
const LOOPBACK = new Set(['127.0.0.1', 'localhost', '[::1]']);

/**
 * The variables for `apiUrl`, `sandboxUrl` (the router), `apiKey` and, when given, the sandbox
 * `domain` (else derived for a loopback router, else none). Pure.
 */
export function e2bEnv(apiUrl: string, sandboxUrl: string, apiKey: string, domain?: string): E2bEnv {
  const router = new URL(sandboxUrl);
  const local = LOOPBACK.has(router.hostname)
    ? `localhost${router.port ? `:${router.port}` : ''}`
    : undefined;
  const sandboxDomain = domain ?? local;
  return {
    E2B_API_URL: apiUrl,
    // origin only: the SDK builds `new URL('/files', base)`, which drops any path
    E2B_SANDBOX_URL: router.origin,
    E2B_API_KEY: apiKey,
    ...(sandboxDomain ? { E2B_DOMAIN: sandboxDomain } : {}),
    ...(/^e2b_[0-9a-f]+$/.test(apiKey) ? {} : { E2B_VALIDATE_API_KEY: 'false' as const }),
  };
}

/** `export K='v'` lines for a POSIX shell (single quotes, `'` escaped). Pure. */
export function shellExports(env: object): string {
  return Object.entries(env)
    .map(([k, v]) => `export ${k}='${String(v).replaceAll("'", "'\\''")}'`)
    .join('\n');
}

export function registerE2b(program: Command): void {
  const e2b = program.command('e2b').description('the E2B SDK against this SPACE');
  e2b
    .command('env')
    .description('print the variables that point the e2b SDK at this SPACE: eval "$(space e2b env)"')
    .option('--sandbox-url <url>', 'the router (default: SPACE_ROUTER_URL, else the local stack’s)')
    .option(
      '--domain <domain>',
      'E2B_DOMAIN: the name whose subdomains <port>-<id>.<domain> reach the router (default for a local router: localhost:<its port>)',
    )
    .action((opts: { sandboxUrl?: string; domain?: string }, cmd: Command) => {
      const g = globals(cmd);
      const endpoint = resolveEndpoint({ apiUrl: g.apiUrl, apiKey: g.apiKey });
      const sandboxUrl =
        opts.sandboxUrl ?? process.env['SPACE_ROUTER_URL'] ?? readLocalState(spaceHome())?.routerUrl;
      if (!sandboxUrl) {
        throw new CliError('NO_ROUTER', 'no router URL for E2B_SANDBOX_URL', {
          hint: 'pass --sandbox-url, set SPACE_ROUTER_URL, or run `space up` with its router',
        });
      }
      const env = e2bEnv(endpoint.apiUrl, sandboxUrl, endpoint.apiKey, opts.domain);
      if (isJson(cmd)) printJson(env);
      else println(shellExports(env));
    });
}
