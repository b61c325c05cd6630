/** What every command reads from the global options: output mode and the API client. */
import type { Command } from 'commander';
import { ApiClient, DataPlane, type StreamGrant } from './client.ts';
import { resolveEndpoint } from './local.ts';

export interface GlobalOptions {
  json?: boolean;
  apiUrl?: string;
  apiKey?: string;
  /** `--retry-for`: how long API calls wait out retryable refusals, s. */
  retryFor?: number;
}

/** How long API calls wait out retryable refusals by default, s (`--retry-for`). */
export const DEFAULT_RETRY_FOR_SEC = 60;

/** The global options as seen from `cmd` (a subcommand's action). */
export function globals(cmd: Command): GlobalOptions {
  return cmd.optsWithGlobals<GlobalOptions>();
}

/** True when `--json` was given anywhere on the command line. */
export function isJson(cmd: Command): boolean {
  return globals(cmd).json === true;
}

/** How long retryable refusals and dropped event streams are waited out (`--retry-for`), ms. */
export function retryForMs(cmd: Command): number {
  return (globals(cmd).retryFor ?? DEFAULT_RETRY_FOR_SEC) * 1000;
}

/** An API client for the endpoint found from flags, environment or `$SPACE_HOME`. */
export function apiClient(cmd: Command): ApiClient {
  const g = globals(cmd);
  const json = g.json === true;
  return new ApiClient(resolveEndpoint({ apiUrl: g.apiUrl, apiKey: g.apiKey }), {
    forMs: retryForMs(cmd),
    // on stderr, so stdout keeps only the answer: a line of JSON with --json, a sentence otherwise
    onWait(err, waitMs, leftMs) {
      const line = json
        ? JSON.stringify({ waiting: { code: err.code, message: err.message, retryInMs: waitMs, leftMs } })
        : `waiting: ${err.code}: ${err.message} (asking again in ${(waitMs / 1000).toFixed(1)} s; ` +
          `giving up in ${Math.ceil(leftMs / 1000)} s)`;
      process.stderr.write(`${line}\n`);
    },
  });
}

/** A data-plane client for sandbox `id` with a fresh session token of `scopes`. */
export async function dataPlane(
  api: ApiClient,
  id: string,
  scopes: ('commands' | 'files')[],
): Promise<DataPlane> {
  const grant = await api.json<StreamGrant>('POST', `/v1/sandboxes/${encodeURIComponent(id)}/tokens`, {
    body: { scopes },
  });
  return new DataPlane(grant.url, grant.token);
}
