/** What every command reads from the global options: output mode and the API client. */
import type { Command } from 'commander';
import { ApiClient, DataPlane, type StreamGrant } from './client.ts';
import { resolveEndpoint } from './local.ts';

export interface GlobalOptions {
  json?: boolean;
  apiUrl?: string;
  apiKey?: string;
}

/** The global options as seen from `cmd` (a subcommand's action). */
export function globals(cmd: Command): GlobalOptions {
  return cmd.optsWithGlobals<GlobalOptions>();
}

/** True when `--json` was given anywhere on the command line. */
export function isJson(cmd: Command): boolean {
  return globals(cmd).json === true;
}

/** An API client for the endpoint found from flags, environment or `$SPACE_HOME`. */
export function apiClient(cmd: Command): ApiClient {
  const g = globals(cmd);
  return new ApiClient(resolveEndpoint({ apiUrl: g.apiUrl, apiKey: g.apiKey }));
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
