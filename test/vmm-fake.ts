/**
 * Test support: loopback stand-ins for the Firecracker and Cloud Hypervisor API servers, checked against
 * the projects' own API descriptions, loaded at test time from {@link SPECS_DIR}:
 * https://github.com/firecracker-microvm/firecracker/blob/main/src/firecracker/swagger/firecracker.yaml
 * https://github.com/cloud-hypervisor/cloud-hypervisor/blob/main/vmm/src/api/openapi/cloud-hypervisor.yaml
 *
 * Each fake listens on the Unix socket the driver connects to and, for every request:
 * - finds the operation in the spec's `paths` (unknown path or method → error, as the VMMs answer);
 * - validates the JSON body against the operation's body schema (Firecracker: Swagger 2.0 `parameters[in=body]`
 *   → `definitions`; Cloud Hypervisor: OpenAPI 3 `requestBody` → `components/schemas`) with every object
 *   schema closed (`additionalProperties: false`: both VMMs reject unknown fields at runtime);
 * - enforces the call order the VMM requires (see `FakeFirecracker` / `FakeCloudHypervisor`);
 * - checks that every file a body names exists where the VMM would open it (inside the jail, or through
 *   the private bind mount), so file placement is tested too;
 * - answers with a status code the spec lists for the operation.
 * Anything the fake rejects is also recorded in `violations`, so a test can insist on none.
 *
 * The launchers stand in for the jailer / nsenter chain: they read the real argv the driver built,
 * start the fake on the socket it names and a `sleep` as the "VMM process" (its pid is what the driver
 * tracks, kills and measures).
 */
import { spawn } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { mkdir, rm } from 'node:fs/promises';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { basename, dirname, join, normalize } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Ajv, type ValidateFunction } from 'ajv';
import { parse } from 'yaml';
import {
  GUEST_NET,
  type InstanceSpec,
  type RestoreSpec,
  type TemplateImage,
} from '../runtime/agent/drivers/driver.ts';
import type { VmmLauncher } from '../runtime/agent/drivers/vmm-common.ts';

/**
 * Folder of the VMMs' API descriptions (`firecracker-openapi.yaml`, `cloud-hypervisor-openapi.yaml`:
 * the upstream files named above, unchanged): `SPACE_SPECS_DIR`, else the `specs` folder of the team's
 * shared workspace next to the repository (where CI puts it too; the repository does not carry them).
 */
export const SPECS_DIR =
  process.env.SPACE_SPECS_DIR ?? fileURLToPath(new URL('../../shared/specs/', import.meta.url));

type Json = Record<string, unknown>;

/** Adds `additionalProperties: false` to every object schema that lists properties and says nothing. */
export function closeObjects(node: unknown): unknown {
  if (Array.isArray(node)) return node.map(closeObjects);
  if (!node || typeof node !== 'object') return node;
  const out: Json = {};
  for (const [k, v] of Object.entries(node)) {
    // `properties` maps names to schemas: keep the names, close each schema
    out[k] =
      k === 'properties' && v && typeof v === 'object'
        ? Object.fromEntries(Object.entries(v).map(([n, s]) => [n, closeObjects(s)]))
        : closeObjects(v);
  }
  if ('properties' in out && !('additionalProperties' in out)) out.additionalProperties = false;
  return out;
}

/** One API description: its operations and a validator per body schema. */
export class ApiSpec {
  readonly doc: Json;
  readonly #ajv = new Ajv({ strict: false, allErrors: true, validateFormats: false });
  readonly #kind: 'swagger2' | 'openapi3';

  constructor(file: string) {
    this.doc = parse(readFileSync(join(SPECS_DIR, file), 'utf8')) as Json;
    this.#kind = 'swagger' in this.doc ? 'swagger2' : 'openapi3';
    const root =
      this.#kind === 'swagger2'
        ? { $id: 'spec', definitions: closeObjects(this.doc.definitions) }
        : { $id: 'spec', components: { schemas: closeObjects((this.doc.components as Json).schemas) } };
    this.#ajv.addSchema(root);
  }

  /** The operation for `method` on a concrete path (templates like `{drive_id}` match one segment). */
  operation(method: string, path: string): { template: string; params: string[]; op: Json } | undefined {
    for (const [template, ops] of Object.entries(this.doc.paths as Json)) {
      const names: string[] = [];
      const re = new RegExp(
        `^${template.replace(/[.]/g, '\\.').replace(/\{([^}]+)\}/g, (_m, n: string) => {
          names.push(n);
          return '([^/]+)';
        })}$`,
      );
      const m = re.exec(path);
      const op = (ops as Json)[method.toLowerCase()] as Json | undefined;
      if (m && op) return { template, params: m.slice(1), op };
    }
    return undefined;
  }

