/**
 * The audit trail: every egress decision is one pino line `egress allow` or `egress deny` with
 * `sandbox.id`, `name`, `address`, `port`, `rule`, `reason` (and `protocol`, `source`), plus
 * Prometheus counters. Credential values never pass through here.
 */
import type { Logger } from 'pino';
import { Counter, collectDefaultMetrics, Gauge, Registry } from 'prom-client';
import { F } from '../core/log-fields.ts';

/** The three proxied protocols. */
export type Protocol = 'dns' | 'tls' | 'http';

/** Why something was refused or closed (bounded: it is a metrics label). */
export type DenyReason =
  | 'unregistered-source'
  | 'policy-deny'
  | 'deny-all'
  | 'not-allowed'
  | 'invalid-name'
  | 'ip-literal'
  | 'no-sni'
  | 'not-tls'
  | 'malformed-hello'
  | 'hello-too-large'
  | 'handshake-timeout'
  | 'malformed-http'
  | 'missing-host'
  | 'host-mismatch'
  | 'bad-port'
  | 'method-not-allowed'
  | 'upgrade-unsupported'
  | 'unsupported-query'
  | 'malformed-query'
  | 'name-too-long'
  | 'rate-limited'
  | 'connection-limit'
  | 'resolved-to-denied-address'
  | 'resolution-failed'
  | 'upstream-unreachable'
  | 'credential-interception-unavailable'
  | 'host-sni-mismatch'
  | 'placeholder-not-bound'
  | 'upstream-certificate'
  | 'policy-changed'
  | 'sandbox-removed'
  | 'idle-timeout'
  | 'byte-limit'
  | 'duplicate-host'
  | 'ambiguous-framing'
  | 'malformed-response'
  | 'connection-rate'
  | 'handshake-limit'
  | 'cname-denied'
  | 'denied-name-address'
  | 'sni-changed'
  | 'malformed-handshake';

/** Reasons an already-allowed connection is cut that are worth an `egress close` audit line. */
export const AUDITED_CLOSES: ReadonlySet<DenyReason> = new Set([
  'policy-changed',
  'sandbox-removed',
  'idle-timeout',
  'byte-limit',
  'sni-changed',
  'malformed-handshake',
]);

/** One decision: what was asked, by whom, and what decided it. */
export interface Decision {
  protocol: Protocol;
  /** Source address of the client (the sandbox's registered address, or an unknown one). */
  source: string;
  sandboxId: string | null;
  /** Canonical name asked for (or the raw claim when it failed to normalise), if any. */
  name: string | null;
  /** The upstream address chosen by the gateway (allow) or refused (deny), if any. */
  address: string | null;
  port: number | null;
  /** The policy entry that decided (`allow:pypi.org`, `deny:*.x.com`, `mode:allow-all`, `default`), if any. */
  rule: string | null;
}

/** Prometheus metrics of the gateway. */
export interface GatewayMetrics {
  registry: Registry;
  decisions: Counter<'protocol' | 'decision' | 'reason'>;
  connections: Gauge<'protocol'>;
  closed: Counter<'protocol' | 'reason'>;
}

/** The audit sink every proxy path writes to. */
export interface Audit {
  /** Logs `egress allow` and counts it. */
  allow(d: Decision): void;
  /** Logs `egress deny` with `reason` and counts it; `quiet` counts without logging (floods). */
  deny(d: Decision & { reason: DenyReason }, quiet?: boolean): void;
  /** Logs `egress close` for a connection ended by a limit or a policy change, and counts it. */
  closed(d: Decision & { reason: DenyReason }): void;
  readonly metrics: GatewayMetrics;
}

/** A fresh metrics registry (one per gateway, so tests don't share counters). */
export function createGatewayMetrics(): GatewayMetrics {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix: 'space_gateway_' });
  return {
    registry,
    decisions: new Counter({
      name: 'space_gateway_decisions_total',
      help: 'Egress decisions by protocol, decision (allow|deny) and deny reason.',
      labelNames: ['protocol', 'decision', 'reason'],
      registers: [registry],
    }),
    connections: new Gauge({
      name: 'space_gateway_connections',
      help: 'Open client connections by protocol.',
      labelNames: ['protocol'],
      registers: [registry],
    }),
    closed: new Counter({
      name: 'space_gateway_connections_closed_total',
      help: 'Connections closed by a limit or a policy change, by reason.',
      labelNames: ['protocol', 'reason'],
      registers: [registry],
    }),
  };
}

function fields(d: Decision): Record<string, unknown> {
  return {
    [F.sandboxId]: d.sandboxId,
    protocol: d.protocol,
    source: d.source,
    name: d.name,
    address: d.address,
    port: d.port,
    rule: d.rule,
  };
}

/** Builds the audit sink over `log` (a pino logger) and `metrics`. */
export function createAudit(log: Logger, metrics: GatewayMetrics = createGatewayMetrics()): Audit {
  return {
    metrics,
    allow(d) {
      metrics.decisions.inc({ protocol: d.protocol, decision: 'allow', reason: '' });
      log.info(fields(d), 'egress allow');
    },
    deny(d, quiet = false) {
      metrics.decisions.inc({ protocol: d.protocol, decision: 'deny', reason: d.reason });
      if (!quiet) log.info({ ...fields(d), reason: d.reason }, 'egress deny');
    },
    closed(d) {
      metrics.closed.inc({ protocol: d.protocol, reason: d.reason });
      log.info({ ...fields(d), reason: d.reason }, 'egress close');
    },
  };
}
