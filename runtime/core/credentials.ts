/**
 * Credential grants: what the agent registers so the gateway can swap a sandbox's placeholder for a
 * real secret on intercepted TLS (docs/egress.md, Credentials; attack technique T20). The sandbox
 * only ever holds the placeholder, `space_ph_` + 32 base32 characters (160 random bits), minted per
 * sandbox and grant.
 * Pure apart from {@link mintPlaceholder}'s randomness.
 */
import { randomBytes } from 'node:crypto';
import { Type } from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';
import { matchesPattern, normaliseName, normalisePattern } from './egress.ts';
import { SpaceError } from './errors.ts';
import { DEFAULT_TEAM, TEAM_ID_PATTERN } from './tenancy.ts';

/** Prefix of every placeholder; anything in a request that starts with it is treated as one. */
export const PLACEHOLDER_PREFIX = 'space_ph_';
/**
 * Shape a grant's placeholder must have: `space_ph_` + 32 lower-case letters/digits. Covers both
 * {@link mintPlaceholder} (base32) and the API's current `newId('space_ph', 32)` alphabet.
 */
export const PLACEHOLDER_RE = /^space_ph_[a-z0-9]{32}$/;
/**
 * Anything that looks like a placeholder, for scanning requests. Deliberately wider than
 * {@link PLACEHOLDER_RE} (any case, any length, any alphanumerics) so a mangled or foreign token is
 * still caught and refused instead of being forwarded.
 */
export const PLACEHOLDER_SCAN_RE = /space_ph_[a-z0-9]*/gi;
/** The one marker `format` must contain exactly once. */
export const VALUE_MARKER = '{value}';
/** Shortest real value accepted: the gateway masks values in responses, which is meaningless for tiny ones. */
export const MIN_VALUE_LENGTH = 8;

/**
 * Headers a grant may not target: framing, routing and hop-by-hop headers the gateway rewrites or
 * strips itself (a credential there would be dropped or would change how the request is parsed).
 */
export const FORBIDDEN_GRANT_HEADERS: ReadonlySet<string> = new Set([
  'host',
  'content-length',
  'transfer-encoding',
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authorization',
  'http2-settings',
  'te',
  'trailer',
  'upgrade',
  'expect',
  'accept-encoding',
]);

