import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TEST_CACHE_DIR } from '../../../test/cache-dir.ts';
import { probe } from '../../../test/guest-probe.ts';
import { pidsWhere } from '../../../test/host-processes.ts';
import { SpaceError } from '../../core/errors.ts';
import { FRAME_EXIT, FRAME_HEADER_BYTES, FRAME_STDOUT, GUEST_PORT } from '../../core/guest-protocol.ts';
import { GuestClient } from '../guest-client.ts';
import { SandboxNetworks } from '../host/network.ts';
import { DEFAULT_IMAGE_ASSETS_DIR, guestKernelDir } from '../image/assets.ts';
import { ensureGuestKernel } from '../image/guest-kernel.ts';
import { buildTemplate } from '../image/templates.ts';
import { vmImage } from '../image/vm-image.ts';
import type { InstanceSpec, SandboxNetwork, TemplateImage } from './driver.ts';
import { MIB_PER_GUEST_PROCESS, MIN_GUEST_PROCESSES } from './gvisor-limits.ts';
import { QemuDriver } from './qemu.ts';

/** Template and image cache shared with the other int tests (persists between runs). */
const CACHE = TEST_CACHE_DIR;
/** A pool of its own so this file never collides with other tests or a running agent. */
const nets = new SandboxNetworks({ pool: '10.79.42.0/24' });
/** The repo's Node 24 (copied into the guest image). */
const RUNTIME_DIR = fileURLToPath(new URL('../../', import.meta.url));
const NODE_24 = [
  fileURLToPath(new URL('../../../node_modules/node/bin/node', import.meta.url)),
  process.execPath,
].find((p) => existsSync(p))!;

let stateDir = '';
let image: TemplateImage;
let driver: QemuDriver;
const networks = new Map<string, SandboxNetwork>();
const clients: GuestClient[] = [];
let seq = 0;

async function newNetwork(instanceId: string): Promise<SandboxNetwork> {
  const network = await nets.allocate(instanceId);
  networks.set(instanceId, network);
  network.tap = await nets.attachTap(network);
  return network;
}

async function newSpec(): Promise<InstanceSpec> {
  const instanceId = `i-qt${process.pid % 1000}${(seq++).toString(36)}`;
  return {
    instanceId,
    guestToken: `token-${instanceId}`,
    diskMiB: 256,
    template: 'base',
    image,
    vcpus: 1,
    memoryMiB: 512,
    pidsLimit: 256,
    network: await newNetwork(instanceId),
  };
}

function client(info: { guest: ConstructorParameters<typeof GuestClient>[0] }): GuestClient {
  const c = new GuestClient(info.guest);
  clients.push(c);
  return c;
}

/** Runs a shell script in the guest; returns stdout chunks as they streamed in, and the exit code. */
async function exec(c: GuestClient, script: string): Promise<{ chunks: string[]; exitCode: number | null }> {
  const p = await c.start({ cmd: script, shell: true });
  const stream = await c.output(p.pid, 0);
  const chunks: string[] = [];
  let buf = Buffer.alloc(0);
  let exitCode: number | null = null;
  for await (const data of stream) {
    buf = Buffer.concat([buf, data as Buffer]);
    while (buf.length >= FRAME_HEADER_BYTES) {
      const len = buf.readUInt32BE(1);
      if (buf.length < FRAME_HEADER_BYTES + len) break;
      const type = buf[0];
      const payload = buf.subarray(FRAME_HEADER_BYTES, FRAME_HEADER_BYTES + len);
      buf = buf.subarray(FRAME_HEADER_BYTES + len);
      if (type === FRAME_STDOUT) chunks.push(payload.toString());
      if (type === FRAME_EXIT)
        exitCode = (JSON.parse(payload.toString()) as { exitCode: number | null }).exitCode;
    }
  }
  return { chunks, exitCode };
}

async function readText(c: GuestClient, path: string): Promise<string> {
  const { body } = await c.readFile(path);
  let out = '';
  for await (const d of body) out += (d as Buffer).toString();
  return out;
}

/** QEMU processes whose argv names `id`'s instance dir. */
function qemuProcesses(id: string): Promise<number[]> {
  const dir = join(stateDir, 'instances', id);
  return pidsWhere((cmd) => cmd.includes('qemu-system') && cmd.includes(dir));
}

/** Everything left for `id` (empty when clean). Releases its network first, as the agent would. */
async function leftovers(id: string): Promise<string[]> {
  const n = networks.get(id);
  if (n) await nets.release(n);
  networks.delete(id);
  const out: string[] = [];
  if ((await qemuProcesses(id)).length) out.push('qemu process');
  if (existsSync(join(stateDir, 'instances', id))) out.push('instance dir');
  if (n && existsSync(`/var/run/netns/${n.netns}`)) out.push('netns');
  return out;
}

