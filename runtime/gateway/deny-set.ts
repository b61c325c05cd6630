/**
 * The deny set as it is in force (E7): the configured ranges (`SPACE_GATEWAY_DENY_CIDRS` plus the
 * always-denied ones) and the node's and cluster's own addresses — every address of every local
 * interface (read from the kernel), `SPACE_GATEWAY_NODE_CIDRS` (node IPs, pod and service ranges,
 * load balancers) and the optional `SPACE_GATEWAY_NODE_CIDRS_FILE` — read at start and again every
 * `SPACE_GATEWAY_NODE_REFRESH_MS`, so an address the node gains later is denied within one period.
 * The node's addresses are denied whatever range they are in, public ones included.
 */
import { readFile } from 'node:fs/promises';
import { networkInterfaces } from 'node:os';
import type { Logger } from 'pino';
import { buildDenySet, type DenySet, deniedBy, parseCidr } from './addresses.ts';

/** Anything that can say whether an address may be dialled / handed out. */
export interface DenyCheck {
  /** The entry `ip` falls in (text, for audit lines), or undefined when it may be used. */
  deniedBy(ip: string): string | undefined;
}

/** Every address of every local interface (loopback included), as host CIDRs. */
export function interfaceCidrs(): string[] {
  const out: string[] = [];
  for (const list of Object.values(networkInterfaces())) {
    for (const a of list ?? []) {
      const bare = a.address.split('%', 1)[0]!;
      out.push(`${bare}/${a.family === 'IPv4' ? 32 : 128}`);
    }
  }
  return out;
}

/** Splits a comma/newline/space separated CIDR list, dropping empties and `#` comments. Pure. */
export function splitCidrList(text: string): string[] {
  return text
    .split('\n')
    .map((l) => l.replace(/#.*/, ''))
    .join(',')
    .split(/[\s,]+/)
    .filter((c) => c !== '');
}

/** Options of {@link LiveDenySet}. */
export interface LiveDenySetOptions {
  /** The configured deny ranges (without the node's). */
  configured: readonly string[];
  /** Node/cluster addresses and ranges from config. */
  nodeCidrs: readonly string[];
  /** A file of further node/cluster CIDRs, re-read at every refresh ('' = none). */
  nodeCidrsFile: string;
  /** How often to refresh, ms. */
  refreshMs: number;
  /** Reads the local interfaces' addresses (default {@link interfaceCidrs}). */
  interfaces?: () => string[];
  log?: Logger;
}

/** The configured deny set plus the node's own addresses, kept current. Throws on bad config CIDRs. */
export class LiveDenySet implements DenyCheck {
  readonly #configured: DenySet;
  readonly #opts: LiveDenySetOptions;
  #node: DenySet;
  #timer: NodeJS.Timeout | undefined;

  constructor(opts: LiveDenySetOptions) {
    this.#opts = opts;
    this.#configured = buildDenySet(opts.configured);
    this.#node = [...opts.nodeCidrs, ...(opts.interfaces ?? interfaceCidrs)()].map(parseCidr);
  }

  deniedBy(ip: string): string | undefined {
    const hit = deniedBy(ip, this.#configured);
    if (hit !== undefined) return hit;
    const node = deniedBy(ip, this.#node);
    return node === undefined ? undefined : `node:${node}`;
  }

  /** The node/cluster entries in force now (texts). */
  nodeEntries(): string[] {
    return this.#node.map((c) => c.text);
  }

  /**
   * Reads the interfaces and the node CIDRs file again. A file that can't be read or holds a bad
   * CIDR keeps the previous file entries (logged): a refresh never shrinks the set by accident.
   */
  async refresh(): Promise<void> {
    const o = this.#opts;
    let fromFile: string[] = this.#fileEntries;
    if (o.nodeCidrsFile) {
      try {
        const entries = splitCidrList(await readFile(o.nodeCidrsFile, 'utf8'));
        entries.forEach(parseCidr); // all or nothing
        fromFile = entries;
      } catch (err) {
        o.log?.warn(
          { err, file: o.nodeCidrsFile },
          'node CIDRs file unreadable; keeping the previous entries',
        );
      }
    }
    this.#fileEntries = fromFile;
    const texts = [...new Set([...o.nodeCidrs, ...fromFile, ...(o.interfaces ?? interfaceCidrs)()])];
    this.#node = texts.map(parseCidr);
  }
  #fileEntries: string[] = [];

  /** Refreshes now and then every `refreshMs` until {@link stop}. */
  async start(): Promise<void> {
    await this.refresh();
    this.#timer = setInterval(() => {
      this.refresh().catch((err: unknown) => this.#opts.log?.warn({ err }, 'deny set refresh failed'));
    }, this.#opts.refreshMs);
    this.#timer.unref();
  }

  stop(): void {
    clearInterval(this.#timer);
  }
}
