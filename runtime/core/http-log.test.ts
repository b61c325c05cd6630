import { Writable } from 'node:stream';
import fastify, { type FastifyBaseLogger } from 'fastify';
import { afterEach, describe, expect, it } from 'vitest';
import { requestLogOptions } from './http-log.ts';
import { createLogger } from './log-fields.ts';

describe('one access-log line per request', () => {
  let lines: Record<string, unknown>[] = [];
  let close: (() => Promise<unknown>) | null = null;

  afterEach(async () => {
    await close?.();
    lines = [];
  });

  async function app() {
    // the services' own logger (redaction, serializers) writing into an array
    const sink = new Writable({
      write(chunk, _enc, cb) {
        for (const l of chunk.toString().split('\n').filter(Boolean)) lines.push(JSON.parse(l));
        cb();
      },
    });
    const a = fastify({
      loggerInstance: createLogger('t', 'info', {}, sink) as FastifyBaseLogger,
      ...requestLogOptions(),
    });
    a.get('/thing', async () => ({ ok: true }));
    a.get('/teapot', async (_req, reply) => reply.status(418).send({ no: true }));
    close = () => a.close();
    return a;
  }

  it('logs each answered request once, with method, redacted URL, status and time', async () => {
    const a = await app();
    await a.inject({ method: 'GET', url: '/thing?token=s3cr3t&x=1' });
    await a.inject({ method: 'GET', url: '/teapot' });
    const requestLines = lines.filter((l) => l.req !== undefined || l.res !== undefined);
    expect(requestLines).toHaveLength(2);
    const [first, second] = requestLines as Array<{
      msg: string;
      req: { method: string; url: string };
      res: { statusCode: number };
      responseTime: number;
      reqId: string;
    }>;
    if (!first || !second) throw new Error('two request lines expected');
    expect(first.msg).toBe('request completed');
    expect(first.req).toMatchObject({ method: 'GET', url: '/thing?token=[redacted]&x=1' });
    expect(first.res.statusCode).toBe(200);
    expect(first.responseTime).toBeGreaterThanOrEqual(0);
    expect(first.reqId).toBeTruthy();
    expect(second.res.statusCode).toBe(418);
    expect(JSON.stringify(lines)).not.toContain('s3cr3t');
    expect(lines.some((l) => l.msg === 'incoming request')).toBe(false);
  });
});
