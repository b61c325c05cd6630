/**
 * The deployment's VM configuration as a typed document: what `PUT /v1/deployment/vm-config`
 * stores in Redis for each VM service (a JSON object of setting name → value, one field per service
 * of the hash `DEPLOY_VM_CONFIG_KEY`, redis-keys.ts), and how a VM turns it into a service's env file.
 *
 * Every node holds the Redis password (its agent and gateway use Redis), so whatever a VM reads
 * from there is untrusted input: written by the API, or by any compromised node. A VM therefore
 * writes an env file only from a document that passes its **policy** ({@link VmConfigPolicy}),
 * a root-owned file the deployment wrote at the VM's creation (user data), never from Redis:
 * - only the names the policy lists for that service: the settings the service itself declares
 *   and an operator may change (`tunable`), and the settings the deployment owns (`pinned`), which
 *   must keep the value the VM was created with (paths, ports, the driver, the key hash);
 * - so `NODE_OPTIONS`, `LD_PRELOAD`, `SPACE_REDIS_URL` or any unknown name is refused, and so is
 *   the whole document with it (nothing is half-applied);
 * - values are strings of printable characters on one line ({@link ENV_VALUE}), at most
 *   {@link VM_CONFIG_MAX_VALUE} characters, so no newline can smuggle in another variable.
 * The env file is rendered from the checked document alone ({@link renderEnvFile}).
 */
import { type Static, Type } from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';
import { ENV_NAME, ENV_VALUE, renderEnvFile, sortedNames } from './env-file.ts';
import { VM_SERVICE } from './redis-keys.ts';

/** Longest value a VM configuration setting may have, characters. */
export const VM_CONFIG_MAX_VALUE = 8192;

/**
 * OpenTelemetry's own environment variables (the OpenTelemetry specification's "Environment
 * Variable Specification": `OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_TRACES_SAMPLER`, …), which the
 * OpenTelemetry SDK reads rather than SPACE's settings tables: allowed by name for services that trace.
 */
export const OTEL_SETTING = /^OTEL_[A-Z0-9_]+$/;

/** One service of a VM as its policy describes it. */
export const VmServicePolicySchema = Type.Object(
  {
    /** Field in the hash `DEPLOY_VM_CONFIG_KEY`, e.g. `space-agent@default`. */
    service: Type.String({ pattern: VM_SERVICE.source }),
    /** Absolute path of its env file, e.g. `/etc/space/space-agent.env`. */
    file: Type.String({ pattern: '^/etc/space/[a-z0-9.@-]+\\.env$' }),
    /** The systemd unit restarted when the file changes. */
    unit: Type.String({ pattern: '^space-[a-z0-9-]+$' }),
    /** Names an operator may change through `pulumi up`. */
    tunable: Type.Array(Type.String({ pattern: ENV_NAME.source }), { maxItems: 512 }),
    /** The service traces: OpenTelemetry's `OTEL_*` variables ({@link OTEL_SETTING}) are tunable too. */
    otel: Type.Optional(Type.Boolean()),
    /** Names the deployment owns, with the value the VM was created with. */
    pinned: Type.Record(
      Type.String({ pattern: ENV_NAME.source }),
      Type.String({ pattern: ENV_VALUE.source }),
    ),
  },
  { additionalProperties: false },
);
/** A VM's policy: its services, in the order they are applied (TLS before the API; gateway before agent). */
export const VmConfigPolicySchema = Type.Object(
  { services: Type.Array(VmServicePolicySchema, { minItems: 1, maxItems: 16 }) },
  { additionalProperties: false },
);
export type VmServicePolicy = Static<typeof VmServicePolicySchema>;
export type VmConfigPolicy = Static<typeof VmConfigPolicySchema>;

/**
 * Checks a policy read from disk. Pure. @throws Error naming the first problem (a VM whose policy
 * is broken applies nothing).
 */
export function parseVmConfigPolicy(text: string): VmConfigPolicy {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch {
    throw new Error('vm-config policy: not JSON');
  }
  if (!Value.Check(VmConfigPolicySchema, doc)) {
    const e = Value.Errors(VmConfigPolicySchema, doc).First();
    throw new Error(`vm-config policy: ${e?.path || '/'} ${e?.message ?? 'is invalid'}`);
  }
  return doc;
}

/** The outcome of checking one service's document: its env file, or why it was refused. */
export type VmServiceEnvResult = { ok: true; env: string } | { ok: false; problems: string[] };

/**
 * Checks `text` (a service's field of the `DEPLOY_VM_CONFIG_KEY` hash: a JSON object of name → value)
 * against the service's policy and renders the env file from it: the document's tunable settings
 * plus every pinned one (at its pinned value). Pure. Every problem is listed; any problem refuses
 * the whole document.
 */
export function vmServiceEnv(policy: VmServicePolicy, text: string): VmServiceEnvResult {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch {
    return { ok: false, problems: [`${policy.service}: not a JSON document`] };
  }
  if (typeof doc !== 'object' || doc === null || Array.isArray(doc))
    return { ok: false, problems: [`${policy.service}: not a JSON object`] };
  const tunable = new Set(policy.tunable);
  const problems: string[] = [];
  for (const [name, value] of Object.entries(doc)) {
    const where = `${policy.service}.${JSON.stringify(name).slice(0, 80)}`;
    if (typeof value !== 'string') problems.push(`${where}: not a string`);
    else if (value.length > VM_CONFIG_MAX_VALUE)
      problems.push(`${where}: longer than ${VM_CONFIG_MAX_VALUE}`);
    else if (!ENV_VALUE.test(value)) problems.push(`${where}: holds a control character (a newline?)`);
    if (Object.hasOwn(policy.pinned, name)) {
      if (value !== policy.pinned[name]) problems.push(`${where}: set by the deployment; cannot change`);
    } else if (!tunable.has(name) && !(policy.otel && OTEL_SETTING.test(name) && ENV_NAME.test(name)))
      problems.push(`${where}: not a setting of ${policy.service}`);
  }
  if (problems.length) return { ok: false, problems };
  return { ok: true, env: renderEnvFile({ ...(doc as Record<string, string>), ...policy.pinned }) };
}

/**
 * A service's env as stored in the `DEPLOY_VM_CONFIG_KEY` hash: JSON with names in code-point order,
 * so the same settings are always the same bytes. Pure.
 */
export function vmServiceDocument(env: Readonly<Record<string, string>>): string {
  return JSON.stringify(Object.fromEntries(sortedNames(env).map((n) => [n, env[n]])));
}
