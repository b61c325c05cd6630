/**
 * The deny set as it is in force (E7, E14): the configured ranges (`SPACE_GATEWAY_DENY_CIDRS` plus
 * the always-denied ones) and the node's and cluster's own addresses — every address of every local
 * interface (read from the kernel), every destination of the kernel's `local` routing table (the
 * addresses the node answers for itself whatever interface holds them: AnyIP ranges such as
 * `ip route add local 10.77.0.0/24 dev lo`, load-balancer VIPs, and each subnet's broadcast
 * address), `SPACE_GATEWAY_NODE_CIDRS` (node IPs, pod and service ranges, load balancers) and the
 * optional `SPACE_GATEWAY_NODE_CIDRS_FILE`. The node's addresses are denied whatever range they are
 * in, public ones included.
 *
 * How fresh: read at start (a gateway that cannot read the local table does not start), again
 * within milliseconds of any route change the kernel reports (`ip monitor route`: adding an address
 * or a local route changes the local table), and every `SPACE_GATEWAY_NODE_REFRESH_MS` in any case
 * (the CIDRs file, and a monitor that died). Only root on the node changes routes, never a sandbox,
 * so the remaining window — the moments between a route change and its event — is not one a
 * sandbox can widen or aim at; checking the kernel per dial instead would cost a process (or a
 * netlink socket Node does not have) per connection.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { networkInterfaces } from 'node:os';
import { promisify } from 'node:util';
import type { Logger } from 'pino';
import { buildDenySet, type Cidr, type DenySet, deniedBy, parseCidr } from './addresses.ts';

const execFileP = promisify(execFile);

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

/** One route of `ip -j route show` (the fields used here). */
interface IpRoute {
  type?: string;
  dst?: string;
}

/**
 * Destinations of routes `ip -j` printed, as CIDRs: `dst` `default` is the whole family, a bare
 * address a host route. Pure.
 * @param family 4 or 6 (which `default` and bare addresses mean).
 */
export function routeCidrs(routes: readonly IpRoute[], family: 4 | 6): string[] {
  return routes.flatMap((r) => {
    if (!r.dst) return [];
    if (r.dst === 'default') return [family === 4 ? '0.0.0.0/0' : '::/0'];
    return [r.dst.includes('/') ? r.dst : `${r.dst}/${family === 4 ? 32 : 128}`];
  });
}

/**
 * Every destination of the kernel's `local` routing table (table 255), IPv4 and IPv6, as CIDRs:
 * the node's own addresses, AnyIP ranges, broadcast and anycast addresses — every route there
 * means "this node answers for it" (ip-route(8): local, broadcast and anycast routes go to that
 * table). Local routes in other tables apply only through policy rules (a TPROXY set-up's
 * `fwmark` table) and are left out: the gateway's own connections carry no mark.
 * @throws Error when `ip` cannot be run or prints something that is not its JSON.
 */
export async function localRouteCidrs(): Promise<string[]> {
  const out: string[] = [];
  for (const family of [4, 6] as const) {
    const { stdout } = await execFileP('ip', ['-j', `-${family}`, 'route', 'show', 'table', 'local'], {
      timeout: 5000,
      maxBuffer: 16 * 1024 * 1024,
    });
    out.push(...routeCidrs(JSON.parse(stdout.trim() || '[]') as IpRoute[], family));
  }
  return out;
}

/**
 * Watches the kernel's route changes (`ip -o monitor route`) and calls `onChange` for each batch of
 * them. Returns a function that stops watching. A watcher that exits is started again after
 * `retryMs` (logged); its absence only slows freshness to the periodic refresh.
 */
