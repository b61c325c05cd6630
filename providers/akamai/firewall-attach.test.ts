/**
 * The LKE firewall attacher against a loopback stand-in of the Linode API v4 that checks what the
 * real one requires (techdocs.akamai.com/linode-api/reference): a bearer token, the label filter
 * in `X-Filter`, paginated device lists, and `{ id, type: "linode" }` to add a device (the stand-in
 * refuses a second attachment of the same Linode, as the real API refuses a duplicate device).
 */
import { spawn } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { attachNode } from './firewall-attach.ts';

const TOKEN = 'linode-token-42';
const FIREWALL = 777;

describe('LKE firewall attacher against a loopback Linode API', () => {
  let server: Server;
  let url = '';
  let devices: { id: number; entity: { id: number; type: string; label: string } }[] = [];
  let posts: unknown[] = [];
  const instances = [
    { id: 5001, label: 'lke1234-5678-aaaa' },
    { id: 5002, label: 'lke1234-5678-bbbb' },
  ];

  beforeAll(async () => {
    server = createServer((req, res) => {
      let body = '';
      req.on('data', (c) => (body += c));
      req.on('end', () => {
        const send = (status: number, data: unknown) => {
          res.writeHead(status, { 'content-type': 'application/json' });
          res.end(JSON.stringify(data));
        };
        if (req.headers.authorization !== `Bearer ${TOKEN}`)
          return send(401, { errors: [{ reason: 'Invalid Token' }] });
        const u = new URL(req.url!, 'http://x');
        if (req.method === 'GET' && u.pathname === '/v4/linode/instances') {
          const filter = JSON.parse(String(req.headers['x-filter'] ?? '{}')) as { label?: string };
          const data = instances.filter((i) => filter.label === undefined || i.label === filter.label);
          return send(200, { data, page: 1, pages: 1, results: data.length });
        }
        if (u.pathname === `/v4/networking/firewalls/${FIREWALL}/devices`) {
          if (req.method === 'GET') {
            // page size 1 on purpose: the attacher must follow `pages`
            const page = Number(u.searchParams.get('page') ?? 1);
            return send(200, {
              data: devices.slice(page - 1, page),
              page,
              pages: Math.max(devices.length, 1),
              results: devices.length,
            });
          }
          if (req.method === 'POST') {
            const d = JSON.parse(body) as { id: number; type: string };
            posts.push(d);
            if (d.type !== 'linode' || !instances.some((i) => i.id === d.id))
              return send(400, { errors: [{ reason: 'bad device' }] });
            if (devices.some((x) => x.entity.id === d.id))
              return send(400, { errors: [{ reason: 'already assigned' }] });
            const label = instances.find((i) => i.id === d.id)!.label;
            devices.push({ id: 900 + devices.length, entity: { id: d.id, type: 'linode', label } });
            return send(200, devices.at(-1));
          }
        }
        send(404, { errors: [{ reason: 'Not found' }] });
      });
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v4`;
  });
  afterAll(() => new Promise((r) => server.close(r)));
  beforeEach(() => {
    devices = [{ id: 1, entity: { id: 4000, type: 'linode', label: 'other' } }];
    posts = [];
  });

  const args = (nodeName: string) => ({ apiUrl: url, token: TOKEN, firewallId: FIREWALL, nodeName });

  it('attaches the node it runs on (found by its label), then finds it attached on the next check', async () => {
    expect(await attachNode(args('lke1234-5678-bbbb'))).toEqual({ instanceId: 5002, attached: 'now' });
    expect(posts).toEqual([{ id: 5002, type: 'linode' }]);
    // a second device page exists now: it must be read before deciding
    expect(await attachNode(args('lke1234-5678-bbbb'))).toEqual({ instanceId: 5002, attached: 'already' });
    expect(posts).toHaveLength(1);
  });

  it('a node that is no Linode fails loudly; a wrong token is refused by the stand-in', async () => {
    await expect(attachNode(args('not-a-linode'))).rejects.toThrow(/no Linode labelled "not-a-linode"/);
    await expect(attachNode({ ...args('lke1234-5678-aaaa'), token: 'wrong' })).rejects.toThrow(/HTTP 401/);
  });

  it('runs as the DaemonSet runs it (node firewall-attach.ts with its env) and keeps checking', async () => {
    const child = spawn(process.execPath, [new URL('./firewall-attach.ts', import.meta.url).pathname], {
      env: {
        PATH: process.env['PATH'],
        LINODE_API_URL: url,
        LINODE_TOKEN: TOKEN,
        SPACE_LKE_FIREWALL_ID: String(FIREWALL),
        NODE_NAME: 'lke1234-5678-aaaa',
        SPACE_LKE_FIREWALL_RECHECK_SECONDS: '0.2',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d));
    child.stderr.on('data', (d: Buffer) => (out += d));
    for (let i = 0; i < 100 && (out.match(/node firewall checked/g) ?? []).length < 2; i++)
      await new Promise((r) => setTimeout(r, 50));
    child.kill('SIGTERM');
    const lines = out
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { attached: string; instanceId: number });
    expect(lines.slice(0, 2).map((l) => l.attached)).toEqual(['now', 'already']);
    expect(lines[0]!.instanceId).toBe(5001);
  });
});
