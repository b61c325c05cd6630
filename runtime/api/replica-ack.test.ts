/**
 * Writes that must survive a failover (issue 44 item 2): with SPACE_REDIS_WAIT_REPLICAS the API
 * answers a changing request only once a replica holds its writes, and 503 WRITE_NOT_REPLICATED
 * when none does; a primary refusing writes for want of replicas (NOREPLICAS) or a demoted one
 * (READONLY) is a transient store outage, not an internal error. Real redis-server processes.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort, startRedisServer } from '../../test/redis-server.ts';
import { SpaceError } from '../core/errors.ts';
import { isRedisUnavailable } from '../core/redis-errors.ts';
import { awaitReplicas } from '../core/replica-ack.ts';
import { startTestApi } from './test-app.ts';

describe('a changing request with SPACE_REDIS_WAIT_REPLICAS', () => {
  it('is answered 503 WRITE_NOT_REPLICATED when no replica acknowledges, and as before when off', async () => {
    const server = await startRedisServer(); // one server: WAIT answers 0
    try {
      for (const [replicas, want] of [
        ['1', 503],
        ['0', 202],
      ] as const) {
        const api = await startTestApi(server.url, 0, {
          env: { SPACE_REDIS_WAIT_REPLICAS: replicas, SPACE_REDIS_WAIT_TIMEOUT_MS: '50' },
        });
        try {
          await api.addNode({ id: 'n1' });
          const auth = { authorization: `Bearer ${api.key}` };
          const res = await api.app.inject({
            method: 'POST',
            url: '/v1/sandboxes',
            headers: auth,
            payload: { template: 'base' },
          });
          expect(res.statusCode, res.body).toBe(want);
          if (want === 503) {
            expect(res.json().error.code).toBe('WRITE_NOT_REPLICATED');
            expect(res.json().error.details).toMatchObject({ replicas: 1, acknowledged: 0, timeoutMs: 50 });
            expect(res.headers['retry-after']).toBe('2');
          }
          // reads never wait
          expect(
            (await api.app.inject({ method: 'GET', url: '/v1/sandboxes', headers: auth })).statusCode,
          ).toBe(200);
        } finally {
          await api.close();
        }
      }
    } finally {
      await server.stop();
    }
  });
});

describe('a primary with a replica', () => {
  let dir: string;
  const procs: ChildProcess[] = [];
  let primaryPort: number;
  let replicaPort: number;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'space-replica-ack-'));
    [primaryPort, replicaPort] = [await freePort(), await freePort()];
    const base = ['--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir];
    const start = (args: string[]) => {
      const p = spawn('redis-server', [...base, ...args], { stdio: 'ignore' });
      procs.push(p);
    };
    start(['--port', String(primaryPort), '--min-replicas-to-write', '1', '--min-replicas-max-lag', '2']);
    start([
      '--port',
      String(replicaPort),
      '--replicaof',
      '127.0.0.1',
      String(primaryPort),
      '--dbfilename',
      'r.rdb',
    ]);
    const p = new Redis(primaryPort, '127.0.0.1');
    p.on('error', () => {});
    try {
      for (let i = 0; i < 100; i++) {
        const info = await p.info('replication').catch(() => '');
        if (/min_slaves_good_slaves:1/.test(info)) break;
        await sleep(100);
      }
    } finally {
      p.disconnect();
    }
  }, 30_000);
  afterAll(async () => {
    for (const p of procs) {
      if (p.exitCode === null && p.signalCode === null) {
        p.kill('SIGKILL');
        await once(p, 'exit');
      }
    }
    await rm(dir, { recursive: true, force: true });
  });

  it('acknowledges a write on the replica; a lost replica makes WAIT fail coded, writes NOREPLICAS and transactions EXECABORT', async () => {
    const primary = new Redis(primaryPort, '127.0.0.1');
    const replica = new Redis(replicaPort, '127.0.0.1');
    replica.on('error', () => {});
    try {
      await primary.set('k', 'v');
      await awaitReplicas(primary, { replicas: 1, timeoutMs: 2000 });
      expect(await replica.get('k')).toBe('v');
      // a write to a replica (what a client holding a demoted primary meets) is a transient outage
      const readonly = await replica.set('k', 'x').catch((e: unknown) => e);
      expect(String(readonly)).toMatch(/^ReplyError: READONLY/);
      expect(isRedisUnavailable(readonly)).toBe(true);
      // the replica goes: WAIT times out with fewer acknowledgements, then the primary refuses writes
      procs[1]!.kill('SIGKILL');
      await once(procs[1]!, 'exit');
      const err = await awaitReplicas(primary, { replicas: 1, timeoutMs: 100 }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(SpaceError);
      expect((err as SpaceError).code).toBe('WRITE_NOT_REPLICATED');
      let refused: unknown = null;
      for (let i = 0; i < 60 && refused === null; i++) {
        refused = await primary.set('k', 'y').then(
          () => null,
          (e: unknown) => e,
        );
        if (refused === null) await sleep(100);
      }
      expect(String(refused)).toMatch(/^ReplyError: NOREPLICAS/);
      expect(isRedisUnavailable(refused)).toBe(true);
      // a transaction's writes are refused as they are queued, and EXEC aborts: the same outage
      const aborted = await primary
        .multi()
        .set('a', '1')
        .set('b', '2')
        .exec()
        .catch((e: unknown) => e);
      expect(String(aborted)).toMatch(/EXECABORT/);
      expect(isRedisUnavailable(aborted)).toBe(true);
    } finally {
      primary.disconnect();
      replica.disconnect();
    }
  }, 30_000);
});
