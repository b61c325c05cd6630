/**
 * Templates with a start command and a ready check (runtime/agent/instances/template-start.ts):
 * a sandbox of such a template is `running` only once its server answers, whether it was booted
 * (the start runs, then the ready check), restored from the template's snapshot (taken after
 * ready) or claimed warm (a slot restored from that snapshot); a start that is never ready is a
 * create error with a stable code, its message naming what the start printed, and nothing of the
 * instance is left. The templates are `from` base (no build of their own), in a definitions
 * folder of the test's (SPACE_TEMPLATES_DIR).
 */
import { copyFile, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEFAULT_TEMPLATES_DIR } from '../runtime/agent/image/templates.ts';
import { leftovers, NO_LEFTOVERS, type Stack, startStack, waitFor } from './stack.ts';

/** A server that starts listening 2 s after it is started (so a create that does not wait for ready would see it closed). */
const SERVED = {
  name: 'served',
  from: 'base',
  startCmd:
    'echo slow-start; sleep 2; echo listening; exec python3 -m http.server 8000 --bind 0.0.0.0 --directory /etc',
  readyCmd: 'curl -sf -o /dev/null http://127.0.0.1:8000/hostname',
  readyTimeoutSec: 60,
};
/** The same kind of server, checked by its port. */
const SERVED_PORT = {
  name: 'served-port',
  from: 'base',
  startCmd: 'sleep 1; exec python3 -m http.server 8001 --bind 127.0.0.1',
  readyPort: 8001,
};
/** A start that dies at once: its ready check never passes. */
const STUCK = {
  name: 'stuck',
  from: 'base',
  startCmd: 'echo "config file /nope missing" >&2; exit 3',
  readyPort: 8002,
  readyTimeoutSec: 3,
};

describe('templates with a start command', () => {
  let s: Stack;
  let defs: string;
  beforeAll(async () => {
    defs = await mkdtemp(join(tmpdir(), 'space-defs-'));
    await copyFile(join(DEFAULT_TEMPLATES_DIR, 'base.json'), join(defs, 'base.json'));
    for (const d of [SERVED, SERVED_PORT, STUCK])
      await writeFile(join(defs, `${d.name}.json`), JSON.stringify(d));
    s = await startStack({
      SPACE_TEMPLATES_DIR: defs,
      SPACE_WARM_TEMPLATES: 'served',
      SPACE_WARM_POOL_SIZE: '1',
    });
  }, 600_000);
  afterAll(async () => {
    if (s) {
      await s.stop();
      expect(await leftovers(s)).toEqual(NO_LEFTOVERS);
    }
    if (defs) await rm(defs, { recursive: true, force: true });
  });

  const createdFrom = async (id: string) =>
    (await s.call<{ createdFrom: string }>('GET', `/v1/sandboxes/${id}`)).body.createdFrom;
  /** Asks for pause/resume and waits for its operation; returns the operation's state. */
  const lifecycle = async (id: string, verb: 'pause' | 'resume') => {
    const res = await s.call<{ operation: { id: string } }>('POST', `/v1/sandboxes/${id}/${verb}`);
    expect(res.status).toBe(202);
    return (await s.call<{ state: string }>('GET', `/v1/operations/${res.body.operation.id}?waitMs=60000`))
      .body.state;
  };
  /** Status code of one request to the sandbox's own server, from inside it (no retry). */
  const fetchInside = async (id: string, port: number) =>
    (
      await s.exec(id, {
        cmd: 'curl',
        args: ['-s', '-o', '/dev/null', '-w', '%{http_code}', `http://127.0.0.1:${port}/`],
      })
    ).stdout.toString();

  it('a start that is never ready fails the create with TEMPLATE_START_FAILED and leaves nothing', async () => {
    // first, with the warm slot made and nothing else starting: every new instance is the create's
    await waitFor(
      'a warm slot',
      async () => (s.agent.warm.counts()['served'] === 1 ? true : undefined),
      180_000,
    );
    const before = new Set(s.instanceIds);
    const res = await s.call<{ operation: { id: string } }>('POST', '/v1/sandboxes', { template: 'stuck' });
    expect(res.status).toBe(202);
    const op = await waitFor(
      'the create to end',
      async () => {
        const r = await s.call<{ state: string; error: { code: string; message: string } | null }>(
          'GET',
          `/v1/operations/${res.body.operation.id}?waitMs=5000`,
        );
        return r.body.state === 'failed' || r.body.state === 'succeeded' ? r.body : undefined;
      },
      60_000,
    );
    expect(op.state).toBe('failed');
    expect(op.error?.code).toBe('TEMPLATE_START_FAILED');
    expect(op.error?.message).toContain('config file /nope missing');
    // the instance the create made: its folder, cgroups, namespace and rules are gone
    const made = [...s.instanceIds].filter((i) => !before.has(i));
    expect(made.length).toBeGreaterThan(0);
    const instances = await readdir(join(s.dir, 'agent', 'driver', 'instances'));
    expect(instances.filter((i) => made.includes(i))).toEqual([]);
    const left = await leftovers({
      dir: join(s.dir, 'none'),
      pool: '10.255.0.0/16',
      instanceIds: new Set(made),
    });
    expect({ cgroups: left.cgroups, netns: left.netns, chains: left.chains }).toEqual({
      cgroups: [],
      netns: [],
      chains: [],
    });
  }, 120_000);

  it('a booted sandbox is running only once its ready check passed (readyCmd and readyPort)', async () => {
    // a shape no warm slot or snapshot has: a boot, the start and the ready check
    const id = await s.createSandbox({ template: 'served', memoryMiB: 384 });
    expect(await createdFrom(id)).toBe('boot');
    expect(await fetchInside(id, 8000)).toBe('200');
    const log = await s.exec(id, { cmd: 'cat', args: ['/tmp/space-start.log'] });
    expect(log.stdout.toString()).toContain('slow-start\nlistening\n');
    const byPort = await s.createSandbox({ template: 'served-port' });
    expect(await createdFrom(byPort)).toBe('boot');
    expect(await fetchInside(byPort, 8001)).toBe('200');
  }, 120_000);

  it('a warm claim and a snapshot restore hand out a server that is listening already', async () => {
    await waitFor(
      'a warm slot',
      async () => (s.agent.warm.counts()['served'] === 1 ? true : undefined),
      180_000,
    );
    const warm = await s.createSandbox({ template: 'served' });
    expect(await createdFrom(warm)).toBe('warm');
    expect(await fetchInside(warm, 8000)).toBe('200');
    // the pool is empty now (its refill takes a while): the warm shape restores from the snapshot
    const restored = await s.createSandbox({ template: 'served' });
    expect(['snapshot', 'warm']).toContain(await createdFrom(restored));
    expect(await fetchInside(restored, 8000)).toBe('200');
    // the server is the sandbox's own process: it survives a pause like any other
    expect(await lifecycle(warm, 'pause')).toBe('succeeded');
    expect(await lifecycle(warm, 'resume')).toBe('succeeded');
    expect(await fetchInside(warm, 8000)).toBe('200');
  }, 300_000);
});