  /** Validator of the operation's request body, or undefined when it takes none. */
  bodyValidator(op: Json): ValidateFunction | undefined {
    let ref: string | undefined;
    if (this.#kind === 'swagger2') {
      const p = ((op.parameters as Json[] | undefined) ?? []).find((x) => x.in === 'body');
      ref = (p?.schema as Json | undefined)?.$ref as string | undefined;
    } else {
      const content = (op.requestBody as Json | undefined)?.content as Json | undefined;
      ref = ((content?.['application/json'] as Json | undefined)?.schema as Json | undefined)?.$ref as
        | string
        | undefined;
    }
    return ref ? this.#ajv.getSchema(`spec${ref}`) : undefined;
  }

  /** Validator of a named schema (responses). */
  schema(name: string): ValidateFunction {
    const ptr = this.#kind === 'swagger2' ? `#/definitions/${name}` : `#/components/schemas/${name}`;
    return this.#ajv.getSchema(`spec${ptr}`)!;
  }

  /** Whether the spec lists `status` for the operation. */
  lists(op: Json, status: number): boolean {
    return String(status) in (op.responses as Json);
  }
}

let fcSpec: ApiSpec | undefined;
let chSpec: ApiSpec | undefined;
export const firecrackerSpec = () => (fcSpec ??= new ApiSpec('firecracker-openapi.yaml'));
export const cloudHypervisorSpec = () => (chSpec ??= new ApiSpec('cloud-hypervisor-openapi.yaml'));

/** One request as the fake saw it. */
export interface SeenCall {
  method: string;
  path: string;
  body?: unknown;
  status: number;
}

/** An injected failure: the next matching request gets this answer. */
export interface InjectedFault {
  method: string;
  path: string;
  status: number;
  message: string;
}

class Reject extends Error {
  readonly status: number;
  constructor(status: number, message: string) {
    super(message);
    this.status = status;
  }
}

/** Base of the two fakes: socket server, spec lookup, body validation, recording. */
export abstract class FakeVmm {
  readonly calls: SeenCall[] = [];
  readonly violations: string[] = [];
  faults: InjectedFault[] = [];
  #server?: Server;
  protected abstract readonly spec: ApiSpec;
  /** Path prefix the spec's paths sit under (`servers[0].url`). */
  protected abstract readonly base: string;

  readonly socketPath: string;
  constructor(socketPath: string) {
    this.socketPath = socketPath;
  }

  async listen(): Promise<void> {
    await mkdir(dirname(this.socketPath), { recursive: true });
    await rm(this.socketPath, { force: true });
    this.#server = createServer((req, res) => void this.#handle(req, res));
    await new Promise<void>((resolve, reject) => {
      this.#server!.once('error', reject);
      this.#server!.listen(this.socketPath, resolve);
    });
  }

  async close(): Promise<void> {
    const s = this.#server;
    this.#server = undefined;
    if (s) await new Promise<void>((r) => s.close(() => r()));
    s?.closeAllConnections();
    await rm(this.socketPath, { force: true });
  }

  /** The VMM's answer to an accepted, schema-valid request. @throws Reject. */
  protected abstract respond(
    method: string,
    template: string,
    params: string[],
    body: Json | undefined,
  ): { status: number; json?: unknown };

  /** How this VMM words an error body. */
  protected abstract errorBody(message: string): string;

  /** Checks that a file named in a body exists where the VMM would open it. @throws Reject 400. */
  protected abstract mustExist(path: string, what: string): void;