beforeAll(async () => {
  await buildTemplate('base', { cacheDir: CACHE });
  // the image bakes the kernel; a test host prepares it once, as it builds the template
  await ensureGuestKernel(guestKernelDir(DEFAULT_IMAGE_ASSETS_DIR), CACHE);
  image = await vmImage('base', CACHE, { nodeBinary: NODE_24, tiniBinary: '/usr/bin/tini-static' });
  stateDir = await mkdtemp(join(tmpdir(), 'space-qemu-'));
  driver = new QemuDriver({ stateDir, healthTimeoutMs: 120_000 });
  await driver.preflight();
}, 20 * 60_000);

afterAll(async () => {
  for (const c of clients) await c.close();
  for (const id of [...networks.keys()]) {
    await driver.destroy(id).catch(() => {});
    await nets.release(networks.get(id)!).catch(() => {});
  }
  if (stateDir) await rm(stateDir, { recursive: true, force: true });
}, 120_000);

describe('QemuDriver (real microVMs under TCG)', () => {
  it('boots, execs with streamed output, round-trips a file, pauses/resumes, snapshots, restores into a new network, destroys cleanly', async () => {
    const spec = await newSpec();
    let t = performance.now();
    const info = await driver.create(spec);
    console.log(`qemu create (TCG, to guest /health): ${(performance.now() - t).toFixed(0)} ms`);
    expect(info).toMatchObject({ instanceId: spec.instanceId, state: 'running', vcpus: 1, memoryMiB: 512 });
    expect(info.guest).toEqual({
      host: spec.network.sandboxAddress,
      port: GUEST_PORT,
      token: spec.guestToken,
    });
    const c = client(info);
    expect(await c.health()).toMatchObject({ ok: true });

    // streamed output: several stdout frames, in order, then the exit code
    const r = await exec(c, 'for i in 1 2 3; do echo line$i; sleep 0.3; done; exit 7');
    expect(r.chunks.join('')).toBe('line1\nline2\nline3\n');
    expect(r.chunks.length).toBeGreaterThanOrEqual(2);
    expect(r.exitCode).toBe(7);

    // file round trip
    await c.writeFile('/home/user/note.txt', Readable.from([Buffer.from('kept across restore\n')]));
    expect(await readText(c, '/home/user/note.txt')).toBe('kept across restore\n');

    // a sandbox sees no host path and no platform source
    const inside = await exec(
      c,
      'cat /proc/mounts; echo ---; ls /opt/space/runtime; echo ---; ls /opt/space; echo ---; uname -r; hostname; cat /etc/resolv.conf',
    );
    const [mounts, runtimeDirs, optSpace, rest] = inside.chunks.join('').split('---\n');
    // no host path appears as a mount source, mount point or option (`/mnt/…` are the initrd's own)
    for (const hostPath of [stateDir, CACHE, '/work/', '/var/lib/', '/tmp/', RUNTIME_DIR]) {
      expect(mounts).not.toMatch(
        new RegExp(`(^|[\\s=,:])${hostPath.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}`, 'm'),
      );
    }
    expect(mounts).toMatch(/^overlay \/ overlay /m);
    // the guest daemon ships as one bundle under runtime/guest (no separate core sources)
    expect(runtimeDirs!.trim().split('\n').sort()).toEqual(['guest']);
    expect(optSpace).not.toContain('guest-token'); // read and deleted by the guest daemon
    expect(rest).toContain(image.kernel!.version);
    expect(rest).toContain('sandbox');
    expect(rest).toContain('nameserver 172.31.0.1');

    // the limits the gVisor driver sets, kept by the VM's kernel (R19-R21): each user's tasks, a
    // sized /dev/shm, tini and the daemon out of the OOM killer's reach, the command back in it
    const limits = await exec(
      c,
      "awk '/^Max processes/ {print $3}' /proc/self/limits; df -k /dev/shm | tail -1 | awk '{print ($2 > 0 && $2 <= 128 * 1024)}'; cat /proc/self/oom_score_adj /proc/$PPID/oom_score_adj /proc/1/oom_score_adj",
    );
    const [nproc, shmBounded, ...adj] = limits.chunks.join('').trim().split('\n');
    expect(Number(nproc)).toBeGreaterThanOrEqual(MIN_GUEST_PROCESSES);
    expect(Number(nproc)).toBeLessThanOrEqual(512 / MIB_PER_GUEST_PROCESS);
    expect(shmBounded).toBe('1');
    expect(adj).toEqual(['0', '-1000', '-1000']);

    // pause: the guest stops answering; resume: it answers again
    await driver.pause(spec.instanceId);
    expect((await driver.list()).find((i) => i.instanceId === spec.instanceId)?.state).toBe('paused');
    expect(await probe(info.guest.host, 1500)).toBe('timeout');
    await driver.resume(spec.instanceId);
    expect(await probe(info.guest.host, 10_000)).toBe('data');

    // a fresh driver object (an agent restart) lists and adopts it
    const fresh = new QemuDriver({ stateDir });
    expect(await fresh.adopt(spec.instanceId)).toMatchObject({ state: 'running', network: spec.network });
    expect((await fresh.stats(spec.instanceId)).memoryBytes).toBeGreaterThan(32 * 2 ** 20);

    // snapshot of a running instance: it keeps running
    const snapDir = join(stateDir, 'snapshots', 's1');
    t = performance.now();
    const ref = await driver.snapshot(spec.instanceId, snapDir);
    console.log(`qemu snapshot: ${(performance.now() - t).toFixed(0)} ms`);
    expect(ref).toMatchObject({
      driver: 'qemu',
      instanceId: spec.instanceId,
      imageDigest: image.digest,
      path: snapDir,
    });
    expect((await readdir(snapDir)).sort()).toEqual(['disk.img', 'memory.bin', 'snapshot.json']);
    expect((await import('node:fs')).statSync(join(snapDir, 'snapshot.json')).mode & 0o777).toBe(0o600);
    expect(await probe(info.guest.host, 10_000)).toBe('data');
    // a write after the snapshot must not appear in the restored copy
    await c.writeFile('/home/user/after.txt', Readable.from([Buffer.from('later')]));

    // restore into a new instance with a new namespace and address
    const rid = `i-qt${process.pid % 1000}${(seq++).toString(36)}`;
    const rnet = await newNetwork(rid);
    const newToken = randomBytes(32).toString('hex');
    t = performance.now();
    const restored = await driver.restore(ref, {
      instanceId: rid,
      template: 'base',
      image,
      pidsLimit: 256,
      guestToken: newToken,
      network: rnet,
    });
    console.log(`qemu restore (to guest /health): ${(performance.now() - t).toFixed(0)} ms`);
    // the guest woke up with the snapshot's token; the driver recorded the new one: rotate to it
    expect(restored.guest.token).toBe(newToken);
    const old = new GuestClient({ ...restored.guest, token: ref.guestToken });
    await old.rotateToken(newToken);
    await old.close();
    expect(restored.guest.host).toBe(rnet.sandboxAddress);
    expect(restored.guest.host).not.toBe(spec.network.sandboxAddress);
    const rc = client(restored);
    expect(await readText(rc, '/home/user/note.txt')).toBe('kept across restore\n');
    const after = await exec(rc, 'test -e /home/user/after.txt && echo present || echo absent');
    expect(after.chunks.join('').trim()).toBe('absent');
    // both run side by side, each on its own network
    expect(await probe(spec.network.sandboxAddress, 5000)).toBe('data');

    // destroy: no qemu process, no files, namespace released
    await driver.destroy(spec.instanceId);
    await driver.destroy(spec.instanceId); // idempotent
    await expect(fresh.adopt(spec.instanceId)).rejects.toMatchObject({ code: 'INSTANCE_LOST' });
    expect(await leftovers(spec.instanceId)).toEqual([]);
    await driver.destroy(rid);
    expect(await leftovers(rid)).toEqual([]);
  }, 200_000);

  it('refuses a snapshot from another image with SNAPSHOT_UNSUPPORTED, and cleans up a VM that never answers', async () => {
    const spec = await newSpec();
    const err = await driver
      .restore(
        {
          driver: 'qemu',
          instanceId: 'i-x',
          template: 'base',
          imageDigest: 'other',
          path: '/nonexistent',
          vcpus: 1,
          memoryMiB: 512,
          diskMiB: 256,
          guestToken: 't',
          createdAt: 0,
        },
        { ...spec },
      )
      .catch((e: unknown) => e);
    expect((err as SpaceError).code).toBe('SNAPSHOT_UNSUPPORTED');

    // an initrd that cannot find its disks powers the VM off: create fails fast with the console tail
    const broken = new QemuDriver({ stateDir, healthTimeoutMs: 60_000 });
    const bad = { ...spec, image: { ...image, rootfsImage: '/dev/null' } };
    const e2 = await broken.create(bad).catch((e: unknown) => e);
    expect(e2).toBeInstanceOf(SpaceError);
    expect((e2 as SpaceError).code).toBe('DRIVER_FAILED');
    expect(await leftovers(spec.instanceId)).toEqual([]);
  }, 90_000);
});
