import { execFileSync } from 'node:child_process';
import { createHmac } from 'node:crypto';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { crusoeProvider } from './provider.ts';
import { canonicalQuery, signingMessage, signRequest } from './signing.ts';

const load = () => import('./crud.ts');
const ACCESS_KEY = 'AK-test';
const SECRET = Buffer.from('a-secret-key-of-some-length-123').toString('base64url');
const PROJECT = 'proj-1';

interface Seen {
  method: string;
  path: string;
  body: unknown;
}

/** Recomputes the v1.0 signature independently of signing.ts (no query in these requests). */
function verifySignature(req: IncomingMessage, path: string): boolean {
  const ts = req.headers['x-crusoe-timestamp'];
  if (typeof ts !== 'string' || !/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/.test(ts)) return false;
  if (Math.abs(Date.parse(ts) - Date.now()) > 60_000) return false;
  const msg = `${path}\n\n${req.method}\n${ts}\n`;
  const sig = createHmac('sha256', Buffer.from(SECRET, 'base64url')).update(msg).digest('base64url');
  return req.headers.authorization === `Bearer 1.0:${ACCESS_KEY}:${sig}`;
}

describe('Crusoe dynamic provider against a loopback API', () => {
  let server: Server;
  let seen: Seen[] = [];
  const state = new Map<string, Record<string, unknown>>();
  let opPolls = 0;

  beforeAll(async () => {
    server = createServer((req, res) => {
      let data = '';
      req.on('data', (c) => {
        data += c;
      });
      req.on('end', () => {
        const url = new URL(req.url!, 'http://x');
        const send = (status: number, body: unknown) => {
          res.writeHead(status, { 'content-type': 'application/json' });
          res.end(JSON.stringify(body));
        };
        if (!verifySignature(req, url.pathname)) return send(401, { message: 'bad signature' });
        const body = data ? JSON.parse(data) : undefined;
        seen.push({ method: req.method!, path: url.pathname, body });
        const m =
          /^\/v1\/projects\/proj-1\/(compute\/vms\/instances|networking\/vpc-firewall-rules|networking\/vpc-subnets)(?:\/(operations\/)?([^/]+))?$/.exec(
            url.pathname,
          );
        if (!m) return send(404, { message: 'no route' });
        const [, coll, isOp, id] = m;
        if (isOp) {
          // first poll: still running; then done with the stored result
          opPolls++;
          const op = state.get(`op:${id}`)!;
          return send(200, { operation: opPolls % 2 === 1 ? { ...op, state: 'IN_PROGRESS' } : op });
        }
        const op = (result: Record<string, unknown>) => {
          const opId = `op-${seen.length}`;
          state.set(`op:${opId}`, { operation_id: opId, state: 'SUCCEEDED', result });
          send(200, { operation: { operation_id: opId, state: 'IN_PROGRESS' } });
        };
        if (req.method === 'POST' && !id) {
          const rid = `${coll!.split('/').pop()}-1`;
          // the real API answers subnet creation synchronously, `{ subnet }` (v1 swagger
          // vpcSubnetPostResponse): no operation exists to poll
          if (coll === 'networking/vpc-subnets') {
            state.set(rid, { id: rid, ...body });
            return send(200, { subnet: state.get(rid) });
          }
          if (coll === 'compute/vms/instances') {
            // the private address is the API's to choose: computed, read-only for clients
            const ips = body.network_interfaces?.[0]?.ips ?? [];
            if (ips.some((ip: Record<string, unknown>) => 'private_ipv4' in ip))
              return send(400, { message: 'private_ipv4 is read-only' });
            const vm = {
              id: rid,
              ...body,
              network_interfaces: [
                {
                  ...body.network_interfaces?.[0],
                  ips: [
                    { private_ipv4: { address: '10.77.128.57' }, public_ipv4: { address: '203.0.113.9' } },
                  ],
                },
              ],
            };
            state.set(rid, vm);
            return op(vm);
          }
          state.set(rid, { id: rid, ...body });
          return op({ id: rid, ...body });
        }
        if (!state.has(id!)) return send(404, { message: 'not found' });
        if (req.method === 'GET') return send(200, state.get(id!));
        if (req.method === 'PATCH') {
          state.set(id!, { ...state.get(id!), ...body });
          return op(state.get(id!)!);
        }
        if (req.method === 'DELETE') {
          state.delete(id!);
          return op({});
        }
        send(405, {});
      });
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const port = (server.address() as AddressInfo).port;
    process.env['CRUSOE_API_ENDPOINT'] = `http://127.0.0.1:${port}/v1`;
    process.env['CRUSOE_ACCESS_KEY_ID'] = ACCESS_KEY;
    process.env['CRUSOE_SECRET_KEY'] = SECRET;
    process.env['CRUSOE_POLL_INTERVAL_MS'] = '5';
  });
  afterAll(async () => {
    await new Promise((r) => server.close(r));
  });
  beforeEach(() => {
    seen = [];
  });

  const instanceInputs = {
    projectId: PROJECT,
    name: 'space-node-default-0',
    type: 'c1a.8x',
    location: 'us-east1-a',
    image: 'ubuntu22.04:latest',
    sshPublicKey: 'ssh-ed25519 AAAA test',
    startupScript: '#!/bin/sh\necho hi\n',
    subnetId: 'subnet-9',
    nestedVirtualization: true,
  };

  it('creates a VM with nested virtualisation: signed POST to the documented path, then polls its operation', async () => {
    const p = crusoeProvider('instance', load);
    const created = await p.create(instanceInputs);
    expect(created.id).toBe('instances-1');
    expect(seen[0]).toEqual({
      method: 'POST',
      path: '/v1/projects/proj-1/compute/vms/instances',
      body: {
        name: 'space-node-default-0',
        type: 'c1a.8x',
        location: 'us-east1-a',
        image: 'ubuntu22.04:latest',
        ssh_public_key: 'ssh-ed25519 AAAA test',
        startup_script: '#!/bin/sh\necho hi\n',
        network_interfaces: [{ ips: [{ public_ipv4: { type: 'dynamic' } }], subnet: 'subnet-9' }],
        virtualization_features: { nested_virtualization: true },
      },
    });
    expect(
      seen
        .slice(1)
        .every(
          (s) =>
            s.method === 'GET' && s.path.startsWith('/v1/projects/proj-1/compute/vms/instances/operations/'),
        ),
    ).toBe(true);
    expect(seen.length).toBeGreaterThanOrEqual(2);
  });

  it('reads a VM with GET on its path', async () => {
    const r = await crusoeProvider('instance', load).read!('instances-1', instanceInputs);
    expect(seen).toEqual([
      { method: 'GET', path: '/v1/projects/proj-1/compute/vms/instances/instances-1', body: undefined },
    ]);
    expect((r.props as { resource: { name: string } }).resource.name).toBe('space-node-default-0');
  });

  it('replaces a VM on any change; updates a firewall rule in place (PATCH)', async () => {
    const d = await crusoeProvider('instance', load).diff!('instances-1', instanceInputs, {
      ...instanceInputs,
      type: 'c1a.16x',
    });
    expect(d.replaces).toEqual(['type']);
    const rule = {
      projectId: PROJECT,
      name: 'space-data-plane',
      vpcNetworkId: 'vpc-1',
      action: 'allow',
      direction: 'ingress',
      protocols: ['tcp'],
      sources: ['0.0.0.0/0'],
      destinations: ['10.77.128.0/24'],
      destinationPorts: ['8081'],
    };
    const fw = crusoeProvider('firewallRule', load);
    const c = await fw.create(rule);
    expect(seen[0]!.body).toMatchObject({
      sources: [{ cidr: '0.0.0.0/0' }],
      destination_ports: ['8081'],
      direction: 'ingress',
    });
    const changed = { ...rule, sources: ['198.51.100.0/24'] };
    const d2 = await fw.diff!(c.id, rule, changed);
    expect(d2).toMatchObject({ changes: true, replaces: [] });
    seen = [];
    await fw.update!(c.id, rule, changed);
    expect(seen[0]).toMatchObject({
      method: 'PATCH',
      path: `/v1/projects/proj-1/networking/vpc-firewall-rules/${c.id}`,
      body: { sources: [{ cidr: '198.51.100.0/24' }] },
    });
  });

  it('creates a subnet with the documented body, taking the synchronous answer (no operation to poll)', async () => {
    const created = await crusoeProvider('subnet', load).create({
      projectId: PROJECT,
      name: 'space',
      cidr: '10.77.128.0/24',
      location: 'us-east1-a',
      vpcNetworkId: 'vpc-1',
      natGatewayEnabled: true,
    });
    expect(seen[0]).toEqual({
      method: 'POST',
      path: '/v1/projects/proj-1/networking/vpc-subnets',
      body: {
        name: 'space',
        cidr: '10.77.128.0/24',
        location: 'us-east1-a',
        vpc_network_id: 'vpc-1',
        nat_gateway_enabled: true,
      },
    });
    expect(seen).toHaveLength(1);
    expect(created.id).toBe('vpc-subnets-1');
  });

  it('reads the VM private address the API chose from the created VM', async () => {
    const created = await crusoeProvider('instance', load).create(instanceInputs);
    const { instancePrivateIpv4 } = await load();
    expect(instancePrivateIpv4(created.outs!['resource'])).toBe('10.77.128.57');
    expect(instancePrivateIpv4({})).toBeUndefined();
  });

  it('deletes a VM (DELETE + operation); deleting it again (404) counts as done', async () => {
    const p = crusoeProvider('instance', load);
    await p.delete!('instances-1', instanceInputs);
    expect(seen[0]).toEqual({
      method: 'DELETE',
      path: '/v1/projects/proj-1/compute/vms/instances/instances-1',
      body: undefined,
    });
    await expect(p.delete!('instances-1', instanceInputs)).resolves.toBeUndefined();
  });

  it('a request with a wrong secret is refused by the server (the check is real)', async () => {
    process.env['CRUSOE_SECRET_KEY'] = Buffer.from('wrong').toString('base64url');
    try {
      await expect(crusoeProvider('instance', load).read!('instances-1', instanceInputs)).rejects.toThrow(
        /HTTP 401/,
      );
    } finally {
      process.env['CRUSOE_SECRET_KEY'] = SECRET;
    }
  });

  it('check reports every missing input', async () => {
    const r = await crusoeProvider('instance', load).check!({}, { projectId: PROJECT });
    expect(r.failures!.map((f) => f.property)).toEqual(
      expect.arrayContaining(['name', 'type', 'sshPublicKey', 'subnetId']),
    );
  });
});

describe('the default loader (what a serialized provider runs)', () => {
  it('loads crud.ts under plain Node 24, outside vitest', () => {
    const node = process.execPath;
    const script =
      "const { crusoeProvider } = await import('./providers/crusoe/provider.ts');" +
      "const r = await crusoeProvider('subnet').check({}, { projectId: 'p' });" +
      'console.log(JSON.stringify(r.failures.map((f) => f.property)));';
    const out = execFileSync(node, ['--input-type=module', '-e', script], {
      cwd: new URL('../..', import.meta.url),
    });
    expect(JSON.parse(out.toString())).toEqual([
      'name',
      'cidr',
      'location',
      'vpcNetworkId',
      'natGatewayEnabled',
    ]);
  });
});

describe('Crusoe request signing', () => {
  it('canonicalizes the query: unescape, sort by key (stable), form-escape', () => {
    expect(canonicalQuery('')).toBe('');
    expect(canonicalQuery('b=2&a=x%20y&a=1')).toBe('a=x+y&a=1&b=2');
    expect(() => canonicalQuery('a=1;b=2')).toThrow(/;/);
  });

  it('signs path, query, method and timestamp, each line ending in \\n', () => {
    const i = {
      method: 'get',
      path: '/v1/projects/p/compute/vms/types',
      query: 'z=1&a=2',
      timestamp: '2026-11-29T17:00:00Z',
    };
    expect(signingMessage(i)).toBe('/v1/projects/p/compute/vms/types\na=2&z=1\nGET\n2026-11-29T17:00:00Z\n');
    const h = signRequest({ ...i, accessKeyId: 'AK', secretKey: SECRET });
    const sig = createHmac('sha256', Buffer.from(SECRET, 'base64url'))
      .update(signingMessage(i))
      .digest('base64url');
    expect(h).toEqual({
      authorization: `Bearer 1.0:AK:${sig}`,
      'x-crusoe-timestamp': '2026-11-29T17:00:00Z',
    });
    expect(h.authorization).not.toContain('=');
  });
});
