/**
 * TypeBox builders for the schemas of HTTP routes, written so that both Ajv (request validation)
 * and fast-json-stringify (Fastify's reply serializer) handle them without a union.
 *
 * Why: fast-json-stringify serializes an `anyOf` (what `Type.Union` makes) by validating the value
 * against each branch with Ajv until one matches, and compiles each branch's validator the first
 * time a reply needs it. The API's first create after a start spent ~110 ms of CPU compiling them
 * for the sandbox and operation replies (a CPU profile of one create on a fresh `space up`,
 * 2-core VM, 2026-12-04), and each route paid again on its own first reply: that time lands on
 * the first burst after a deploy. A `type` list and an `enum` are serialized by inline checks, and
 * validate the same values as the unions they replace.
 *
 * Not for schemas checked with TypeBox's own `Value.Check` (it does not know `Unsafe` schemas).
 */
import { type Static, type TSchema, type TUnsafe, Type } from '@sinclair/typebox';

/** A string that is one of `values` (`{ type: 'string', enum }`); its static type is their union. */
export function stringEnum<const T extends readonly string[]>(
  values: T,
  opts: { description?: string } = {},
): TUnsafe<T[number]> {
  return Type.Unsafe<T[number]>({ ...opts, type: 'string', enum: [...values] });
}

/**
 * `schema` or null, as a `type` list (`{ ...schema, type: [schema.type, 'null'] }`, null added to
 * an `enum`). Its static type is `Static<schema> | null`.
 * @throws TypeError when `schema` has no single `type` (a union, `Unknown`): it cannot be listed.
 */
export function nullable<S extends TSchema>(schema: S): TUnsafe<Static<S> | null> {
  const type: unknown = schema.type;
  if (typeof type !== 'string') throw new TypeError('nullable() needs a schema with a single `type`');
  const out: Record<string, unknown> = { ...schema, type: [type, 'null'] };
  if (Array.isArray(schema.enum)) out.enum = [...schema.enum, null];
  return Type.Unsafe<Static<S> | null>(out);
}
