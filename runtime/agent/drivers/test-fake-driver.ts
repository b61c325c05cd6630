/**
 * Test fixtures (left out of the image with every `test-*.ts`): a {@link FakeDriver} that keeps its
 * instances in memory, a {@link FakeGuests} daemon on loopback that answers for them, and
 * {@link FakeNetworks} that hand out addresses from a counter. With them the sandbox verbs (create,
 * delete, pause, hibernate, resume, warm claims) run in milliseconds without `runsc`, namespaces
 * or nftables, and a test can hold any driver call at a gate to order a race exactly, or make it
 * fail, then read what is left (instances, networks, guest registrations).
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { SpaceError } from '../../core/errors.ts';
import type { CidrAllow } from '../host/firewall.ts';
import type { Registration } from '../host/gateway-client.ts';
import type { HostNetworks } from '../sandboxes/types.ts';
import type {
  Driver,
  DriverCapabilities,
  InstanceInfo,
  InstanceSpec,
  InstanceStats,
  RestoreSpec,
  SandboxNetwork,
  SnapshotRef,
  TapAttachment,
} from './driver.ts';

/** The driver calls a test can hold or fail. */
export type FakeOp = 'create' | 'restore' | 'pause' | 'resume' | 'snapshot' | 'destroy';

/** A held call: `reached` resolves once the call arrived; `release` lets it (and only it) go on. */
export interface Gate {
  reached: Promise<void>;
  release(): void;
}

/** One output frame as the guest daemon sends it (`[type u8][length u32 BE][payload]`). */
function fakeFrame(type: number, payload: Buffer): Buffer {
  const head = Buffer.alloc(5);
  head[0] = type;
  head.writeUInt32BE(payload.length, 1);
  return Buffer.concat([head, payload]);
}

/**
 * The guest daemons of every fake instance, one HTTP server on 127.0.0.1: a request is answered for
 * the instance whose secret it carries (`/health`, `/init`, `/token`; `/processes`: a command that
 * prints `out-<pid>` and exits 0), and refused 503 when that
 * instance is gone, stopped or frozen (as a dead guest's connection would fail).
 */
export class FakeGuests {
  readonly #server: Server;
  /** Guest secret → instance id. */
  readonly #tokens = new Map<string, string>();
  /** Whether instance id's guest answers now. */
  answers: (instanceId: string) => boolean = () => true;
  /** `POST /init` bodies received, by instance id. */
  readonly inits = new Map<string, unknown[]>();
  #pid = 100;

