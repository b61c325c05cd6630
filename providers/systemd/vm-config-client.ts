/**
 * What the `space:VmConfig` dynamic resource does when it runs (loaded by the provider in
 * `vm-config.ts` at run time, so the serialized provider captures no code and no secret): writes
 * the deployment's VM configuration through the API it deployed, `PUT /v1/deployment/vm-config`
 * with the deployment's own key (`space:bootstrapApiKey`, imported by the API from its SHA-256).
 */

/** The resource's inputs as the provider receives them (plain values). */
export interface VmConfigInputs {
  /** Base URL of the API as clients reach it (`https://<name>:8080`, the load balancer…). */
  readonly apiUrl: string;
  /**
   * Plain-HTTP URL of the same API (the control VM's public address), tried only when `apiUrl` is
   * HTTPS and cannot be reached *and* no write over HTTPS has succeeded yet: the one way to hand
   * a VM the TLS settings it does not have yet. Absent: never.
   */
  readonly plainApiUrl?: string;
  /** The deployment's API key (secret). */
  readonly apiKey: string;
  /** Env of every VM service (`space-api`, `space-agent@<pool>`, …). */
  readonly services: Record<string, Record<string, string>>;
  /**
   * The SPACE version VMs should run (`space:version`): written to
   * `PUT /v1/deployment/target-version` after the configuration, so a version bump in `pulumi up`
   * upgrades VMs in place (each VM's `space-version-sync`). Absent: the target is left as it is.
   */
  readonly version?: string;
  /** How long to wait for the API to answer (a new control VM boots, pulls, starts), s. Default 1200. */
  readonly timeoutSec?: number;
}

/** What the resource keeps in its state (never the key). */
export interface VmConfigOutputs {
  readonly apiUrl: string;
  readonly services: Record<string, Record<string, string>>;
  /** The target version written, when one was. */
  readonly version?: string;
  /** True once a write went over `apiUrl` as HTTPS: from then on `plainApiUrl` is never used. */
  readonly httpsConfirmed: boolean;
}

/** How a write may fail. */
export class VmConfigError extends Error {
  override readonly name = 'VmConfigError';
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** An answer worth waiting out: the API or its load balancer is not up yet. */
const RETRYABLE_STATUS = new Set([502, 503, 504]);

/**
 * Writes `services` with one PUT, retrying every `retryMs` (default 5 s) while the API cannot be
 * reached or answers 502/503/504 (a VM still booting behind its load balancer), until
 * `timeoutSec` (an API too old to have the route answers 404: that fails at once). With `allowPlain` and a `plainApiUrl`, an unreachable `apiUrl` (TLS not set up yet)
 * is followed by a try over plain HTTP. Returns the outputs to keep.
 * @throws VmConfigError on any other answer (401: the key is unknown to the API; 403: it lacks
 * `deployment:admin`; 400: a value the API refuses), or at the timeout with the last failure.
 */
export async function writeVmConfig(
  i: VmConfigInputs,
  opts: { allowPlain: boolean; retryMs?: number; fetch?: typeof fetch } = { allowPlain: false },
): Promise<VmConfigOutputs> {
  const f = opts.fetch ?? fetch;
  const deadline = Date.now() + (i.timeoutSec ?? 1200) * 1000;
  const https = i.apiUrl.startsWith('https:');
  const urls = [i.apiUrl, ...(opts.allowPlain && https && i.plainApiUrl ? [i.plainApiUrl] : [])];
  let last = '';
  for (;;) {
    for (const base of urls) {
      let res: Response;
      const put = (path: string, body: unknown) =>
        f(`${base.replace(/\/$/, '')}${path}`, {
          method: 'PUT',
          headers: { authorization: `Bearer ${i.apiKey}`, 'content-type': 'application/json' },
          body: JSON.stringify(body),
          signal: AbortSignal.timeout(30_000),
        });
      try {
        res = await put('/v1/deployment/vm-config', { services: i.services });
        // the configuration first: a VM that moves to the new version restarts with it
        if (res.ok && i.version !== undefined) {
          await res.text();
          res = await put('/v1/deployment/target-version', { version: i.version });
        }
      } catch (err) {
        const cause = (err as { cause?: { code?: string; message?: string } }).cause;
        last = `${base}: ${cause?.code ?? cause?.message ?? (err as Error).message}`;
        continue;
      }
      const text = await res.text();
      if (res.ok) {
        return {
          apiUrl: i.apiUrl,
          services: i.services,
          ...(i.version === undefined ? {} : { version: i.version }),
          httpsConfirmed: https && base === i.apiUrl,
        };
      }
      last = `${base}: HTTP ${res.status} ${text.slice(0, 300)}`;
      if (!RETRYABLE_STATUS.has(res.status)) {
        throw new VmConfigError(
          `writing the VM configuration failed (${last})${res.status === 401 ? ': the API does not know space:bootstrapApiKey (was it changed after the control VM was made, or revoked?)' : ''}`,
        );
      }
    }
    if (Date.now() >= deadline) {
      throw new VmConfigError(`the API did not take the VM configuration before the timeout (last: ${last})`);
    }
    await sleep(opts.retryMs ?? 5000);
  }
}
