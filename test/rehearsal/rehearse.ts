#!/usr/bin/env node
/**
 * `npm run rehearse`: boots what `pulumi up` renders for the Akamai `vm` stack in real VMs on this
 * machine (QEMU under emulation, a private bridge in a network namespace, cloud-init NoCloud with
 * the program's own user data), beside stand-ins for what the cloud provides: an OCI registry with
 * credentials holding the image `npm run image` built, an apt mirror, a TCP load balancer.
 * Prints progress and, per VM, the steps of its user data that failed; `--json` prints the summary
 * as JSON. Exit 0 only when every VM's cloud-init finished with no failed step and the API answers
 * ready through the load balancer. Root only.
 *
 * Not yet rehearsed (issue 42 goes on): sandboxes on the node VMs, `space bench latency --target`,
 * a version bump while commands stream, the Crusoe scripts on a Redis 6.0 base (`bullseye`).
 */
import { randomBytes } from 'node:crypto';
import { mkdir, rm } from 'node:fs/promises';
import { Command } from 'commander';
import { request } from 'undici';
import { controlAddress } from '../../providers/vm-network.ts';
import { baseImage } from './base-image.ts';
import { REHEARSAL_NET, run } from './host.ts';
import { forward } from './load-balancer.ts';
import { createNetwork, destroyNetwork } from './network.ts';
import { renderStack } from './render.ts';
import { pushImage, rehearsalCa, type Service, startAptCache, startRegistry } from './services.ts';
import { bootVm, type Vm } from './vm.ts';

const API_PORT = 8080;
const MIRROR = process.env['SPACE_DEBIAN_MIRROR'] || 'http://deb.debian.org/debian';
const ROUTER_PORT = 8082;

interface Options {
  cacheDir: string;
  workDir: string;
  image: string;
  version: string;
  keep: boolean;
  json: boolean;
  apiWaitMinutes: number;
}

/** Host tools the rehearsal runs, and the Debian package of each. */
const TOOLS: Record<string, string> = {
  debootstrap: 'debootstrap',
  'qemu-system-x86_64': 'qemu-system-x86',
  'qemu-img': 'qemu-utils',
  genisoimage: 'genisoimage',
  'docker-registry': 'docker-registry',
  'apt-cacher-ng': 'apt-cacher-ng',
  htpasswd: 'apache2-utils',
  buildah: 'buildah',
  openssl: 'openssl',
  nsenter: 'util-linux',
};

/** Console lines that say a step of the user data failed (systemd, cloud-init, podman). */
const BLOCKER = /(Error:|Failed to |FAILED|failed because|not found|unauthorized|E: )/;

/** What the run found: printed as a table, or as JSON with `--json`. */
interface Summary {
  ok: boolean;
  wallSeconds: number;
  vms: { name: string; address: string; cloudInitSeconds: number | null; blockers: string[] }[];
  apiReady: boolean;
}

async function missingTools(): Promise<string[]> {
  const missing: string[] = [];
  for (const [tool, pkg] of Object.entries(TOOLS)) {
    const found = await run('sh', ['-c', `command -v ${tool}`]).then(
      () => true,
      () => false,
    );
    if (!found) missing.push(pkg);
  }
  return [...new Set(missing)];
}