  constructor() {
    this.#server = createServer((req, res) => {
      const token = /^Bearer (\S+)$/.exec(req.headers.authorization ?? '')?.[1] ?? '';
      const id = this.#tokens.get(token);
      let body = '';
      req.on('data', (c: Buffer) => {
        body += c.toString();
      });
      req.on('end', () => {
        if (id === undefined || !this.answers(id)) {
          res.writeHead(503, { 'content-type': 'application/json' });
          res.end(JSON.stringify({ error: { code: 'GUEST_UNAVAILABLE', message: 'fake guest is gone' } }));
          return;
        }
        if (req.url === '/processes' && req.method === 'POST') {
          // a command that prints one line and exits 0 at once
          const pid = ++this.#pid;
          res.writeHead(200, { 'content-type': 'application/json' });
          res.end(JSON.stringify({ pid }));
          return;
        }
        const output = /^\/processes\/(\d+)\/output\?offset=(\d+)$/.exec(req.url ?? '');
        if (output && req.method === 'GET') {
          const frames = Buffer.concat([
            fakeFrame(1, Buffer.from(`out-${output[1]}\n`)),
            fakeFrame(3, Buffer.from(JSON.stringify({ exitCode: 0, signal: null, timedOut: false }))),
          ]);
          res.writeHead(200, { 'content-type': 'application/octet-stream' });
          res.end(frames.subarray(Number(output[2])));
          return;
        }
        if (req.url === '/token' && req.method === 'POST') {
          this.#tokens.delete(token);
          this.#tokens.set((JSON.parse(body) as { token: string }).token, id);
        } else if (req.url === '/init' && req.method === 'POST') {
          this.inits.set(id, [...(this.inits.get(id) ?? []), JSON.parse(body)]);
        }
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(req.url === '/health' ? JSON.stringify({ ok: true, version: '3' }) : '');
      });
    });
    this.#server.keepAliveTimeout = 60_000;
  }

  async listen(): Promise<void> {
    await new Promise<void>((r) => this.#server.listen(0, '127.0.0.1', r));
  }

  get port(): number {
    return (this.#server.address() as AddressInfo).port;
  }

  /** Routes requests carrying `token` to instance `instanceId` (a new instance, or a restore's old secret). */
  bind(token: string, instanceId: string): void {
    this.#tokens.set(token, instanceId);
  }

  /** Forgets every secret of instance `instanceId`. */
  unbind(instanceId: string): void {
    for (const [t, id] of this.#tokens) if (id === instanceId) this.#tokens.delete(t);
  }

  async close(): Promise<void> {
    this.#server.closeAllConnections();
    await new Promise<void>((r) => this.#server.close(() => r()));
  }
}

/**
 * A {@link Driver} whose instances live in memory; their guests are {@link FakeGuests}. Every call
 * can be held at a gate ({@link hold}) or failed ({@link failNext}); {@link calls} counts them.
 */
export class FakeDriver implements Driver {
  readonly name = 'gvisor' as const;
  readonly capabilities: DriverCapabilities = {
    pause: true,
    snapshot: true,
    restore: true,
    memoryStats: true,
    balloon: false,
    guestLinks: ['tcp'],
    network: 'veth',
    rootfs: 'directory',
    ownKernel: false,
  };
  readonly #guests: FakeGuests;
  /** Live instances by id (destroyed ones leave). */
  readonly instances = new Map<string, InstanceInfo>();
  /** Calls made, by op. */
  readonly calls: Record<FakeOp, number> = {
    create: 0,
    restore: 0,
    pause: 0,
    resume: 0,
    snapshot: 0,
    destroy: 0,
  };
  readonly #holds = new Map<FakeOp, { arrived: () => void; go: Promise<void> }[]>();
  readonly #failures = new Map<FakeOp, Error[]>();

  constructor(guests: FakeGuests) {
    this.#guests = guests;
    guests.answers = (id) => this.instances.get(id)?.state === 'running';
  }

  /** Holds the next call of `op` until the gate is released. */
  hold(op: FakeOp): Gate {
    let arrived!: () => void;
    let release!: () => void;
    const reached = new Promise<void>((r) => {
      arrived = r;
    });
    const go = new Promise<void>((r) => {
      release = r;
    });
    this.#holds.set(op, [...(this.#holds.get(op) ?? []), { arrived, go }]);
    return { reached, release };
  }

  /** Makes the next call of `op` fail with `err` (after any hold). */
  failNext(op: FakeOp, err: Error = new SpaceError('DRIVER_FAILED', `${op} failed (test)`)): void {
    this.#failures.set(op, [...(this.#failures.get(op) ?? []), err]);
  }

  /** Marks an instance as stopped on its own (its guest stops answering). */
  kill(instanceId: string): void {
    const inst = this.instances.get(instanceId);
    if (inst) inst.state = 'stopped';
  }

  async #enter(op: FakeOp): Promise<void> {
    this.calls[op] += 1;
    const held = this.#holds.get(op)?.shift();
    if (held) {
      held.arrived();
      await held.go;
    }
    const err = this.#failures.get(op)?.shift();
    if (err) throw err;
  }

  #make(spec: Omit<InstanceSpec, 'image'>, guestToken: string): InstanceInfo {
    const inst: InstanceInfo = {
      instanceId: spec.instanceId,
      template: spec.template,
      state: 'running',
      guest: { host: '127.0.0.1', port: this.#guests.port, token: spec.guestToken },
      network: spec.network,
      createdAt: Date.now(),
      vcpus: spec.vcpus,
      memoryMiB: spec.memoryMiB,
    };
    this.#guests.bind(guestToken, spec.instanceId);
    this.instances.set(spec.instanceId, inst);
    return { ...inst };
  }

  async preflight(): Promise<void> {}

  async create(spec: InstanceSpec): Promise<InstanceInfo> {
    await this.#enter('create');
    return this.#make(spec, spec.guestToken);
  }

  async restore(snapshot: SnapshotRef, spec: RestoreSpec): Promise<InstanceInfo> {
    await this.#enter('restore');
    // the guest inside still holds the snapshot's secret until the agent rotates it
    return this.#make(
      { ...spec, vcpus: snapshot.vcpus, memoryMiB: snapshot.memoryMiB, diskMiB: snapshot.diskMiB },
      snapshot.guestToken,
    );
  }

  #get(instanceId: string): InstanceInfo {
    const inst = this.instances.get(instanceId);
    if (!inst) throw new SpaceError('DRIVER_FAILED', `no instance ${instanceId} (test)`);
    return inst;
  }

  async pause(instanceId: string): Promise<void> {
    await this.#enter('pause');
    this.#get(instanceId).state = 'paused';
  }

  async resume(instanceId: string): Promise<void> {
    await this.#enter('resume');
    this.#get(instanceId).state = 'running';
  }

  async snapshot(instanceId: string, dir: string): Promise<SnapshotRef> {
    await this.#enter('snapshot');
    const inst = this.#get(instanceId);
    const ref: SnapshotRef = {
      driver: this.name,
      instanceId,
      template: inst.template,
      imageDigest: 'fake',
      path: dir,
      vcpus: inst.vcpus,
      memoryMiB: inst.memoryMiB,
      diskMiB: 0,
      guestToken: inst.guest.token,
      createdAt: Date.now(),
    };
    await mkdir(dir, { recursive: true });
    await writeFile(join(dir, 'snapshot.json'), JSON.stringify(ref));
    return ref;
  }

  async destroy(instanceId: string): Promise<void> {
    await this.#enter('destroy');
    this.instances.delete(instanceId);
    this.#guests.unbind(instanceId);
  }

  async list(): Promise<InstanceInfo[]> {
    return [...this.instances.values()].map((i) => ({ ...i }));
  }

  async adopt(instanceId: string): Promise<InstanceInfo> {
    const inst = this.instances.get(instanceId);
    if (!inst) throw new SpaceError('INSTANCE_LOST', `instance ${instanceId} is gone (test)`);
    return { ...inst };
  }

  async stats(): Promise<InstanceStats> {
    return { memoryBytes: 0 };
  }
}

