/**
 * Test support for Pulumi's mock runtime: records every resource the program registers (type,
 * name, inputs with secrets still wrapped), gives cloud resources plausible outputs, and walks
 * inputs for policies (a secret's plaintext outside a secret, a Kubernetes object's schema).
 * No Pulumi CLI, no plugin, no network.
 */
import * as pulumi from '@pulumi/pulumi';

/** Pulumi's wire marker of a secret value (`specialSigKey` / `specialSecretSig` in
 * https://github.com/pulumi/pulumi/blob/master/sdk/nodejs/runtime/rpc.ts). */
const SIG_KEY = '4dabf18193072939515e22adb298388d';
const SECRET_SIG = '1b47061264138c4ac30d75fd1eb44270';

/** One resource as the mock monitor saw it. */
export interface RecordedResource {
  readonly type: string;
  readonly name: string;
  /** Inputs as sent: a secret appears as `{ [SIG_KEY]: SECRET_SIG, value }`. */
  readonly inputs: Record<string, unknown>;
  /** The URN the mock engine gave it (empty for a read). */
  readonly urn: string;
  /** The parent's URN (empty: no parent, i.e. the stack). */
  readonly parent: string;
  /** Its aliases as registered: URNs, or specs (`noParent`: it had none; `parentUrn`: that one). */
  readonly aliases: readonly RecordedAlias[];
  /** URNs it was registered to depend on (`dependsOn`, and its inputs' resources). */
  readonly dependencies?: readonly string[];
  /** Its `customTimeouts` as registered (empty strings: the provider's default). */
  readonly customTimeouts?: { readonly create: string; readonly update: string; readonly delete: string };
}

/** One registered alias (Pulumi `Alias`; empty strings mean "the resource's current value"). */
export type RecordedAlias =
  | { readonly urn: string }
  | {
      readonly name: string;
      readonly type: string;
      readonly noParent: boolean;
      readonly parentUrn: string;
    };

/** The mock monitor's `registerResource` request, the getters read here. */
interface RegisterRequest {
  getType(): string;
  getName(): string;
  getParent(): string;
  getDependenciesList(): string[];
  getCustomtimeouts(): { getCreate(): string; getUpdate(): string; getDelete(): string } | undefined;
  getAliasesList(): {
    hasSpec(): boolean;
    getUrn(): string;
    getSpec(): {
      getName(): string;
      getType(): string;
      getNoparent(): boolean;
      getParenturn(): string;
    };
  }[];
}

/** The URN Pulumi gives `type`/`name` under `parent` (the engine's rule; the mock's `newUrn`). */
export function urnOf(parent: string, type: string, name: string, stack: string, project: string): string {
  const qualified = parent ? `${parent.split('::')[2]!.split('$').pop()}$${type}` : type;
  return `urn:pulumi:${stack}::${project}::${qualified}::${name}`;
}

/**
 * The URN each resource had before it moved (URN → prior URN): its own alias to another parent
 * (`noParent`: none; `parentUrn`: that one; with the name or type it had) names it; otherwise a resource whose parent moved
 * inherits the move (the engine derives children's aliases from their parent's). Resources
 * without aliases keep their URN.
 */
export function priorUrns(recorded: readonly RecordedResource[]): Map<string, string> {
  const byUrn = new Map(recorded.filter((r) => r.urn).map((r) => [r.urn, r]));
  const prior = new Map<string, string>();
  const resolve = (r: RecordedResource): string => {
    const known = prior.get(r.urn);
    if (known) return known;
    const [, stack = '', project = ''] = /^urn:pulumi:([^:]*)::([^:]*)::/.exec(r.urn) ?? [];
    const parentPrior = r.parent && byUrn.has(r.parent) ? resolve(byUrn.get(r.parent)!) : r.parent;
    let urn = urnOf(parentPrior, r.type, r.name, stack, project);
    // a move is an alias to another parent (or none); type-only aliases (the Kubernetes
    // package's older apiVersions) name other types the same resource may have had, not a move
    const alias = r.aliases.find((a) => 'urn' in a || a.noParent || a.parentUrn !== r.parent);
    if (alias && 'urn' in alias) urn = alias.urn;
    else if (alias) {
      const parent = alias.noParent ? '' : alias.parentUrn || parentPrior;
      urn = urnOf(parent, alias.type || r.type, alias.name || r.name, stack, project);
    }
    prior.set(r.urn, urn);
    return urn;
  };
  for (const r of byUrn.values()) resolve(r);
  return prior;
}