async function main(o: Options): Promise<Summary> {
  if (process.getuid?.() !== 0) throw new Error('rehearse: run as root (namespaces, taps, debootstrap)');
  const missing = await missingTools();
  if (missing.length > 0)
    throw new Error(
      `rehearse: missing tools: apt-get install -y --no-install-recommends ${missing.join(' ')}`,
    );
  const t0 = Date.now();
  const log = (line: string) => {
    if (!o.json) process.stderr.write(`[${((Date.now() - t0) / 1000).toFixed(0).padStart(5)} s] ${line}\n`);
  };
  const cleanup: (() => Promise<void>)[] = [];
  const vms: Vm[] = [];
  try {
    await rm(o.workDir, { recursive: true, force: true });
    await mkdir(o.workDir, { recursive: true });
    const ca = await rehearsalCa(o.cacheDir);
    const base = await baseImage({
      release: 'bookworm',
      cacheDir: o.cacheDir,
      caCertPem: ca.certPem,
      mirror: MIRROR,
      log,
    });
    log('network: namespace, bridge, veth');
    await createNetwork();
    cleanup.push(destroyNetwork);
    const services: Service[] = [await startAptCache(o.cacheDir, o.workDir, MIRROR)];
    const registry = await startRegistry(o.workDir, ca);
    services.push(registry);
    cleanup.push(async () => {
      for (const s of services) await s.stop();
    });
    const repository = `${registry.address}/space`;
    log(`registry: push ${o.image} as ${repository}:${o.version}`);
    await pushImage(registry, ca, o.image, `${repository}:${o.version}`);
    const lbHost = REHEARSAL_NET.hostAddress;
    const rendering = await renderStack('akamai', {
      version: o.version,
      imageRepository: repository,
      privateCidr: REHEARSAL_NET.privateCidr,
      routerUrl: `http://${lbHost}:${ROUTER_PORT}`,
      bootstrapApiKey: process.env['SPACE_REHEARSAL_API_KEY'] ?? `space_${randomBytes(24).toString('hex')}`,
    });
    log(`rendered: ${rendering.vms.map((v) => v.resource).join(', ')}`);
    let nodeIndex = 0;
    for (const r of rendering.vms) {
      const name = r.role === 'control' ? 'control' : `node${nodeIndex++}`;
      const address =
        r.role === 'control' ? controlAddress(REHEARSAL_NET.privateCidr) : `10.88.0.${20 + nodeIndex}`;
      log(`boot ${name} (${address}) from ${r.resource}`);
      vms.push(
        await bootVm(
          {
            name,
            address,
            userData: r.userData,
            base,
            memoryMiB: r.role === 'control' ? 2048 : 3072,
            vcpus: 1,
          },
          o.workDir,
        ),
      );
    }
    cleanup.push(async () => {
      for (const v of vms) await v.stop();
    });
    const control = vms.find((v) => v.spec.name === 'control');
    if (!control) throw new Error('the program rendered no control VM');
    const api = await forward(lbHost, API_PORT, control.spec.address, API_PORT);
    const router = await forward(lbHost, ROUTER_PORT, control.spec.address, ROUTER_PORT);
    cleanup.push(api.close, router.close);
    const summary: Summary = { ok: false, wallSeconds: 0, vms: [], apiReady: false };
    for (const v of vms) {
      const line = await v.waitForConsole(/Cloud-init v\. .* finished/, 45 * 60_000).catch(() => null);
      const up = line ? /Up ([\d.]+) seconds/.exec(line) : null;
      const blockers = (await v.console())
        .split('\n')
        .filter((l) => /cloud-init\[\d+\]:/.test(l) && BLOCKER.test(l))
        .map((l) => l.replace(/^.*cloud-init\[\d+\]: /, '').trim());
      summary.vms.push({
        name: v.spec.name,
        address: v.spec.address,
        cloudInitSeconds: up ? Number(up[1]) : null,
        blockers,
      });
      log(
        `${v.spec.name}: cloud-init ${line ? 'finished' : 'did not finish'}; ${blockers.length} failed steps`,
      );
      for (const b of blockers) log(`  ${v.spec.name}: ${b.slice(0, 200)}`);
    }
    const deadline = Date.now() + o.apiWaitMinutes * 60_000;
    for (;;) {
      const res = await request(`http://${lbHost}:${API_PORT}/readyz`).catch(() => undefined);
      if (res) {
        const body = await res.body.text();
        log(`API /readyz through the load balancer: ${res.statusCode} ${body.slice(0, 200)}`);
        if (res.statusCode === 200) {
          summary.apiReady = true;
          break;
        }
      }
      if (Date.now() > deadline) break;
      await new Promise((r) => setTimeout(r, 10_000));
    }
    summary.wallSeconds = Math.round((Date.now() - t0) / 1000);
    summary.ok =
      summary.apiReady && summary.vms.every((v) => v.cloudInitSeconds !== null && v.blockers.length === 0);
    log(
      `${summary.ok ? 'passed' : 'FAILED'} in ${summary.wallSeconds} s; consoles under ${o.workDir}/<vm>/console.log`,
    );
    return summary;
  } finally {
    if (o.keep) log(`--keep: VMs and services left running; work dir ${o.workDir}`);
    else for (const c of cleanup.reverse()) await c().catch(() => undefined);
  }
}

const program = new Command('rehearse')
  .description('boot what `pulumi up` renders for the Akamai vm stack in local VMs and try it')
  .option(
    '--cache-dir <dir>',
    'base images, CA and apt cache, kept between runs',
    '/var/cache/space-rehearse',
  )
  .option('--work-dir <dir>', 'this run: VM disks, consoles, registry storage', '/var/tmp/space-rehearse')
  .option('--image <ref>', 'local image to push (buildah storage)', 'localhost/space:0.1.0')
  .option('--version <tag>', "the stack's space:version", '0.1.0')
  .option('--keep', 'leave VMs and services running at the end (debugging)', false)
  .option(
    '--api-wait-minutes <n>',
    'how long to wait for the API through the load balancer',
    (v) => Number(v),
    10,
  )
  .option('--json', 'print the summary as JSON', false)
  .action(async (opts: Options) => {
    const summary = await main(opts);
    if (opts.json) process.stdout.write(`${JSON.stringify(summary, null, 2)}\n`);
    process.exitCode = summary.ok ? 0 : 1;
  });
await program.parseAsync();