export function watchRoutes(onChange: () => void, retryMs: number, log?: Logger): () => void {
  let child: ChildProcess | undefined;
  let timer: NodeJS.Timeout | undefined;
  let stopped = false;
  const startOne = () => {
    const c = spawn('ip', ['-o', 'monitor', 'route'], { stdio: ['ignore', 'pipe', 'ignore'] });
    child = c;
    c.stdout!.on('data', () => onChange());
    c.on('error', (err) => log?.warn({ err }, 'route monitor failed to start'));
    c.on('close', (code, signal) => {
      if (stopped) return;
      log?.warn({ code, signal }, 'route monitor ended; starting it again');
      timer = setTimeout(startOne, retryMs);
      timer.unref();
    });
    c.unref();
    (c.stdout as unknown as { unref?: () => void }).unref?.();
  };
  startOne();
  return () => {
    stopped = true;
    clearTimeout(timer);
    child?.kill();
  };
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
  /** Reads the local routing table's destinations (default {@link localRouteCidrs}). */
  localRoutes?: () => Promise<string[]>;
  /** Watches route changes (default {@link watchRoutes}); returns its stop function. */
  watch?: (onChange: () => void) => () => void;
  log?: Logger;
}

/** Whether every address of `inner` lies in `outer`. Pure. */
function covers(outer: Cidr, inner: Cidr): boolean {
  if (outer.family !== inner.family || outer.prefix > inner.prefix) return false;
  const shift = BigInt((outer.family === 4 ? 32 : 128) - outer.prefix);
  return inner.network >> shift === outer.network >> shift;
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
   * Reads the interfaces, the local routing table and the node CIDRs file again. A file that can't
   * be read or holds a bad CIDR keeps the previous file entries, and a local table that can't be
   * read the previous routes (both logged): a refresh never shrinks the set by accident.
   * @throws Error when the local table cannot be read and never was (a gateway that cannot see
   *   which addresses are the node's must not start).
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
    let routes = this.#routeEntries;
    try {
      const read = await (o.localRoutes ?? localRouteCidrs)();
      read.forEach(parseCidr);
      routes = read;
    } catch (err) {
      if (routes === undefined)
        throw new Error(`cannot read the node's local routing table (ip -j route show table local): ${err}`);
      o.log?.warn({ err }, 'local routing table unreadable; keeping the previous routes');
    }
    this.#routeEntries = routes;
    const texts = [
      ...new Set([...o.nodeCidrs, ...fromFile, ...(o.interfaces ?? interfaceCidrs)(), ...routes]),
    ];
    // entries the configured set already covers are left out: each sandbox adds its host end and
    // its /30's broadcast address to the local table, all inside the (configured) sandbox pool
    this.#node = texts.map(parseCidr).filter((c) => !this.#configured.some((k) => covers(k, c)));
  }
  #fileEntries: string[] = [];
  #routeEntries: string[] | undefined;

  /**
   * Refreshes soon, once for any number of calls while one is under way (route events come in
   * bursts). Failures are logged.
   */
  refreshSoon(): void {
    if (this.#running) {
      this.#again = true;
      return;
    }
    this.#running = this.refresh()
      .catch((err: unknown) => this.#opts.log?.warn({ err }, 'deny set refresh failed'))
      .finally(() => {
        this.#running = undefined;
        if (this.#again) {
          this.#again = false;
          this.refreshSoon();
        }
      });
  }
  #running: Promise<void> | undefined;
  #again = false;
  #unwatch: (() => void) | undefined;

  /**
   * Refreshes now, then at every route change the kernel reports and every `refreshMs` until
   * {@link stop}. @throws what {@link refresh} throws the first time.
   */
  async start(): Promise<void> {
    this.#unwatch = (this.#opts.watch ?? ((f) => watchRoutes(f, this.#opts.refreshMs, this.#opts.log)))(() =>
      this.refreshSoon(),
    );
    try {
      await this.refresh();
    } catch (err) {
      this.stop();
      throw err;
    }
    this.#timer = setInterval(() => this.refreshSoon(), this.#opts.refreshMs);
    this.#timer.unref();
  }

  stop(): void {
    clearInterval(this.#timer);
    this.#unwatch?.();
    this.#unwatch = undefined;
  }
}
