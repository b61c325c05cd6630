/**
 * Node replacement on Kubernetes (issue 42 item 4): a cordoned node drains. Every agent pod runs a
 * cordon watcher that keeps the agent's SPACE_DRAIN_FILE in place while its Node is cordoned
 * (checked here against a loopback stand-in of the Kubernetes API that answers as the real one:
 * `GET /api/v1/nodes/{name}` with a bearer token, `spec.unschedulable` when cordoned); the agent
 * then takes no new sandbox and, at SIGTERM, waits its drain budget for its sandboxes to end
 * (test/drain.int.test.ts runs that part with a real agent).
 */
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DRAIN_FILE } from './agent.ts';
import { checkCordon } from './cordon-watch.ts';
import { renderRuntimeObjects } from './runtime.ts';
import { args, containers, type Obj, podSpec, rendered } from './test-runtime.ts';

describe('a cordoned node drains', () => {
  const { agents, byKind, workloads, envOf, mounts, container } = rendered(args({ agentDrainSeconds: 300 }));

  it('the agent gets the drain file and its drain budget as the wait, inside its grace period', () => {
    for (const a of agents) {
      const env = envOf(container(a, 'agent'));
      expect(env['SPACE_DRAIN_FILE']).toBe(DRAIN_FILE);
      expect(env['SPACE_DRAIN_WAIT_MS']).toBe('300000');
      expect(podSpec(a)['terminationGracePeriodSeconds']).toBe(330);
      // the agent only reads the drain file; the watcher writes it
      expect(mounts(container(a, 'agent')).find((m) => m['name'] === 'drain')?.['readOnly']).toBe(true);
      expect(
        mounts(container(a, 'cordon-watch')).find((m) => m['name'] === 'drain')?.['readOnly'],
      ).toBeUndefined();
      expect(envOf(container(a, 'cordon-watch'))['SPACE_DRAIN_FILE']).toBe(DRAIN_FILE);
    }
  });

  it('only the watcher holds an API token, and the agent’s account may only get nodes', () => {
    for (const w of workloads)
      for (const c of containers(w))
        if (mounts(c).some((m) => m['name'] === 'api-token')) expect(c['name']).toBe('cordon-watch');
    const [role] = byKind('ClusterRole');
    expect(role!['rules']).toEqual([{ apiGroups: [''], resources: ['nodes'], verbs: ['get'] }]);
    const [binding] = byKind('ClusterRoleBinding');
    expect(binding!['subjects']).toEqual([
      { kind: 'ServiceAccount', name: 'space-agent', namespace: 'space' },
    ]);
    expect((binding!['roleRef'] as Obj)['name']).toBe((role!['metadata'] as Obj)['name']);
    // applied after its role
    const out = renderRuntimeObjects(args());
    expect(out.find((r) => r.object['kind'] === 'ClusterRoleBinding')!.after).toEqual(['node-reader']);
  });

  describe('the watcher against a loopback Kubernetes API', () => {
    const TOKEN = 'projected-token-1';
    let server: Server;
    let url = '';
    let unschedulable: boolean | undefined;
    const dir = mkdtempSync(join(tmpdir(), 'space-cordon-'));
    const file = join(dir, 'draining');
    beforeAll(async () => {
      server = createServer((req, res) => {
        const send = (status: number, body: unknown) => {
          res.writeHead(status, { 'content-type': 'application/json' });
          res.end(JSON.stringify(body));
        };
        if (req.headers.authorization !== `Bearer ${TOKEN}`)
          return send(401, { kind: 'Status', status: 'Failure', reason: 'Unauthorized', code: 401 });
        if (req.method !== 'GET' || req.url !== '/api/v1/nodes/lke1-node-a')
          return send(404, { kind: 'Status', status: 'Failure', reason: 'NotFound', code: 404 });
        send(200, {
          kind: 'Node',
          apiVersion: 'v1',
          metadata: { name: 'lke1-node-a' },
          spec: unschedulable === undefined ? {} : { unschedulable },
        });
      });
      await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
      url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    });
    afterAll(() => {
      server.close();
      rmSync(dir, { recursive: true, force: true });
    });
    const check = (token = TOKEN, nodeName = 'lke1-node-a') =>
      checkCordon({ apiUrl: url, token: () => `${token}\n`, nodeName, file });

    it('cordoned: the file appears; uncordoned (or never cordoned): it goes', async () => {
      unschedulable = undefined;
      expect(await check()).toBe(false);
      expect(existsSync(file)).toBe(false);
      unschedulable = true;
      expect(await check()).toBe(true);
      expect(existsSync(file)).toBe(true);
      unschedulable = false;
      expect(await check()).toBe(false);
      expect(existsSync(file)).toBe(false);
    });

    it('an API error throws and leaves the file as the last answer left it', async () => {
      writeFileSync(file, 'cordoned\n');
      await expect(check('wrong-token')).rejects.toThrow(/HTTP 401/);
      await expect(check(TOKEN, 'other-node')).rejects.toThrow(/HTTP 404/);
      expect(existsSync(file)).toBe(true);
    });
  });
});
