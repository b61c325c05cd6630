import { Type } from '@sinclair/typebox';
import { Ajv } from 'ajv';
import Fastify from 'fastify';
import { describe, expect, it } from 'vitest';
import { nullable, stringEnum } from './json-schema.ts';

const ajv = new Ajv({ strict: false });

describe('json-schema builders', () => {
  it('stringEnum accepts exactly its values', () => {
    const check = ajv.compile(stringEnum(['warm', 'boot'] as const));
    expect([check('warm'), check('boot'), check('cold'), check(1), check(null)]).toEqual([
      true,
      true,
      false,
      false,
      false,
    ]);
  });

  it('nullable adds null, and keeps the schema’s own constraints', () => {
    const when = ajv.compile(nullable(Type.String({ format: 'date-time' })));
    expect([when(null), when('x'), when(3)]).toEqual([true, true, false]);
    const quota = ajv.compile(nullable(Type.Integer({ minimum: 0 })));
    expect([quota(null), quota(4), quota(-1), quota(1.5)]).toEqual([true, true, false, false]);
    const reason = ajv.compile(nullable(stringEnum(['a', 'b'] as const)));
    expect([reason(null), reason('a'), reason('c')]).toEqual([true, true, false]);
    const obj = ajv.compile(nullable(Type.Object({ code: Type.String() })));
    expect([obj(null), obj({ code: 'x' }), obj({}), obj([])]).toEqual([true, true, false, false]);
  });

  it('refuses a schema with no single type', () => {
    expect(() => nullable(Type.Union([Type.String(), Type.Integer()]))).toThrow(TypeError);
  });

  it('replies serialize as the unions did', async () => {
    const app = Fastify();
    const Reply = Type.Object({
      state: stringEnum(['running', 'paused'] as const),
      reason: nullable(stringEnum(['a', 'b'] as const)),
      pause: nullable(Type.Object({ mode: Type.String() })),
      endedAt: nullable(Type.String()),
    });
    const sent = [
      { state: 'running', reason: null, pause: null, endedAt: null },
      { state: 'paused', reason: 'b', pause: { mode: 'frozen', extra: 1 }, endedAt: 'then' },
    ];
    let i = 0;
    app.get('/', { schema: { response: { 200: Reply } } }, async () => sent[i++]);
    const a = await app.inject('/');
    const b = await app.inject('/');
    expect(a.json()).toEqual(sent[0]);
    // properties outside the schema are left out, as before
    expect(b.json()).toEqual({ ...sent[1], pause: { mode: 'frozen' } });
    await app.close();
  });
});
