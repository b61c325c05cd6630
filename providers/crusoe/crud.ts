/**
 * The Crusoe resource kinds the dynamic provider manages and their CRUD over REST v1
 * (docs/deployment.md "Crusoe"): VM instances (nested virtualisation on), VPC subnets, VPC firewall rules.
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
  /**
   * Subnet the VM's interface joins. The private address is the API's to choose (read-only in the
   * Terraform provider, `crusoe_compute_instance` `network_interfaces.private_ipv4` is computed):
   * read it back with {@link instancePrivateIpv4}.
   */
  subnetId: string;
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
  /**
   * How the API answers a create: `operation` (asynchronous, poll it; VMs, firewall rules) or the
   * key under which it returns the new resource synchronously (`subnet`: `POST …/vpc-subnets`
   * answers `{ subnet: {…} }`, Crusoe v1 swagger `vpcSubnetPostResponse`;
   * crusoecloud/terraform-provider-crusoe `internal/vpc_subnet/vpc_subnet_resource.go` `Create`
   * reads `dataResp.Subnet` and polls nothing, while its `Update` and `Delete` await operations).
   */
  readonly createAnswer: 'operation' | { readonly key: string };
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
          ips: [{ public_ipv4: { type: 'dynamic' } }],
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
      'nestedVirtualization',
    ],
    createAnswer: 'operation',
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
    createAnswer: { key: 'subnet' },
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
    createAnswer: 'operation',
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

/**
 * POST; then, for asynchronous kinds, wait for the operation. Returns the new id and outputs. A
 * synchronous answer is taken as it is: polling it would throw after the resource exists and
 * leave it orphaned (outside the state, so never deleted).
 */
export async function create(
  kind: CrusoeKind,
  inputs: Record<string, unknown>,
): Promise<pulumi.dynamic.CreateResult> {
  const spec: KindSpec = KINDS[kind];
  const coll = base(kind, inputs);
  const answer = await crusoeRequest('POST', coll, spec.body(inputs));
  const result =
    spec.createAnswer === 'operation'
      ? await awaitOperation(coll, answer)
      : ((answer as Record<string, unknown>)[spec.createAnswer.key] as Record<string, unknown> | undefined);
  const id = String(result?.['id'] ?? '');
  if (!id)
    throw new Error(
      `crusoe ${coll}: created, but the answer has no id: ${JSON.stringify(answer).slice(0, 300)}`,
    );
  return { id, outs: { ...inputs, resource: result } };
}

/**
 * The private IPv4 address of a VM as the API reports it: `network_interfaces[0].ips[0].
 * private_ipv4.address` (crusoecloud/terraform-provider-crusoe, VM data source: `networkInterface.
 * Ips[0].PrivateIpv4.Address`; Crusoe's Kubernetes cloud controller `getNodeAddress` reads the same
 * path). Undefined when absent.
 */
export function instancePrivateIpv4(resource: unknown): string | undefined {
  const r = resource as
    | { network_interfaces?: { ips?: { private_ipv4?: { address?: string } }[] }[] }
    | undefined;
  const address = r?.network_interfaces?.[0]?.ips?.[0]?.private_ipv4?.address;
  return address || undefined;
}

/**
 * The public IPv4 address of a VM as the API reports it: `network_interfaces[0].ips[0].
 * public_ipv4.address` (the same object as the private address; the request asks for a dynamic
 * public address there). Undefined when absent.
 */
export function instancePublicIpv4(resource: unknown): string | undefined {
  const r = resource as
    | { network_interfaces?: { ips?: { public_ipv4?: { address?: string } }[] }[] }
    | undefined;
  return r?.network_interfaces?.[0]?.ips?.[0]?.public_ipv4?.address || undefined;
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
