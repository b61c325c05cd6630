/**
 * Egress policy of one sandbox: its wire shape (TypeBox schema, also the API's `egress` field), name
 * normalisation and matching. Pure: no I/O, no clock.
 *
 * Matching rules (see docs/egress.md): names are normalised first (lower case, one trailing dot removed,
 * IDNA → punycode, must be a syntactically valid DNS name, never an IP literal); `a.b` matches only
 * `a.b`; `*.b` matches any name with at least one more label below `b` but not `b` itself; deny wins
 * over allow and over allow-all.
 */
import { isIP } from 'node:net';
import { domainToASCII } from 'node:url';
import { type Static, Type } from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';
import { SpaceError } from './errors.ts';
import { ipv4CidrProblem } from './net-address.ts';

/** Longest DNS name in presentation form without the trailing dot, bytes (RFC 1035). */
export const MAX_NAME_BYTES = 253;
/** Longest DNS label, bytes (RFC 1035). */
export const MAX_LABEL_BYTES = 63;

/** The three policy modes. */
export const EGRESS_MODES = ['deny-all', 'allow-list', 'allow-all'] as const;
export type EgressMode = (typeof EGRESS_MODES)[number];

/** Wire schema of an egress policy (every field optional on input; see {@link normalisePolicy}). */
export const EgressPolicySchema = Type.Object(
  {
    mode: Type.Optional(Type.Union(EGRESS_MODES.map((m) => Type.Literal(m)))),
    allow: Type.Optional(Type.Array(Type.String({ maxLength: 1024 }), { maxItems: 1000 })),
    deny: Type.Optional(Type.Array(Type.String({ maxLength: 1024 }), { maxItems: 1000 })),
    cidrs: Type.Optional(
      Type.Array(
        Type.Object(
          {
            cidr: Type.String({ maxLength: 18 }),
            ports: Type.Array(Type.Integer({ minimum: 1, maximum: 65535 }), { minItems: 1, maxItems: 64 }),
          },
          { additionalProperties: false },
        ),
        { maxItems: 256 },
      ),
    ),
  },
  { additionalProperties: false },
);

/** An egress policy as a client sends it (fields may be absent). */
export type EgressPolicyInput = Static<typeof EgressPolicySchema>;

/** A normalised egress policy: every field present, every name pattern canonical. */
export interface EgressPolicy {
  /** Default `allow-list`; an empty allow list means no egress by name. */
  mode: EgressMode;
  /** Canonical patterns: `pypi.org` (exact) or `*.pythonhosted.org` (any depth below, not the apex). */
  allow: string[];
  /** Same syntax; deny wins over allow and over allow-all. */
  deny: string[];
  /** Direct TCP to these IPv4 ranges and ports (enforced by nftables in the agent, not here). */
  cidrs: { cidr: string; ports: number[] }[];
}

const LABEL = /^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$/;

/**
 * Canonical form of a host name, or `null` when it is not a valid DNS name (fails closed).
 * Lower case, at most one trailing dot removed, Unicode → punycode (`url.domainToASCII`), labels of
 * 1–63 letters/digits/`-`/`_` (no leading/trailing `-`), total ≤ 253 bytes. IP literals (any form the
 * WHATWG host parser accepts, e.g. `127.1`, `0x7f.0.0.1`, `[::1]`) and names whose last label is
 * numeric return `null`. Pure.
 */
