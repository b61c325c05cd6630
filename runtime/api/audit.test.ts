/** AuditLog against a real Redis: paging hands out a cursor only when older entries follow. */

import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import pino from 'pino';
import { afterAll, describe, expect, inject, it } from 'vitest';
import { AuditLog } from './audit.ts';

const redis = new Redis(inject('redisUrl'), { db: 8 });
afterAll(() => redis.disconnect());

describe('AuditLog.list', () => {
  it('a full last page has no cursor; one entry more gives one', async () => {
    const audit = new AuditLog(redis, pino({ level: 'silent' }), { retentionSec: 3600, maxEntries: 1000 });
    const team = `t${randomUUID().slice(0, 8)}`; // a team of its own: no flush needed
    const entry = (i: number) => ({
      team,
      keyId: 'k',
      action: 'POST /v1/sandboxes',
      target: `sbx${i}`,
      result: 'ok' as const,
      status: 201,
      code: null,
    });
    for (let i = 0; i < 6; i++) await audit.record(entry(i), 1_000 + i);
    const first = await audit.list(team, { limit: 3 });
    expect(first.entries.map((e) => e.target)).toEqual(['sbx5', 'sbx4', 'sbx3']);
    const second = await audit.list(team, { limit: 3, before: first.nextCursor! });
    expect([second.entries.map((e) => e.target), second.nextCursor]).toEqual([
      ['sbx2', 'sbx1', 'sbx0'],
      null,
    ]);
    expect((await audit.list(team, { limit: 6 })).nextCursor).toBeNull();
    expect((await audit.list(team, { limit: 5 })).nextCursor).not.toBeNull();
  });
});
