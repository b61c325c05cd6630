/**
 * Request validation for every SPACE HTTP service: bodies are checked strictly (a string is never
 * taken for a number, nor a number for a string: `{"vcpus": "1"}` is a 400, not a quiet cast),
 * while params, querystrings and headers — which arrive as text — are converted to their declared
 * types. Defaults from the schemas are applied; unknown properties are reported, never dropped.
 */
import { Ajv, type Options } from 'ajv';
import addFormatsModule from 'ajv-formats';
import type { FastifyInstance } from 'fastify';
import { SpaceError } from './errors.ts';

// ajv-formats is CommonJS; its default export is the function under ESM interop
const addFormats = addFormatsModule as unknown as (ajv: Ajv) => Ajv;

const common: Options = { useDefaults: true, removeAdditional: false, allErrors: false, strict: false };

/** Installs the strict-body / converting-text validator pair on `app`. */
export function installValidators(app: FastifyInstance): void {
  const strict = addFormats(new Ajv({ ...common, coerceTypes: false }));
  const converting = addFormats(new Ajv({ ...common, coerceTypes: 'array' }));
  app.setValidatorCompiler(({ schema, httpPart }) =>
    (httpPart === 'body' ? strict : converting).compile(schema as object),
  );
}

const strictBodies = addFormats(new Ajv({ ...common, coerceTypes: false }));
const bodyCheckers = new WeakMap<object, ReturnType<Ajv['compile']>>();

/**
 * Checks `value` as a route's body would be checked (strict, defaults applied in place), for a
 * body built in process rather than received (the E2B layer builds SPACE's create and egress bodies).
 * @throws SpaceError BAD_REQUEST with the message Fastify gives a body that fails its schema
 *   (`body/<path> <reason>`).
 */
export function checkBody(schema: object, value: unknown): void {
  let check = bodyCheckers.get(schema);
  if (!check) {
    check = strictBodies.compile(schema);
    bodyCheckers.set(schema, check);
  }
  if (check(value)) return;
  const message = (check.errors ?? [])
    .map((e) => `body${e.instancePath} ${e.message ?? 'is invalid'}`)
    .join(', ');
  throw new SpaceError('BAD_REQUEST', message || 'body is invalid');
}