const TOKEN = "^[!#$%&'*+.^_`|~0-9A-Za-z-]+$";
/** Visible ASCII and spaces/tabs inside (RFC 9110 field-value, no obs-text): no CR, LF, NUL or controls. */
const FIELD_VALUE = /^[\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?$/;
/** Control characters (tab allowed) anywhere in a value. */
// biome-ignore lint/suspicious/noControlCharactersInRegex: control characters are exactly what is refused
const CONTROL = /[\u0000-\u0008\u000a-\u001f\u007f]/;

/**
 * Wire schema of a credential grant (the agent's `PUT /v1/sandboxes/:address` body field and the
 * API→agent create body): which credential a sandbox holds and under which placeholder — never the
 * value. The gateway fetches the value (and the credential's current domains, header, format,
 * method/path limits) from the state of record when a request needs it, so revocation and rotation
 * reach it without any agent state changing.
 */
export const CredentialGrantSchema = Type.Object(
  {
    /** Operator's name of the credential (audit `rule`); never secret. */
    name: Type.String({ minLength: 1, maxLength: 128, pattern: '^[A-Za-z0-9][A-Za-z0-9._-]*$' }),
    /** The token the sandbox holds instead of the value; bound to this sandbox. */
    placeholder: Type.String({ pattern: PLACEHOLDER_RE.source }),
    /** Name patterns (policy syntax: `api.x.com` or `*.x.com`) the credential may be sent to. */
    domains: Type.Array(Type.String({ minLength: 1, maxLength: 1024 }), { minItems: 1, maxItems: 64 }),
    /** Header the value goes into, e.g. `authorization` (an RFC 9110 token). */
    header: Type.String({ minLength: 1, maxLength: 128, pattern: TOKEN }),
    /** How the header value is written; `{value}` appears exactly once, e.g. `Bearer {value}`. */
    format: Type.String({ minLength: VALUE_MARKER.length, maxLength: 1024 }),
    /**
     * The credential's generation when granted: a credential deleted and registered again under the
     * same name is a new generation, which this grant does not reach. Absent from N-1 senders.
     */
    generation: Type.Optional(Type.String({ minLength: 1, maxLength: 64 })),
    /**
     * The team whose credential this is (the gateway reads `keys.credential(team, name)`). Absent:
     * the default team (N-1 senders, and the default team's grants, so an N-1 agent takes them).
     */
    team: Type.Optional(Type.String({ pattern: TEAM_ID_PATTERN })),
    /** Sent by N-1 agents and APIs; accepted and dropped at once (values never travel to agents now). */
    value: Type.Optional(Type.String({ maxLength: 16384 })),
  },
  { additionalProperties: false },
);

/** A credential granted to one sandbox, as {@link validateGrants} returns it: no value, header lower case. */
export interface CredentialGrant {
  name: string;
  placeholder: string;
  /** Canonical domain patterns. */
  domains: string[];
  header: string;
  format: string;
  generation?: string;
  /** Owning team; absent = the default team. */
  team?: string;
}

/**
 * A credential as the state of record holds it (Redis hash `credential:<name>`): what the gateway
 * fetches when a request needs the value. `methods`/`paths` null = no limit.
 */
export interface CredentialSecret {
  name: string;
  generation: string;
  domains: string[];
  header: string;
  format: string;
  value: string;
  /** Upper-case methods the value may be sent with, or null for any. */
  methods: string[] | null;
  /** Path patterns (`/v1/x` exact, `/v1/*` prefix) the value may be sent to, or null for any. */
  paths: string[] | null;
}

/** Methods a credential may be limited to (RFC 9110 token, upper case). */
export const METHOD_RE = /^[A-Z][A-Z-]{0,31}$/;
/** A path pattern: starts with `/`, visible ASCII without `?`, `#`, `%`, `\`, `*` only as the last character. */
export const PATH_PATTERN_RE = /^\/[\x21-\x22\x24\x26-\x29\x2b-\x3e\x40-\x5b\x5d-\x7e]*\*?$/;

/**
 * The credential in a Redis hash (fields `name`, `generation`, `domains` JSON, `header`, `format`,
 * `value`, `methods`/`paths` JSON or absent), or null when the hash is empty or incomplete (deleted:
 * revoked). A hash written before generations existed reads as generation `legacy`. Pure.
 */
export function credentialFromHash(h: Record<string, string>): CredentialSecret | null {
  if (!h.name || !h.value) return null;
  const list = (text: string | undefined): string[] | null => {
    if (!text) return null;
    const v = JSON.parse(text) as unknown;
    return Array.isArray(v) ? v.map(String) : null;
  };
  return {
    name: h.name,
    generation: h.generation ?? 'legacy',
    domains: list(h.domains) ?? [],
    header: (h.header ?? 'authorization').toLowerCase(),
    format: h.format ?? 'Bearer {value}',
    value: h.value,
    methods: list(h.methods),
    paths: list(h.paths),
  };
}

/**
 * The path a server will route for `path` (origin-form; the query is cut off), percent-decoded, or
 * null when common routers could disagree about it (E15). Null for: anything but a `/`-led path of
 * visible ASCII; `;` (path parameters: Servlet containers — Tomcat, Jetty, Spring — drop `;…` from
 * each segment, so `/v1/..;/x` routes to `/x`); `\` (a separator on some servers); `%` not followed
 * by two hex digits (`%u002e` is IIS's dot); an escape of a separator, dot, `;`, `%` (double
 * encoding), a control character or invalid UTF-8 (overlong forms such as `%c0%ae`); an empty
 * segment (`//`, merged by many routers); a segment of dots and spaces only (`.`, `..`, `.. `,
 * `...`: dot segments per RFC 3986 §5.2.4, and the forms Windows servers trim to them); text that
 * Unicode NFKC normalisation changes (`%E2%80%A5` is `‥`, two dots under NFKC). A path that passes
 * has one reading. Pure.
 */
export function routedPath(path: string): string | null {
  const bare = path.split('?', 1)[0]!;
  if (!bare.startsWith('/') || !/^[\x21-\x7e]*$/.test(bare)) return null;
  if (/[;\\]/.test(bare)) return null;
  if (/%(?![0-9a-f]{2})/i.test(bare)) return null;
  if (/%(?:2f|5c|2e|3b|25|[01][0-9a-f]|7f)/i.test(bare)) return null;
  let decoded: string;
  try {
    decoded = decodeURIComponent(bare);
  } catch {
    return null; // invalid or overlong UTF-8
  }
  if (decoded.normalize('NFKC') !== decoded) return null;
  const segments = decoded.split('/').slice(1);
  // an empty last segment is a trailing slash; any other empty segment is a doubled slash
  if (segments.slice(0, -1).some((seg) => seg === '')) return null;
  if (segments.some((seg) => seg !== '' && /^[.\s]+$/.test(seg))) return null;
  return decoded;
}

/**
 * Request headers that make servers and frameworks route a request as another method (Rails, Spring's
 * HiddenHttpMethodFilter behind proxies, Google APIs, many REST stacks): with a method list, a request
 * carrying one is not the method it says.
 */
export const METHOD_OVERRIDE_HEADERS: ReadonlySet<string> = new Set([
  'x-http-method-override',
  'x-http-method',
  'x-method-override',
]);

/**
 * Whether `secret` may be sent with `method` to `path` (origin-form, query ignored). With a path
 * list, the path is first read as a server would route it ({@link routedPath}): a path with more
 * than one reading (path parameters, encoded separators or dots, doubled slashes, dot segments, …)
 * is never allowed, and the patterns are matched against the decoded path. Pure.
 */
export function credentialAllows(secret: CredentialSecret, method: string, path: string): boolean {
  if (secret.methods !== null && !secret.methods.includes(method.toUpperCase())) return false;
  if (secret.paths === null) return true;
  const routed = routedPath(path);
  if (routed === null) return false;
  return secret.paths.some((p) => (p.endsWith('*') ? routed.startsWith(p.slice(0, -1)) : routed === p));
}

/** `format` with `{value}` replaced by `value` (split/join: `$&`-style patterns in secrets stay literal). */
export function applyFormat(format: string, value: string): string {
  return format.split(VALUE_MARKER).join(value);
}

/** A fresh placeholder: `space_ph_` + 32 lower-case base32 characters from 20 random bytes. */
export function mintPlaceholder(): string {
  const alphabet = 'abcdefghijklmnopqrstuvwxyz234567';
  const bytes = randomBytes(20);
  let out = PLACEHOLDER_PREFIX;
  let bits = 0;
  let acc = 0;
  for (const byte of bytes) {
    acc = (acc << 8) | byte;
    bits += 8;
    while (bits >= 5) {
      bits -= 5;
      out += alphabet[(acc >> bits) & 31];
    }
    acc &= (1 << bits) - 1;
  }
  return out;
}

/** One problem of a grant list, with its property path (`/2/format`). Never contains a value. */
export interface GrantProblem {
  path: string;
  message: string;
}

function grantProblems(input: unknown, index: number): GrantProblem[] {
  const base = `/${index}`;
  if (!Value.Check(CredentialGrantSchema, input)) {
    // path and message only: TypeBox's error objects also carry the offending value (maybe the secret)
    return [...Value.Errors(CredentialGrantSchema, input)].map((e) => ({
      path: `${base}${e.path}`,
      message: e.message,
    }));
  }
  const problems: GrantProblem[] = [];
  if (FORBIDDEN_GRANT_HEADERS.has(input.header.toLowerCase())) {
    problems.push({ path: `${base}/header`, message: 'header is set or stripped by the gateway itself' });
  }
  if (input.format.split(VALUE_MARKER).length !== 2) {
    problems.push({ path: `${base}/format`, message: 'must contain {value} exactly once' });
  } else if (!FIELD_VALUE.test(applyFormat(input.format, 'x'))) {
    problems.push({
      path: `${base}/format`,
      message: 'not a valid header value (controls, non-ASCII or edge spaces)',
    });
  }
  input.domains.forEach((raw, i) => {
    if (normalisePattern(raw) === null) {
      problems.push({ path: `${base}/domains/${i}`, message: `not a host name or *.name pattern: ${raw}` });
    }
  });
  return problems;
}

/**
 * Problems of a credential's value under `format` (checked when an operator registers it), each
 * with a path under `base`. Never contains the value. Pure.
 */
export function valueProblems(format: string, value: string, base = ''): GrantProblem[] {
  const problems: GrantProblem[] = [];
  if (value.length < MIN_VALUE_LENGTH)
    problems.push({ path: `${base}/value`, message: `shorter than ${MIN_VALUE_LENGTH} characters` });
  if (CONTROL.test(value) || !FIELD_VALUE.test(applyFormat(format, value))) {
    problems.push({ path: `${base}/value`, message: 'not valid inside a header value' });
  }
  if (value.toLowerCase().includes(PLACEHOLDER_PREFIX)) {
    problems.push({ path: `${base}/value`, message: `must not contain ${PLACEHOLDER_PREFIX}` });
  }
  return problems;
}

/** Problems of optional method and path limits (see {@link CredentialSecret}). Pure. */
export function limitProblems(
  methods: readonly string[] | undefined,
  paths: readonly string[] | undefined,
): GrantProblem[] {
  const problems: GrantProblem[] = [];
  (methods ?? []).forEach((m, i) => {
    if (!METHOD_RE.test(m))
      problems.push({ path: `/methods/${i}`, message: 'not an upper-case method name' });
    else if (['CONNECT', 'TRACE', 'TRACK'].includes(m))
      problems.push({ path: `/methods/${i}`, message: `${m} is never forwarded` });
  });
  (paths ?? []).forEach((p, i) => {
    if (!PATH_PATTERN_RE.test(p) || p.split('/').some((seg) => seg === '.' || seg === '..'))
      problems.push({
        path: `/paths/${i}`,
        message: 'must start with /, hold no ? # % \\ or dot segments, and use * only at the end',
      });
  });
  return problems;
}

/**
 * Validates a sandbox's grant list all at once and returns it canonical (header lower case, domain
 * patterns normalised and deduplicated). Also refuses two grants with the same name or placeholder.
 * Throws one `SpaceError('BAD_REQUEST')` listing every problem by path; no message contains a value.
 */
export function validateGrants(input: unknown): CredentialGrant[] {
  if (!Array.isArray(input)) throw new SpaceError('BAD_REQUEST', 'credentials: must be an array');
  const problems = input.flatMap((g, i) => grantProblems(g, i));
  if (problems.length === 0) {
    const grants = input as CredentialGrant[];
    const seen = { name: new Set<string>(), placeholder: new Set<string>() };
    grants.forEach((g, i) => {
      for (const key of ['name', 'placeholder'] as const) {
        if (seen[key].has(g[key])) problems.push({ path: `/${i}/${key}`, message: `duplicate ${key}` });
        seen[key].add(g[key]);
      }
    });
  }
  if (problems.length > 0) {
    throw new SpaceError(
      'BAD_REQUEST',
      `credentials: ${problems.map((p) => `${p.path} ${p.message}`).join('; ')}`,
      { problems },
    );
  }
  // a value sent by an N-1 peer is dropped here: it never reaches agent state or gateway memory
  return (input as (CredentialGrant & { value?: string })[]).map((g) => ({
    name: g.name,
    placeholder: g.placeholder,
    domains: [...new Set(g.domains.map((d) => normalisePattern(d)!))],
    header: g.header.toLowerCase(),
    format: g.format,
    ...(g.generation === undefined ? {} : { generation: g.generation }),
    ...(g.team === undefined || g.team === DEFAULT_TEAM ? {} : { team: g.team }),
  }));
}

/**
 * The grants whose domains cover `sni` (normalised here too, so a raw claim can't slip past a
 * pattern). An invalid name is covered by nothing. Pure.
 */
export function grantsCovering(sni: string, grants: readonly CredentialGrant[]): CredentialGrant[] {
  const name = normaliseName(sni);
  if (name === null) return [];
  return grants.filter((g) =>
    g.domains.some((d) => {
      const pattern = normalisePattern(d);
      return pattern !== null && matchesPattern(name, pattern);
    }),
  );
}

/** A grant without its secret, for listings and logs. */
export function describeGrant(g: CredentialGrant): Omit<CredentialGrant, 'placeholder' | 'generation'> {
  return { name: g.name, domains: [...g.domains], header: g.header, format: g.format };
}
