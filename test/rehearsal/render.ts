/**
 * What `pulumi up` would give each VM, taken from the Pulumi program itself under Pulumi's mock
 * runtime (no hand-written copy): the program runs with the stack file's configuration plus the
 * rehearsal's overrides, and each VM resource's user data (Linode `metadatas[0].userData`, base64
 * cloud-config) or startup script (Crusoe `startupScript`) is read from its recorded inputs.
 */
import { readFileSync } from 'node:fs';
import { parse } from 'yaml';
import { installMocks, resolved, settle, unwrapSecrets } from '../../providers/testing/mocks.ts';
import { run } from '../../stacks/program.ts';

/** A VM the program made, with what it boots with. */
export interface RenderedVm {
  /** The Pulumi resource name (`space-control`, `space-node-default-0`, …). */
  readonly resource: string;
  readonly role: 'control' | 'node';
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
  const recorded = await installMocks();
  const outputs = run((k) => raw[k]);
  await settle(recorded);
  const vms: RenderedVm[] = [];
  let vmConfig: Record<string, unknown> | undefined;
  for (const r of recorded) {
    const inputs = unwrapSecrets(r.inputs) as Record<string, unknown>;
    if (r.type === 'pulumi-nodejs:dynamic/space:VmConfig') vmConfig = inputs;
    let userData: string | undefined;
    if (r.type === 'linode:index/instance:Instance') {
      const md = inputs['metadatas'] as { userData?: string }[] | undefined;
      if (md?.[0]?.userData) userData = Buffer.from(md[0].userData, 'base64').toString('utf8');
    } else if (r.type === 'pulumi-nodejs:dynamic/crusoe:Instance') {
      userData = inputs['startupScript'] as string | undefined;
    }
    if (userData === undefined) continue;
    vms.push({ resource: r.name, role: r.name.includes('control') ? 'control' : 'node', userData });
  }
  const resolvedOutputs: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(outputs)) resolvedOutputs[k] = await resolved(v);
  return { vms, outputs: resolvedOutputs, ...(vmConfig ? { vmConfig } : {}) };
}