/** {@link HostNetworks} from a counter: {@link allocated} holds the networks not yet released. */
export class FakeNetworks implements HostNetworks {
  readonly allocated = new Map<string, SandboxNetwork>();
  /** CIDR allows set per sandbox address. */
  readonly cidrs = new Map<string, CidrAllow[]>();
  #next = 0;

  async allocate(instanceId: string): Promise<SandboxNetwork> {
    const n = ++this.#next;
    const net: SandboxNetwork = {
      netns: `fake-${instanceId}`,
      hostIf: `fk${n}`,
      hostAddress: `10.99.${n >> 6}.${(n & 63) * 4 + 1}`,
      sandboxAddress: `10.99.${n >> 6}.${(n & 63) * 4 + 2}`,
      prefixLength: 30,
    };
    this.allocated.set(net.netns, net);
    return net;
  }

  async attachTap(): Promise<TapAttachment> {
    return { name: 'tap0', guestMac: '06:00:ac:1f:00:02' };
  }

  async setCidrAllows(net: SandboxNetwork, allows: CidrAllow[]): Promise<void> {
    this.cidrs.set(net.sandboxAddress, allows);
  }

  async release(net: SandboxNetwork): Promise<void> {
    this.allocated.delete(net.netns);
    this.cidrs.delete(net.sandboxAddress);
  }

  async sweep(): Promise<string[]> {
    return [];
  }
}

/** The gateway's control calls the agent makes, kept in memory: {@link held} is what it holds. */
export class FakeGateway {
  /** Sandbox id registered at each source address. */
  readonly held = new Map<string, string>();
  registry = 'fake-registry';

  async register(address: string, r: Registration): Promise<{ registryId: string | undefined }> {
    this.held.set(address, r.sandboxId);
    return { registryId: this.registry };
  }

  async unregister(address: string): Promise<void> {
    this.held.delete(address);
  }

  async registryId(): Promise<string | undefined> {
    return this.registry;
  }
}