export function normaliseName(raw: string): string | null {
  if (typeof raw !== 'string' || raw.length === 0 || raw.length > MAX_NAME_BYTES + 1) return null;
  // characters that change what the host parser sees (userinfo, port, path, brackets, escapes, controls)
  // biome-ignore lint/suspicious/noControlCharactersInRegex: control characters are exactly what is refused
  if (/[\u0000-\u0020\u007f@:/\\[\]%?#*]/.test(raw)) return null;
  let name = raw.endsWith('.') ? raw.slice(0, -1) : raw;
  if (name.length === 0) return null;
  if (isIP(name) !== 0) return null;
  name = domainToASCII(name.toLowerCase());
  if (name === '' || isIP(name) !== 0) return null;
  if (name.length > MAX_NAME_BYTES) return null;
  const labels = name.split('.');
  for (const label of labels) {
    if (label.length > MAX_LABEL_BYTES || !LABEL.test(label)) return null;
  }
  if (/^[0-9]+$/.test(labels[labels.length - 1]!)) return null;
  return name;
}

/**
 * Canonical form of a policy pattern (`name` or `*.name`), or `null` when malformed. `*` alone, a
 * `*` anywhere else, or a pattern whose name part is invalid are refused. Pure.
 */
export function normalisePattern(raw: string): string | null {
  if (typeof raw !== 'string') return null;
  const wildcard = raw.startsWith('*.');
  const name = normaliseName(wildcard ? raw.slice(2) : raw);
  if (name === null) return null;
  return wildcard ? `*.${name}` : name;
}

/** True when canonical `name` matches canonical `pattern` (label boundary for wildcards). Pure. */
export function matchesPattern(name: string, pattern: string): boolean {
  if (pattern.startsWith('*.')) return name.endsWith(pattern.slice(1));
  return name === pattern;
}

/** The first pattern of `patterns` that matches `name`, or undefined. Pure. */
export function findMatch(name: string, patterns: readonly string[]): string | undefined {
  return patterns.find((p) => matchesPattern(name, p));
}

/** Outcome of {@link decideName}: `rule` names what decided, for the audit log. */
export type NameDecision =
  | { allowed: true; rule: string }
  | { allowed: false; rule: string; reason: 'policy-deny' | 'deny-all' | 'not-allowed' };

/**
 * Decides a canonical name against a normalised policy: deny entries first (win over everything),
 * then the mode, then the allow list. Pure.
 */
export function decideName(policy: EgressPolicy, name: string): NameDecision {
  const denied = findMatch(name, policy.deny);
  if (denied !== undefined) return { allowed: false, rule: `deny:${denied}`, reason: 'policy-deny' };
  switch (policy.mode) {
    case 'deny-all':
      return { allowed: false, rule: 'mode:deny-all', reason: 'deny-all' };
    case 'allow-all':
      return { allowed: true, rule: 'mode:allow-all' };
    case 'allow-list': {
      const allowed = findMatch(name, policy.allow);
      return allowed !== undefined
        ? { allowed: true, rule: `allow:${allowed}` }
        : { allowed: false, rule: 'default', reason: 'not-allowed' };
    }
    default: {
      const never: never = policy.mode;
      throw new Error(`unknown mode ${String(never)}`);
    }
  }
}

/**
 * Validates and normalises a client's policy: defaults filled (`allow-list`, empty lists), every
 * pattern canonical and deduplicated, CIDRs checked. Throws `SpaceError('BAD_REQUEST')` listing every
 * bad entry (property path and value) at once. Pure.
 */
export function normalisePolicy(input: EgressPolicyInput | undefined): EgressPolicy {
  const value = input ?? {};
  if (!Value.Check(EgressPolicySchema, value)) {
    const first = Value.Errors(EgressPolicySchema, value).First();
    throw new SpaceError('BAD_REQUEST', `egress policy: ${first?.path ?? ''} ${first?.message ?? 'invalid'}`);
  }
  const problems: string[] = [];
  const patterns = (field: 'allow' | 'deny'): string[] => {
    const out = new Set<string>();
    (value[field] ?? []).forEach((raw, i) => {
      const p = normalisePattern(raw);
      if (p === null)
        problems.push(`/${field}/${i} ${JSON.stringify(raw)}: not a host name or *.name pattern`);
      else out.add(p);
    });
    return [...out];
  };
  const allow = patterns('allow');
  const deny = patterns('deny');
  const cidrs = (value.cidrs ?? []).map((c, i) => {
    const problem = ipv4CidrProblem(c.cidr);
    if (problem) problems.push(`/cidrs/${i}/cidr ${JSON.stringify(c.cidr)}: ${problem}`);
    return { cidr: c.cidr, ports: [...new Set(c.ports)].sort((a, b) => a - b) };
  });
  if (problems.length > 0) {
    throw new SpaceError('BAD_REQUEST', `egress policy: ${problems.join('; ')}`, { problems });
  }
  return { mode: value.mode ?? 'allow-list', allow, deny, cidrs };
}
