/**
 * What `pulumi up` would give each VM, taken from the Pulumi program itself under Pulumi's mock
 * runtime (no hand-written copy): the program runs with the stack file's configuration plus the
 * rehearsal's overrides, and each VM resource's user data (Linode `metadatas[0].userData`, base64
 * cloud-config) or startup script (Crusoe `startupScript`) is read from its recorded inputs.
 */
import { readFileSync } from 'node:fs';
import { parse } from 'yaml';
import { installMocks, resolved, settle, unwrapSecrets } from '../../providers/testing/mocks.ts';
import { controlAddresses } from '../../providers/vm-network.ts';
import { nthHost } from '../../runtime/core/net-address.ts';
import { run } from '../../stacks/program.ts';
import type { HealthCheck } from './load-balancer.ts';

/** A VM the program made, with what it boots with. */
export interface RenderedVm {
  /** The Pulumi resource name (`space-control`, `space-node-default-0`, …). */
  readonly resource: string;
  readonly role: 'control' | 'node';
  /** Its private address: what the cloud would give it, and what the rehearsal's VM gets. */
  readonly address: string;
  /** The exact text the cloud hands the VM at first boot. */
  readonly userData: string;
}

/** The stack program's rendering: its VMs, its outputs (resolved) and its VM configuration. */
export interface Rendering {
  readonly vms: readonly RenderedVm[];
  readonly outputs: Record<string, unknown>;
  /**
   * The inputs of the stack's `space:VmConfig` resource (plain: secrets unwrapped), which
   * `pulumi up` hands to `writeVmConfig`: how a configuration change or a version bump reaches VMs
   * that already run. Absent when the program made none.
   */
  readonly vmConfig?: Record<string, unknown>;
  /**
   * The health checks of the NodeBalancer's API and router configurations (Akamai), as the program
   * set them; absent when it set no HTTP check or no timing (one control VM: one backend).
   */
  readonly healthChecks: { readonly api?: HealthCheck; readonly router?: HealthCheck };
}

/** The Linode NodeBalancerConfig inputs that make a health check (pulumi-linode's field names). */
function healthCheckOf(inputs: Record<string, unknown>): HealthCheck | undefined {
  const { check, checkPath, checkInterval, checkTimeout, checkAttempts } = inputs;
  if (check !== 'http' || typeof checkPath !== 'string') return undefined;
  if (![checkInterval, checkTimeout, checkAttempts].every((v) => typeof v === 'number')) return undefined;
  return {
    path: checkPath,
    intervalSec: checkInterval as number,
    timeoutSec: checkTimeout as number,
    attempts: checkAttempts as number,
  };
}

/**
 * `n` control VMs (`space:controlPlane.replicas`), whatever the stack file asks (it sets three:
 * docs/deployment.md "Redis: failover"). The rehearsal boots one unless told: a 2-core host
 * emulates three more VMs slowly.
 */
export function controlVms(n: number): { controlPlane: string } {
  return { controlPlane: JSON.stringify({ replicas: n }) };
}

/** One control VM: {@link controlVms}(1). */
export const ONE_CONTROL_VM = controlVms(1);

/**
 * `count` VMs in the stack file's first node pool (the others dropped), as a `space:nodePools`
 * override. @throws Error when the stack file has no node pool.
 */
export function nodeVms(stack: string, count: number): { nodePools: string } {
  const pools = JSON.parse(stackFileConfig(stack)['nodePools'] ?? '[]') as Record<string, unknown>[];
  if (!pools[0]) throw new Error(`rehearsal: stack ${stack} has no space:nodePools`);
  return { nodePools: JSON.stringify([{ ...pools[0], count }]) };
}

/** `space:*` values of `stacks/Pulumi.<stack>.yaml` as Pulumi passes them (objects as JSON). */
export function stackFileConfig(stack: string): Record<string, string> {
  const doc = parse(readFileSync(new URL(`../../stacks/Pulumi.${stack}.yaml`, import.meta.url), 'utf8')) as {
    config: Record<string, unknown>;
  };
  return Object.fromEntries(
    Object.entries(doc.config)
      .filter(([k]) => k.startsWith('space:'))
      .map(([k, v]) => [k.slice('space:'.length), typeof v === 'string' ? v : JSON.stringify(v)]),
  );
}

