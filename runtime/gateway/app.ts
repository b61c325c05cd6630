/**
 * The gateway's parts wired together without listening: registry, resolver, audit, the DNS, HTTP
 * and TLS servers and the control app. `service.ts` binds them; tests can build them directly.
 */
import type { Server as HttpServer } from 'node:http';
import type { Server } from 'node:net';
import type { FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import { type Audit, createAudit } from './audit.ts';
import type { DeploymentCa } from './ca.ts';
import type { GatewayConfig } from './config.ts';
import { buildControlApp } from './control.ts';
import type { CredentialSource } from './credential-source.ts';
import { LiveDenySet, splitCidrList } from './deny-set.ts';
import { createDnsServer, type DnsServer } from './dns-server.ts';
import { createHttpProxy } from './http-proxy.ts';
import type { ConnectionLimits } from './limits.ts';
import { Registry } from './registry.ts';
import { createResolver, type UpstreamResolver } from './resolver.ts';
import { createTlsProxy } from './tls-proxy.ts';
import type { UnpackPool } from './unpack-pool.ts';

/** Everything the gateway's servers share. */
export interface GatewayDeps {
  config: GatewayConfig;
  log: Logger;
  registry: Registry;
  resolver: UpstreamResolver;
  audit: Audit;
  /** The configured deny set plus the node's own addresses (`start()` keeps it current). */
  denySet: LiveDenySet;
  limits: ConnectionLimits;
  /**
   * The deployment CA, extra upstream CAs and the credential values' source for credential
   * interception; absent = refused.
   */
  intercept?: {
    ca: DeploymentCa;
    upstreamCa: Buffer[];
    credentials: CredentialSource;
    /** Where gzip response bodies are unpacked and masked (worker threads, E17). */
    unpack: UnpackPool;
  };
}

/** The built (not yet listening) servers. */
export interface GatewayServers {
  dns: DnsServer;
  http: HttpServer;
  tls: Server;
  control: FastifyInstance;
}

/**
 * Builds the shared deps from config (`intercept`: the loaded CA, see `service.ts`). Throws on a bad
 * deny CIDR or upstream DNS server.
 */
export function createGatewayDeps(
  config: GatewayConfig,
  log: Logger,
  intercept?: GatewayDeps['intercept'],
): GatewayDeps {
  const denySet = new LiveDenySet({
    configured: splitCidrList(config.denyCidrs),
    nodeCidrs: splitCidrList(config.nodeCidrs),
    nodeCidrsFile: config.nodeCidrsFile,
    refreshMs: config.nodeRefreshMs,
    log,
  });
  return {
    config,
    log,
    denySet,
    intercept,
    registry: new Registry({
      maxConnections: config.maxConnections,
      dnsQueriesPerSec: config.dnsQueriesPerSec,
      newConnectionsPerSec: config.newConnectionsPerSec,
      maxHandshakes: config.maxHandshakes,
    }),
    resolver: createResolver({
      servers: config.upstreamDns.split(',').map((s) => s.trim()),
      denySet,
      timeoutMs: config.resolveTimeoutMs,
      cacheMaxSec: config.resolveCacheMaxSec,
    }),
    audit: createAudit(log.child({ component: 'audit' })),
    limits: {
      handshakeTimeoutMs: config.handshakeTimeoutMs,
      idleTimeoutMs: config.idleTimeoutMs,
      dialTimeoutMs: config.dialTimeoutMs,
      maxConnectionBytes: config.maxConnectionBytes,
      maxHelloBytes: config.maxHelloBytes,
      maxHeaderBytes: config.maxHeaderBytes,
      maxBodyBytes: config.maxBodyBytes,
    },
  };
}

/** Builds the four servers over `deps` (none listens). */
export async function buildGateway(deps: GatewayDeps): Promise<GatewayServers> {
  const proxy = {
    registry: deps.registry,
    resolver: deps.resolver,
    audit: deps.audit,
    log: deps.log,
    limits: deps.limits,
  };
  return {
    dns: createDnsServer({
      registry: deps.registry,
      resolver: deps.resolver,
      audit: deps.audit,
      answerTtlSec: deps.config.dnsAnswerTtlSec,
    }),
    http: createHttpProxy({ ...proxy, upstreamPort: deps.config.upstreamHttpPort }),
    tls: createTlsProxy({ ...proxy, upstreamPort: deps.config.upstreamTlsPort, intercept: deps.intercept }),
    control: await buildControlApp({ registry: deps.registry, metrics: deps.audit.metrics, log: deps.log }),
  };
}