/** True when `v` is a wire-format secret. */
export function isWireSecret(v: unknown): v is { value: unknown } {
  return typeof v === 'object' && v !== null && (v as Record<string, unknown>)[SIG_KEY] === SECRET_SIG;
}

/** `v` with every wire-format secret replaced by its value. */
export function unwrapSecrets(v: unknown): unknown {
  if (isWireSecret(v)) return unwrapSecrets(v.value);
  if (Array.isArray(v)) return v.map(unwrapSecrets);
  if (typeof v === 'object' && v !== null) {
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, unwrapSecrets(x)]));
  }
  return v;
}

/**
 * Paths under `v` where `needle` occurs in a string that is not inside a secret. Strings that look
 * like base64 (user data) are also searched decoded.
 */
export function plaintextOccurrences(v: unknown, needle: string, path = ''): string[] {
  if (isWireSecret(v)) return [];
  if (typeof v === 'string') {
    if (v.includes(needle)) return [path];
    if (/^[A-Za-z0-9+/=\s]{16,}$/.test(v) && Buffer.from(v, 'base64').toString('utf8').includes(needle))
      return [`${path} (base64)`];
    return [];
  }
  if (Array.isArray(v)) return v.flatMap((x, i) => plaintextOccurrences(x, needle, `${path}[${i}]`));
  if (typeof v === 'object' && v !== null)
    return Object.entries(v).flatMap(([k, x]) => plaintextOccurrences(x, needle, path ? `${path}.${k}` : k));
  return [];
}

/** A small number derived from a name, so fake addresses are the same in every render. */
function nameNumber(name: string): number {
  let h = 0;
  for (const c of name) h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return (h % 250) + 1;
}

/** A number derived from `text` (31-multiplier string hash, unsigned 32-bit). */
function stableNumber(text: string): number {
  let h = 0;
  for (const c of text) h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return h;
}

/** Fake outputs for resource types whose real outputs the program reads. */
function fakeState(type: string, name: string, inputs: Record<string, unknown>): Record<string, unknown> {
  const n = nameNumber(name);
  switch (type) {
    case 'linode:index/instance:Instance':
      return { ...inputs, ipv4s: [`203.0.113.${n % 250}`], privateIpAddress: `192.168.130.${n % 250}` };
    case 'linode:index/lkeCluster:LkeCluster':
      return {
        ...inputs,
        kubeconfig: Buffer.from(`apiVersion: v1\nkind: Config\nclusters: []\n# ${name}\n`).toString('base64'),
        pools: ((inputs['pools'] as Record<string, unknown>[] | undefined) ?? []).map((p, i) => ({
          ...p,
          id: 100 + i,
          nodes: Array.from({ length: Number(p['count'] ?? 1) }, (_, j) => ({
            id: `node-${i}-${j}`,
            instanceId: 5000 + i * 100 + j,
            status: 'ready',
          })),
        })),
      };
    case 'pulumi-nodejs:dynamic/crusoe:Instance':
      // the API chooses the private address (computed): a created VM reports it
      return {
        ...inputs,
        resource: {
          id: `vm-${n}`,
          name: inputs['name'],
          network_interfaces: [
            {
              ips: [
                {
                  private_ipv4: { address: `10.77.128.${n % 250}` },
                  public_ipv4: { address: `203.0.113.${n % 250}` },
                },
              ],
            },
          ],
        },
      };
    case 'linode:index/nodeBalancer:NodeBalancer':
      return { ...inputs, ipv4: '198.51.100.10', hostname: `nb-${n}.example.invalid` };
    default:
      return { ...inputs };
  }
}