/**
 * Runs the program for `stack`'s file with `overrides` (keys without the `space:` prefix) and
 * returns its VMs in creation order. Throws the program's own error (a refused configuration).
 */
export async function renderStack(stack: string, overrides: Record<string, string>): Promise<Rendering> {
  const raw: Record<string, string | undefined> = { ...stackFileConfig(stack), ...overrides };
  const cidr = raw['privateCidr'];
  if (!cidr) throw new Error(`rehearsal: stack ${stack} has no space:privateCidr`);
  // Akamai's VPC addresses are the program's choice (control at controlAddress); Crusoe's API picks
  // them, so its VMs report the address the rehearsal gives them: the control VM's own, then one
  // per node in creation order, as rehearsalAddress() assigns them
  const addressOf = new Map<string, string>();
  const assign = (name: string) => {
    if (!addressOf.has(name)) addressOf.set(name, rehearsalAddress(cidr, name, addressOf.size));
    return addressOf.get(name)!;
  };
  const recorded = await installMocks({}, [], 'test', (type, name, fake) => {
    if (type !== 'pulumi-nodejs:dynamic/crusoe:Instance') return undefined;
    const resource = fake['resource'] as {
      network_interfaces: { ips: { private_ipv4: { address: string } }[] }[];
    };
    resource.network_interfaces[0]!.ips[0]!.private_ipv4.address = assign(name);
    return fake;
  });
  const outputs = run((k) => raw[k]);
  await settle(recorded);
  const vms: RenderedVm[] = [];
  let vmConfig: Record<string, unknown> | undefined;
  const healthChecks: { api?: HealthCheck; router?: HealthCheck } = {};
  for (const r of recorded) {
    const inputs = unwrapSecrets(r.inputs) as Record<string, unknown>;
    if (r.type === 'pulumi-nodejs:dynamic/space:VmConfig') vmConfig = inputs;
    if (r.type === 'linode:index/nodeBalancerConfig:NodeBalancerConfig') {
      const which =
        r.name === 'space-api-nb-config' ? 'api' : r.name === 'space-router-nb-config' ? 'router' : null;
      const check = healthCheckOf(inputs);
      if (which && check) healthChecks[which] = check;
    }
    let userData: string | undefined;
    if (r.type === 'linode:index/instance:Instance') {
      const md = inputs['metadatas'] as { userData?: string }[] | undefined;
      if (md?.[0]?.userData) userData = Buffer.from(md[0].userData, 'base64').toString('utf8');
    } else if (r.type === 'pulumi-nodejs:dynamic/crusoe:Instance') {
      userData = inputs['startupScript'] as string | undefined;
    }
    if (userData === undefined) continue;
    vms.push({
      resource: r.name,
      role: r.name.includes('control') ? 'control' : 'node',
      address: assign(r.name),
      userData,
    });
  }
  const resolvedOutputs: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(outputs)) resolvedOutputs[k] = await resolved(v);
  return { vms, outputs: resolvedOutputs, healthChecks, ...(vmConfig ? { vmConfig } : {}) };
}

/**
 * The rehearsal's private address for VM resource `name` in `cidr`: control VM `i`
 * (`space-control`, `space-control-<i>`) where Akamai's program puts it ({@link controlAddresses}),
 * a node at host 20 + `index`, `index` counting the addresses asked for before (the control VMs'
 * included). Pure.
 */
function rehearsalAddress(cidr: string, name: string, index: number): string {
  const control = /^space-control(?:-(\d+))?$/.exec(name);
  if (!control) return nthHost(cidr, 20 + index);
  const i = Number(control[1] ?? 0);
  return controlAddresses(cidr, i + 1)[i]!;
}
