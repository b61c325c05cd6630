/**
 * Declarative service configuration: each service declares its settings once (env name, type,
 * default with unit, allowed values, one-line doc), and {@link loadConfig} reads them from the
 * environment, validates all of them with TypeBox, reports every problem at once, and freezes
 * the result. The config tables of docs/configuration.md are generated from the same declarations.
 */
import {
  type Static,
  type TBoolean,
  type TInteger,
  type TLiteral,
  type TNumber,
  type TSchema,
  type TString,
  type TUnion,
  Type,
} from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';

/** One setting: the TypeBox schema gives the type, the rest documents it. */
export interface Setting<S extends TSchema = TSchema> {
  /** Environment variable, e.g. `SPACE_API_PORT`. */
  readonly env: string;
  readonly schema: S;
  /** Default value (already typed); absent means required. */
  readonly default?: unknown;
  /** One line for docs/configuration.md, with the unit ("ms", "MiB"). */
  readonly doc: string;
}

/** A service's settings, keyed by the property name the code uses. */
export type SettingsSpec = Record<string, Setting>;

/** The typed, frozen config object a spec produces. */
export type ConfigOf<S extends SettingsSpec> = {
  readonly [K in keyof S]: Static<S[K]['schema']>;
};

/** Thrown by {@link loadConfig} with every problem found, one per line. */
export class ConfigError extends Error {
  readonly problems: readonly string[];
  constructor(service: string, problems: string[]) {
    super(`invalid ${service} configuration:\n  ${problems.join('\n  ')}`);
    this.name = 'ConfigError';
    this.problems = problems;
  }
}

/** Shorthand constructors for the common setting types. */
export const setting = {
  string: (env: string, doc: string, def?: string): Setting<TString> => ({
    env,
    schema: Type.String({ minLength: 1 }),
    default: def,
    doc,
  }),
  /**
   * `SPACE_REDIS_URL`: one server (`redis://`, `rediss://`, a Unix socket path) or the primary that
   * Redis Sentinel names (`redis-sentinel://`); forms in runtime/core/redis-connection.ts.
   */
  redisUrl: (doc: string): Setting<TString> => ({
    env: 'SPACE_REDIS_URL',
    schema: Type.String({ pattern: '^(rediss?://|redis-sentinel://|/)' }),
    default: 'redis://127.0.0.1:6379',
    doc: `${doc} Forms: redis://[:password@]host:port[/db], rediss://…, /path/to/redis.sock, or redis-sentinel://[:password@]host:26379[,host:26379…]/<primary name>[/db] (failover through Redis Sentinel).`,
  }),
  optionalString: (env: string, doc: string): Setting<TString> => ({
    env,
    schema: Type.String(),
    default: '',
    doc,
  }),
  int: (
    env: string,
    doc: string,
    def: number | undefined,
    min = 0,
    max = Number.MAX_SAFE_INTEGER,
  ): Setting<TInteger> => ({
    env,
    schema: Type.Integer({ minimum: min, maximum: max }),
    default: def,
    doc,
  }),
  number: (env: string, doc: string, def: number, min = 0, max = Number.MAX_VALUE): Setting<TNumber> => ({
    env,
    schema: Type.Number({ minimum: min, maximum: max }),
    default: def,
    doc,
  }),
  bool: (env: string, doc: string, def: boolean): Setting<TBoolean> => ({
    env,
    schema: Type.Boolean(),
    default: def,
    doc,
  }),
  oneOf: <T extends string>(
    env: string,
    doc: string,
    values: readonly T[],
    def: T,
  ): Setting<TUnion<TLiteral<T>[]>> => ({
    env,
    schema: Type.Union(values.map((v) => Type.Literal(v))),
    default: def,
    doc,
  }),
};

/**
 * Reads `spec` from `env` (default `process.env`). Strings are converted to the declared types
 * (`"30"` → 30, `"true"` → true). Throws {@link ConfigError} listing every missing or bad value.
 */
export function loadConfig<S extends SettingsSpec>(
  service: string,
  spec: S,
  env: NodeJS.ProcessEnv = process.env,
): ConfigOf<S> {
  const out: Record<string, unknown> = {};
  const problems: string[] = [];
  for (const [key, s] of Object.entries(spec)) {
    const raw = env[s.env];
    if (raw === undefined || raw === '') {
      if (s.default === undefined) problems.push(`${s.env}: required (${s.doc})`);
      else out[key] = s.default;
      continue;
    }
    const value = Value.Convert(s.schema, raw);
    if (!Value.Check(s.schema, value)) {
      const first = Value.Errors(s.schema, value).First();
      problems.push(`${s.env}=${JSON.stringify(raw)}: ${first?.message ?? 'invalid'} (${s.doc})`);
      continue;
    }
    out[key] = value;
  }
  if (problems.length > 0) throw new ConfigError(service, problems);
  return Object.freeze(out) as ConfigOf<S>;
}

/** Rows for a config table of docs/configuration.md: env, default, doc. */
export function describeConfig(spec: SettingsSpec): { env: string; default: string; doc: string }[] {
  return Object.values(spec).map((s) => ({
    env: s.env,
    default: s.default === undefined ? '(required)' : s.default === '' ? '(empty)' : String(s.default),
    doc: s.doc,
  }));
}