  async #handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const text = Buffer.concat(chunks).toString();
    const method = req.method ?? '';
    const url = req.url ?? '';
    let body: Json | undefined;
    const send = (status: number, payload?: string) => {
      this.calls.push({ method, path: url, body, status });
      res.writeHead(status, payload ? { 'Content-Type': 'application/json' } : {});
      res.end(payload);
    };
    try {
      if (!url.startsWith(this.base)) throw new Reject(404, `no such path ${url}`);
      const found = this.spec.operation(method, url.slice(this.base.length));
      if (!found) throw new Reject(400, `invalid request method and/or path: ${method} ${url}`);
      const validate = this.spec.bodyValidator(found.op);
      if (text) {
        try {
          body = JSON.parse(text) as Json;
        } catch {
          throw new Reject(400, 'body is not JSON');
        }
      }
      if (validate) {
        if (body === undefined) throw new Reject(400, `${method} ${url} needs a body`);
        if (!validate(body)) {
          throw new Reject(
            400,
            `body of ${method} ${url} breaks the spec: ${JSON.stringify(validate.errors)}`,
          );
        }
      } else if (body !== undefined) {
        throw new Reject(400, `${method} ${url} takes no body`);
      }
      const fault = this.faults.find((f) => f.method === method && f.path === url);
      if (fault) {
        this.faults = this.faults.filter((f) => f !== fault);
        this.calls.push({ method, path: url, body, status: fault.status });
        res.writeHead(fault.status, { 'Content-Type': 'application/json' });
        res.end(this.errorBody(fault.message));
        return;
      }
      const answer = this.respond(method, found.template, found.params, body);
      if (!this.spec.lists(found.op, answer.status)) {
        this.violations.push(`answer ${answer.status} is not listed for ${method} ${found.template}`);
      }
      send(answer.status, answer.json === undefined ? undefined : JSON.stringify(answer.json));
    } catch (err) {
      const status = err instanceof Reject ? err.status : 500;
      this.violations.push(`${method} ${url}: ${(err as Error).message}`);
      send(status, this.errorBody((err as Error).message));
    }
  }
}

const PRE_BOOT = new Set([
  '/machine-config',
  '/boot-source',
  '/drives/{drive_id}',
  '/network-interfaces/{iface_id}',
  '/vsock',
  '/entropy',
  '/balloon',
  '/mmds/config',
  '/cpu-config',
  '/serial',
  '/pmem/{id}',
]);

/**
 * Firecracker's API (`firecracker-openapi.yaml`; order rules from its path descriptions and its
 * API request docs, https://github.com/firecracker-microvm/firecracker/tree/main/docs/api_requests):
 * pre-boot resources only before InstanceStart; InstanceStart needs a boot source; `/logger` and
 * `/metrics` once each; `PATCH /vm` only after start; snapshot create only while Paused; snapshot
 * load only on a fresh process (nothing but logger/metrics before it), with exactly one of
 * `mem_file_path`/`mem_backend`. Paths resolve inside `root` (the chroot). 204 for accepted
 * PUT/PATCH, 400 `{fault_message}` otherwise.
 */
export class FakeFirecracker extends FakeVmm {
  protected readonly spec = firecrackerSpec();
  protected readonly base = '';
  state: 'Not started' | 'Running' | 'Paused' = 'Not started';
  readonly configured = new Map<string, Json>();
  loaded = false;

  readonly root: string;
  constructor(socketPath: string, root: string) {
    super(socketPath);
    this.root = root;
  }

  protected errorBody(message: string): string {
    return JSON.stringify({ fault_message: message });
  }

  /** A chroot path: absolute or relative, never escaping the root. */
  inJail(p: string): string {
    const n = normalize(join('/', p));
    return join(this.root, n);
  }

  protected mustExist(p: string, what: string): void {
    if (!existsSync(this.inJail(p))) throw new Reject(400, `${what} ${p} does not exist in the jail`);
  }

