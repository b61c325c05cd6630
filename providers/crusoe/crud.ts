/**
 * The Crusoe resource kinds the dynamic provider manages and their CRUD over REST v1
 * (clouds.md §3.3–3.4): VM instances (nested virtualisation on), VPC subnets, VPC firewall rules.
 * Inputs are camelCase (Pulumi style); bodies are the API's snake_case. Loaded lazily by
 * `provider.ts`, so nothing here is serialized into the Pulumi state.
 */
import type * as pulumi from '@pulumi/pulumi';
import { awaitOperation, CrusoeApiError, crusoeRequest } from './client.ts';

/** Inputs of a VM instance. */
export interface InstanceInputs {
  projectId: string;
  name: string;
  type: string;
  location: string;
  image: string;
  sshPublicKey: string;
  /** First-boot script (Crusoe has no cloud-init field). Not secret: it is readable from the VM. */
  startupScript: string;
  /** Subnet the VM's interface joins. */
  subnetId: string;
  /** Fixed private address in the subnet (the control VM's, which agents are told). Optional. */
  privateAddress?: string;
  /** `virtualization_features.nested_virtualization`; needs a Support feature flag. */
  nestedVirtualization: boolean;
}

/** Inputs of a VPC subnet. */
export interface SubnetInputs {
  projectId: string;
  name: string;
  cidr: string;
  location: string;
  vpcNetworkId: string;
  natGatewayEnabled: boolean;
}

/** Inputs of a VPC firewall rule. */
export interface FirewallRuleInputs {
  projectId: string;
  name: string;
  vpcNetworkId: string;
  action: 'allow' | 'deny';
  direction: 'ingress' | 'egress';
  protocols: string[];
  sources: string[];
  destinations: string[];
  destinationPorts: string[];
}

/** How one kind maps to the API. */
interface KindSpec {
  /** Collection path under `/projects/{project_id}/`. */
  readonly collection: string;
  /** Request body of a create. */
  body(i: Record<string, unknown>): Record<string, unknown>;
  /** Input names whose change replaces the resource. */
  readonly replaceOn: readonly string[];
  /** Body of a PATCH for an in-place update (kinds without one replace on any change). */
  patch?(i: Record<string, unknown>): Record<string, unknown>;
  /** Inputs that may be absent. */
  readonly optional?: readonly string[];
}

const cidrs = (xs: unknown) => (xs as string[]).map((cidr) => ({ cidr }));

/** Every kind. */
export const KINDS = {
  instance: {
    collection: 'compute/vms/instances',
    body: (i) => ({
      name: i['name'],
      type: i['type'],
      location: i['location'],
      image: i['image'],
      ssh_public_key: i['sshPublicKey'],
      startup_script: i['startupScript'],
      network_interfaces: [
        {
          ips: [
            {
              ...(i['privateAddress'] ? { private_ipv4: { address: i['privateAddress'] } } : {}),
              public_ipv4: { type: 'dynamic' },
            },
          ],
          subnet: i['subnetId'],
        },
      ],
      virtualization_features: { nested_virtualization: i['nestedVirtualization'] === true },
    }),
    replaceOn: [
      'projectId',
      'name',
      'type',
      'location',
      'image',
      'sshPublicKey',
      'startupScript',
      'subnetId',
      'privateAddress',
      'nestedVirtualization',
    ],
    optional: ['privateAddress'],
  },
  subnet: {
    collection: 'networking/vpc-subnets',
    body: (i) => ({
      name: i['name'],
      cidr: i['cidr'],
      location: i['location'],
      vpc_network_id: i['vpcNetworkId'],
      nat_gateway_enabled: i['natGatewayEnabled'],
    }),
    replaceOn: ['projectId', 'name', 'cidr', 'location', 'vpcNetworkId', 'natGatewayEnabled'],
  },
  firewallRule: {
    collection: 'networking/vpc-firewall-rules',
    body: (i) => ({
      name: i['name'],
      vpc_network_id: i['vpcNetworkId'],
      action: i['action'],
      direction: i['direction'],
      protocols: i['protocols'],
      sources: cidrs(i['sources']),
      destinations: cidrs(i['destinations']),
      destination_ports: i['destinationPorts'],
    }),
    replaceOn: ['projectId', 'name', 'vpcNetworkId', 'direction'],
    patch: (i) => ({
      action: i['action'],
      protocols: i['protocols'],
      sources: cidrs(i['sources']),
      destinations: cidrs(i['destinations']),
      destination_ports: i['destinationPorts'],
    }),
  },
} as const satisfies Record<string, KindSpec>;