/**
 * Installs mocks and returns the list that fills as resources register. Call before constructing
 * any resource; `config` (full keys such as `space:version`) and `secretKeys` are injected too.
 * `stateOverride` replaces the state chosen resources report.
 */
export async function installMocks(
  config: Record<string, string> = {},
  secretKeys: string[] = [],
  stack = 'test',
  /**
   * The state a created resource reports, in place of the default fake one (`undefined`: the
   * default): how the deployment rehearsal gives each Crusoe VM the private address its QEMU VM has.
   */
  stateOverride?: (
    type: string,
    name: string,
    fake: Record<string, unknown>,
  ) => Record<string, unknown> | undefined,
): Promise<RecordedResource[]> {
  const recorded: RecordedResource[] = [];
  let current: Pick<RecordedResource, 'parent' | 'aliases' | 'dependencies' | 'customTimeouts'> & {
    urn?: string;
  } = { parent: '', aliases: [] };
  pulumi.runtime.setAllConfig(config, secretKeys);
  await pulumi.runtime.setMocks(
    {
      newResource(args: pulumi.runtime.MockResourceArgs): { id: string; state: Record<string, unknown> } {
        recorded.push({ type: args.type, name: args.name, inputs: args.inputs, urn: '', ...current });
        current = { parent: '', aliases: [] };
        // from the type and name, not the registration order: the same resource gets the same id
        // however the program is structured (a component registered first shifts no id)
        const numericId = String(10_000 + (stableNumber(`${args.type}::${args.name}`) % 89_999));
        const fake = fakeState(args.type, args.name, args.inputs);
        return { id: numericId, state: stateOverride?.(args.type, args.name, fake) ?? fake };
      },
      call(args: pulumi.runtime.MockCallArgs): Record<string, unknown> {
        return args.inputs;
      },
    },
    'space',
    stack,
    false,
  );
  // the mock hands newResource no parent nor aliases: read them off each request first (the
  // monitor calls newResource synchronously, before its first await)
  const monitor = pulumi.runtime.getMonitor() as unknown as {
    registerResource(req: RegisterRequest, cb: unknown): Promise<void>;
  };
  const register = monitor.registerResource.bind(monitor);
  monitor.registerResource = (req, cb) => {
    const parent = req.getParent();
    const timeouts = req.getCustomtimeouts();
    current = {
      parent,
      dependencies: req.getDependenciesList(),
      ...(timeouts
        ? {
            customTimeouts: {
              create: timeouts.getCreate(),
              update: timeouts.getUpdate(),
              delete: timeouts.getDelete(),
            },
          }
        : {}),
      urn: urnOf(parent, req.getType(), req.getName(), stack, 'space'),
      aliases: req.getAliasesList().map((a) =>
        a.hasSpec()
          ? {
              name: a.getSpec().getName(),
              type: a.getSpec().getType(),
              noParent: a.getSpec().getNoparent(),
              parentUrn: a.getSpec().getParenturn(),
            }
          : { urn: a.getUrn() },
      ),
    };
    return register(req, cb);
  };
  return recorded;
}

/** Resolves an Output (under mocks, outside preview). */
export function resolved<T>(o: pulumi.Input<T>): Promise<T> {
  return new Promise((resolve) => pulumi.output(o).apply((v) => resolve(v as T)));
}

/** Whether an Output is marked secret. */
export function secretness(o: pulumi.Output<unknown>): Promise<boolean> {
  return pulumi.isSecret(o);
}

/**
 * Waits until registrations stop arriving (`recorded` unchanged for 150 ms; at most 10 s):
 * dynamic resources register only after their provider is serialized, which takes a moment.
 */
export async function settle(recorded?: readonly unknown[]): Promise<void> {
  let last = -1;
  let stable = 0;
  for (let i = 0; i < 400 && stable < 6; i++) {
    await new Promise((r) => setTimeout(r, 25));
    const n = recorded?.length ?? 0;
    stable = n === last ? stable + 1 : 0;
    last = n;
  }
}