  protected respond(method: string, t: string, params: string[], body: Json | undefined) {
    const started = this.state !== 'Not started';
    if (method === 'GET' && t === '/') {
      const info = {
        app_name: 'Firecracker',
        id: 'anonymous-instance',
        state: this.state,
        vmm_version: '1.16.1',
      };
      if (!this.spec.schema('InstanceInfo')(info)) throw new Error('fake answers a bad InstanceInfo');
      return { status: 200, json: info };
    }
    const b = body ?? {};
    if (t === '/logger' || t === '/metrics') {
      if (this.configured.has(t)) throw new Reject(400, `${t} can be configured only once`);
      this.mustExist(String(b.log_path ?? b.metrics_path), t);
      this.configured.set(t, b);
      return { status: 204 };
    }
    if (PRE_BOOT.has(t)) {
      if (started || this.loaded) throw new Reject(400, `${t} is not supported after starting the microVM`);
      if (t === '/drives/{drive_id}') {
        if (b.drive_id !== params[0]) throw new Reject(400, 'drive_id differs from the path');
        this.mustExist(String(b.path_on_host), 'drive');
      }
      if (t === '/network-interfaces/{iface_id}' && b.iface_id !== params[0])
        throw new Reject(400, 'iface_id differs from the path');
      if (t === '/boot-source') {
        this.mustExist(String(b.kernel_image_path), 'kernel');
        if (b.initrd_path) this.mustExist(String(b.initrd_path), 'initrd');
      }
      if (t === '/machine-config') {
        const n = Number(b.vcpu_count);
        if (n !== 1 && n % 2 !== 0) throw new Reject(400, 'vcpu_count must be 1 or an even number');
      }
      this.configured.set(params.length ? `${t}:${params[0]}` : t, b);
      return { status: 204 };
    }
    if (t === '/actions') {
      if (b.action_type !== 'InstanceStart') return { status: 204 };
      if (started || this.loaded) throw new Reject(400, 'the microVM is already running');
      if (!this.configured.has('/boot-source')) throw new Reject(400, 'cannot start without a boot source');
      this.state = 'Running';
      return { status: 204 };
    }
    if (method === 'PATCH' && t === '/vm') {
      if (!started) throw new Reject(400, 'the microVM is not started');
      this.state = b.state === 'Paused' ? 'Paused' : 'Running';
      return { status: 204 };
    }
    if (t === '/snapshot/create') {
      if (this.state !== 'Paused') throw new Reject(400, 'snapshot create needs a paused microVM');
      const drives = [...this.configured.entries()]
        .filter(([k]) => k.startsWith('/drives/'))
        .map(([, v]) => v.path_on_host);
      writeFileSync(this.inJail(String(b.snapshot_path)), JSON.stringify({ drives }));
      writeFileSync(this.inJail(String(b.mem_file_path)), 'guest memory');
      return { status: 204 };
    }
    if (t === '/snapshot/load') {
      const others = [...this.configured.keys()].filter((k) => k !== '/logger' && k !== '/metrics');
      if (started || this.loaded || others.length)
        throw new Reject(400, 'snapshot load is only accepted on a fresh Firecracker process');
      if ('mem_file_path' in b === 'mem_backend' in b)
        throw new Reject(400, 'exactly one of mem_file_path and mem_backend is required');
      this.mustExist(String(b.snapshot_path), 'snapshot');
      const mem = b.mem_backend as Json | undefined;
      this.mustExist(String(mem?.backend_path ?? b.mem_file_path), 'memory file');
      const saved = JSON.parse(readFileSync(this.inJail(String(b.snapshot_path)), 'utf8')) as {
        drives: string[];
      };
      for (const d of saved.drives) this.mustExist(d, 'drive of the snapshot');
      this.loaded = true;
      this.state = b.resume_vm ? 'Running' : 'Paused';
      return { status: 204 };
    }
    throw new Reject(400, `the fake does not implement ${method} ${t}`);
  }
}

/**
 * Cloud Hypervisor's API (`cloud-hypervisor-openapi.yaml`, base `/api/v1`): `vm.create` once, before
 * `vm.boot`; pause only when running (405 otherwise), resume only when paused; snapshot only when
 * paused; `vm.restore` only on a fresh VMM (404 once a VM exists, as the spec says); `vm.info` 404
 * without a VM. Files named in bodies resolve through `resolve` (the bind mount the launcher saw).
 */
export class FakeCloudHypervisor extends FakeVmm {
  protected readonly spec = cloudHypervisorSpec();
  protected readonly base = '/api/v1';
  vm?: { config: Json; state: 'Created' | 'Running' | 'Paused' | 'Shutdown' };
  everCreated = false;
  onShutdown?: () => void;

  readonly resolve: (p: string) => string;
  constructor(socketPath: string, resolve: (p: string) => string) {
    super(socketPath);
    this.resolve = resolve;
  }

  protected errorBody(message: string): string {
    return message;
  }

  protected mustExist(p: string, what: string): void {
    if (!existsSync(this.resolve(p))) throw new Reject(400, `${what} ${p} does not exist`);
  }

  private checkFiles(config: Json): void {
    const payload = config.payload as Json;
    this.mustExist(String(payload.kernel), 'kernel');
    if (payload.initramfs) this.mustExist(String(payload.initramfs), 'initramfs');
    for (const d of (config.disks as Json[] | undefined) ?? []) this.mustExist(String(d.path), 'disk');
    const serial = config.serial as Json | undefined;
    if (serial?.file) this.mustExist(dirname(String(serial.file)), 'serial directory');
  }

