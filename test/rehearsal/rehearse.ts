#!/usr/bin/env node
/**
 * `npm run rehearse`: boots what `pulumi up` renders for the Akamai `vm` stack in real VMs on this
 * machine (QEMU under emulation, a private bridge in a network namespace, cloud-init NoCloud with
 * the program's own user data), beside stand-ins for what the cloud provides: an OCI registry with
 * credentials holding the image `npm run image` built, an apt mirror, a TCP load balancer.
 * Prints progress; `--json` prints the summary as JSON. Root only.
 */
import { randomBytes } from 'node:crypto';
import { mkdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { Command } from 'commander';
import { request } from 'undici';
import { controlAddress } from '../../providers/vm-network.ts';
import { baseImage } from './base-image.ts';
import { REHEARSAL_NET } from './host.ts';
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
}

async function main(o: Options): Promise<void> {
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
    const base = await baseImage({ release: 'bookworm', cacheDir: o.cacheDir, caCertPem: ca.certPem, mirror: MIRROR, log });
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
    for (const v of vms) {
      const line = await v.waitForConsole(/Cloud-init v\. .* finished/, 45 * 60_000);
      log(`${v.spec.name}: ${line.replace(/^.*(Cloud-init)/, '$1')}`);
    }
    const deadline = Date.now() + 20 * 60_000;
    for (;;) {
      const res = await request(`http://${lbHost}:${API_PORT}/readyz`).catch(() => undefined);
      if (res) {
        const body = await res.body.text();
        log(`API /readyz through the load balancer: ${res.statusCode} ${body.slice(0, 200)}`);
        if (res.statusCode === 200) break;
      }
      if (Date.now() > deadline) throw new Error('the API never answered ready through the load balancer');
      await new Promise((r) => setTimeout(r, 10_000));
    }
    log(`done in ${((Date.now() - t0) / 1000).toFixed(0)} s`);
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
  .option('--json', 'print the summary as JSON', false)
  .action(async (opts: Options) => {
    await main(opts);
  });
await program.parseAsync();
