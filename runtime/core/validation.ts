/**
 * Request validation for every SPACE HTTP service: bodies are checked strictly (a string is never
 * taken for a number, nor a number for a string: `{"vcpus": "1"}` is a 400, not a quiet cast),
 * while params, querystrings and headers — which arrive as text — are converted to their declared
 * types. Defaults from the schemas are applied; unknown properties are reported, never dropped.
 */
import { Ajv, type Options } from 'ajv';
import addFormatsModule from 'ajv-formats';
import type { FastifyInstance } from 'fastify';

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