  protected respond(method: string, t: string, _params: string[], body: Json | undefined) {
    const vm = this.vm;
    const need = (states: string[]) => {
      if (!vm) throw new Reject(404, 'the VM is not created');
      if (!states.includes(vm.state)) throw new Reject(405, `not allowed while ${vm.state}`);
      return vm;
    };
    switch (t) {
      case '/vmm.ping':
        return { status: 200, json: { version: 'v53.0' } };
      case '/vm.info': {
        if (!vm) return { status: 404 };
        const info = { config: vm.config, state: vm.state };
        if (!this.spec.schema('VmInfo')(info)) throw new Error('fake answers a bad VmInfo');
        return { status: 200, json: info };
      }
      case '/vm.counters':
        return { status: 200, json: {} };
      case '/vm.create':
        if (vm || this.everCreated) throw new Reject(400, 'the VM is already created');
        this.checkFiles(body!);
        this.vm = { config: body!, state: 'Created' };
        this.everCreated = true;
        return { status: 204 };
      case '/vm.boot':
        need(['Created']).state = 'Running';
        return { status: 204 };
      case '/vm.pause':
        need(['Running']).state = 'Paused';
        return { status: 204 };
      case '/vm.resume':
        need(['Paused']).state = 'Running';
        return { status: 204 };
      case '/vm.snapshot': {
        const v = need(['Paused']);
        const dir = new URL(String(body!.destination_url)).pathname;
        if (!existsSync(dir)) throw new Reject(400, `snapshot destination ${dir} does not exist`);
        writeFileSync(join(dir, 'config.json'), JSON.stringify(v.config));
        writeFileSync(join(dir, 'state.json'), '{}');
        writeFileSync(join(dir, 'memory-ranges'), 'guest memory');
        return { status: 204 };
      }
      case '/vm.restore': {
        if (vm || this.everCreated) throw new Reject(404, 'the VM is already created');
        const dir = new URL(String(body!.source_url)).pathname;
        for (const f of ['config.json', 'state.json', 'memory-ranges'])
          if (!existsSync(join(dir, f))) throw new Reject(400, `snapshot file ${f} missing in ${dir}`);
        const config = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Json;
        this.checkFiles(config);
        this.vm = { config, state: body!.resume ? 'Running' : 'Paused' };
        this.everCreated = true;
        return { status: 204 };
      }
      case '/vm.shutdown':
        need(['Running', 'Paused']).state = 'Shutdown';
        return { status: 204 };
      case '/vmm.shutdown':
        setImmediate(() => this.onShutdown?.());
        return { status: 204 };
      default:
        throw new Reject(400, `the fake does not implement ${method} ${t}`);
    }
  }
}

/** A `sleep` standing in for the VMM process. */
export function standIn(): number {
  const child = spawn('sleep', ['600'], { detached: true, stdio: 'ignore' });
  child.unref();
  return child.pid!;
}

/** Value after `flag` in argv. */
export function argAfter(args: string[], flag: string): string {
  const i = args.indexOf(flag);
  if (i < 0) throw new Error(`argv lacks ${flag}: ${args.join(' ')}`);
  return args[i + 1]!;
}

/** Every fake a launcher started (by socket path) and every stand-in pid, for assertions and teardown. */
export interface FakeRegistry<F> {
  fakes: Map<string, F>;
  pids: number[];
  launches: { cmd: string; args: string[] }[];
  closeAll(): Promise<void>;
}

function registry<F extends FakeVmm>(): FakeRegistry<F> {
  const r: FakeRegistry<F> = {
    fakes: new Map(),
    pids: [],
    launches: [],
    async closeAll() {
      for (const f of r.fakes.values()) await f.close();
      for (const pid of r.pids) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {}
      }
    },
  };
  return r;
}

/** Wraps a launcher so the first VMM it starts answers `fault` once (later launches are untouched). */
export function faultOnFirstLaunch<F extends FakeVmm>(
  launcher: VmmLauncher,
  reg: FakeRegistry<F>,
  fault: InjectedFault,
): VmmLauncher {
  let injected = false;
  return async (l) => {
    const r = await launcher(l);
    if (!injected) [...reg.fakes.values()].at(-1)!.faults.push(fault);
    injected = true;
    return r;
  };
}