/** A kind name. */
export type CrusoeKind = keyof typeof KINDS;

const base = (kind: CrusoeKind, i: Record<string, unknown>) =>
  `/projects/${i['projectId']}/${KINDS[kind].collection}`;

/** Fields every input must have (all of them: no defaults on the wire). */
export function check(kind: CrusoeKind, news: Record<string, unknown>): pulumi.dynamic.CheckResult {
  const spec: KindSpec = KINDS[kind];
  const required = spec.replaceOn.filter((k) => !spec.optional?.includes(k));
  const failures = required
    .filter((k) => news[k] === undefined || news[k] === '')
    .map((property) => ({ property, reason: `${property} is required` }));
  return { inputs: news, failures };
}

/** Replacement when an identity field changed; in-place update otherwise (if the kind supports it). */
export function diff(
  kind: CrusoeKind,
  olds: Record<string, unknown>,
  news: Record<string, unknown>,
): pulumi.dynamic.DiffResult {
  const changed = Object.keys({ ...olds, ...news }).filter(
    (k) =>
      !k.startsWith('__') &&
      !['id', 'resource'].includes(k) &&
      JSON.stringify(olds[k]) !== JSON.stringify(news[k]),
  );
  const spec: KindSpec = KINDS[kind];
  const replaces = spec.patch ? changed.filter((k) => spec.replaceOn.includes(k)) : changed;
  return {
    changes: changed.length > 0,
    replaces,
    deleteBeforeReplace: replaces.includes('name') || replaces.length > 0,
  };
}

/** POST, wait for the operation, return the new id and outputs. */
export async function create(
  kind: CrusoeKind,
  inputs: Record<string, unknown>,
): Promise<pulumi.dynamic.CreateResult> {
  const coll = base(kind, inputs);
  const result = await awaitOperation(coll, await crusoeRequest('POST', coll, KINDS[kind].body(inputs)));
  const id = String(result['id'] ?? '');
  if (!id) throw new Error(`crusoe ${coll}: created, but the operation result has no id`);
  return { id, outs: { ...inputs, resource: result } };
}

/** GET the resource; outputs keep the inputs and add the API's view. */
export async function read(
  kind: CrusoeKind,
  id: string,
  props: Record<string, unknown>,
): Promise<pulumi.dynamic.ReadResult> {
  const answer = (await crusoeRequest('GET', `${base(kind, props)}/${id}`)) as Record<string, unknown>;
  return { id, props: { ...props, resource: answer } };
}

/** PATCH (kinds with in-place updates), wait for the operation. */
export async function update(
  kind: CrusoeKind,
  id: string,
  _olds: Record<string, unknown>,
  news: Record<string, unknown>,
): Promise<pulumi.dynamic.UpdateResult> {
  const spec: KindSpec = KINDS[kind];
  if (!spec.patch) throw new Error(`crusoe ${kind}: no in-place update (diff should have replaced it)`);
  const coll = base(kind, news);
  const result = await awaitOperation(coll, await crusoeRequest('PATCH', `${coll}/${id}`, spec.patch(news)));
  return { outs: { ...news, resource: result } };
}

/** DELETE, wait for the operation; a resource already gone (404) counts as deleted. */
export async function remove(kind: CrusoeKind, id: string, props: Record<string, unknown>): Promise<void> {
  const coll = base(kind, props);
  try {
    await awaitOperation(coll, await crusoeRequest('DELETE', `${coll}/${id}`));
  } catch (err) {
    if (err instanceof CrusoeApiError && err.status === 404) return;
    throw err;
  }
}