/**
 * Stands in for the jailer: from the real argv, the chroot `<--chroot-base-dir>/<basename of
 * --exec-file>/<--id>/root`, the API socket (`--api-sock` after `--`, inside the chroot), and the pid
 * file `firecracker.pid` at the chroot's top (the jailer writes Firecracker's pid there).
 */
export function firecrackerLauncher(): { launcher: VmmLauncher; reg: FakeRegistry<FakeFirecracker> } {
  const reg = registry<FakeFirecracker>();
  const launcher: VmmLauncher = async (l) => {
    reg.launches.push({ cmd: l.cmd, args: l.args });
    const root = join(
      argAfter(l.args, '--chroot-base-dir'),
      basename(argAfter(l.args, '--exec-file')),
      argAfter(l.args, '--id'),
      'root',
    );
    const fcArgs = l.args.slice(l.args.indexOf('--') + 1);
    const socket = join(root, argAfter(fcArgs, '--api-sock'));
    if (socket !== l.apiSocket)
      throw new Error(`driver expects ${l.apiSocket}, the jailer would make ${socket}`);
    const fake = new FakeFirecracker(socket, root);
    await fake.listen();
    reg.fakes.set(socket, fake);
    const pid = standIn();
    reg.pids.push(pid);
    writeFileSync(join(root, 'firecracker.pid'), String(pid));
    return { pid };
  };
  return { launcher, reg };
}

/**
 * Stands in for `nsenter … unshare … sh -c 'mount --bind "$1" "$2" && … exec cloud-hypervisor
 * --api-socket path=<sock>'`: reads the bind pair and the socket from the real argv; the fake resolves
 * paths under the mount point to the instance's own directory, as the private mount would.
 */
export function cloudHypervisorLauncher(): { launcher: VmmLauncher; reg: FakeRegistry<FakeCloudHypervisor> } {
  const reg = registry<FakeCloudHypervisor>();
  const launcher: VmmLauncher = async (l) => {
    reg.launches.push({ cmd: l.cmd, args: l.args });
    const i = l.args.indexOf('sh');
    const [vmDir, mountPoint] = [l.args[i + 1]!, l.args[i + 2]!];
    const socket = argAfter(l.args, '--api-socket').replace(/^path=/, '');
    if (socket !== l.apiSocket)
      throw new Error(`driver expects ${l.apiSocket}, the VMM would make ${socket}`);
    const resolve = (p: string) =>
      p === mountPoint || p.startsWith(`${mountPoint}/`) ? vmDir + p.slice(mountPoint.length) : p;
    const fake = new FakeCloudHypervisor(socket, resolve);
    await fake.listen();
    reg.fakes.set(socket, fake);
    const pid = standIn();
    reg.pids.push(pid);
    fake.onShutdown = () => {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {}
      void fake.close();
    };
    return { pid };
  };
  return { launcher, reg };
}

/** A template image of small stand-in files (world-readable, as images.ts writes them). */
export function testImage(dir: string): TemplateImage {
  const f = (name: string) => {
    writeFileSync(join(dir, name), `${name} bytes`, { mode: 0o644 });
    return join(dir, name);
  };
  return {
    template: 'base',
    digest: 'd1g35t',
    lowerDirs: [],
    rootfsImage: f('rootfs.ext4'),
    kernel: { bzImage: f('vmlinuz'), vmlinux: f('vmlinux'), initrd: f('initrd.img'), version: '6.1.0-test' },
  };
}

/** An instance spec on namespace `netns` with the tap `network.ts` attaches. */
export function testSpec(instanceId: string, netns: string, image: TemplateImage): InstanceSpec {
  return {
    instanceId,
    template: 'base',
    image,
    vcpus: 2,
    memoryMiB: 256,
    diskMiB: 16,
    pidsLimit: 100,
    guestToken: `token-of-${instanceId}`,
    network: {
      netns,
      hostIf: `spv${netns}`,
      hostAddress: '10.77.0.1',
      sandboxAddress: '10.77.0.2',
      prefixLength: 30,
      tap: { name: GUEST_NET.tapName, guestMac: GUEST_NET.guestMac },
    },
  };
}

/** What a restore into a new instance on namespace `netns` gets (a new token the driver must not use yet). */
export function testRestoreSpec(instanceId: string, netns: string, image: TemplateImage): RestoreSpec {
  const { vcpus: _v, memoryMiB: _m, diskMiB: _d, ...rest } = testSpec(instanceId, netns, image);
  return { ...rest, guestToken: 'new-token' };
}
