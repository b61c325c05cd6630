#!/usr/bin/env node
/**
 * `npm run rehearse`: boots what `pulumi up` renders for the Akamai `vm` stack in real VMs on this
 * machine (QEMU under emulation, a private bridge in a network namespace, cloud-init NoCloud with
 * the program's own user data), beside stand-ins for what the cloud provides: an OCI registry with
 * credentials holding the image `npm run image` built, an apt mirror, a TCP load balancer.
 * Prints progress and, per VM, the steps of its user data that failed; `--json` prints the summary
 * as JSON. Once the API answers through the load balancer it uses the deployment as a platform team
 * would ({@link exercise}): a sandbox and a command on every node VM, `space bench latency
 * --target`, then a version bump while two sandboxes stream counters, and with `--control-vms 3`
 * (Akamai) the control VM holding the Redis primary powered off while creates go on through the
 * load balancer. Exit 0 only when every VM's cloud-init finished with no failed step, every phase
 * passed, and the streams lost and repeated nothing. Root only.
 */
import { randomBytes } from 'node:crypto';
import { mkdir, rm } from 'node:fs/promises';
import { Command, Option } from 'commander';
import { request } from 'undici';
import { type VmConfigInputs, writeVmConfig } from '../../providers/systemd/vm-config-client.ts';
import { DEPLOY_TARGET_VERSION_KEY } from '../../runtime/core/redis-keys.ts';
import type { NodeInfo } from '../../runtime/core/types.ts';
import { baseImage } from './base-image.ts';
import {
  benchLatency,
  type CounterStream,
  counterDamage,
  type DrainRun,
  drainElsewhere,
  type FailoverRun,
  liveNodes,
  type NodeRun,
  powerOffPrimary,
  STOP_FILE,
  sandboxesOnEveryNode,
  space,
  streamCounter,
  type Target,
} from './exercise.ts';
import { REHEARSAL_NET, run } from './host.ts';
import { balance } from './load-balancer.ts';
import { createNetwork, destroyNetwork } from './network.ts';
import { controlVms, nodeVms, renderStack } from './render.ts';
import {
  pushImage,
  type Registry,
  type RehearsalCa,
  rehearsalCa,
  type Service,
  stampedImage,
  startAptCache,
  startRegistry,
} from './services.ts';
import { bootVm, type Vm } from './vm.ts';

const API_PORT = 8080;
const MIRROR = process.env['SPACE_DEBIAN_MIRROR'] || 'http://deb.debian.org/debian';
const ROUTER_PORT = 8082;

interface Options {
  stack: 'akamai' | 'crusoe';
  cacheDir: string;
  workDir: string;
  image: string;
  version: string;
  keep: boolean;
  json: boolean;
  apiWaitMinutes: number;
  bootWaitMinutes: number;
  upgradeTo: string | undefined;
  upgrade: boolean;
  benchN: number;
  upgradeWaitMinutes: number;
  controlVms: number;
  nodeVms: number | undefined;
  failoverWaitMinutes: number;
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
  'redis-cli': 'redis-tools',
  buildah: 'buildah',
  openssl: 'openssl',
  nsenter: 'util-linux',
};

/**
 * What a node VM without KVM needs, on a host that emulates it (QEMU TCG): a sandbox's guest
 * daemon took more than the driver's 30 s to answer there (run of 2026-12-07: both nodes
 * registered, the first create failed DRIVER_FAILED, then the API's 60 s dispatch timed out).
 */
const SLOW_HOST_ENV = {
  apiEnv: JSON.stringify({ SPACE_DISPATCH_TIMEOUT_MS: '600000' }),
  agentEnv: JSON.stringify({ SPACE_GUEST_READY_TIMEOUT_MS: '480000' }),
};

/**
 * The stacks the rehearsal boots, each on the Debian release that stands in for the cloud's image,
 * with the overrides a VM without KVM needs.
 */
const STACKS = {
  akamai: {
    release: 'bookworm',
    why: 'the vm-mode stack (control VM + node VMs from Linode user data), on Debian 12',
    overrides: { ...SLOW_HOST_ENV },
  },
  crusoe: {
    // Ubuntu 22.04 (Crusoe's default image) ships Redis 6.0, as Debian 11 does: the base that
    // shows a script that works only with a newer Redis
    release: 'bullseye',
    why: "the startup scripts, on Debian 11 (Redis 6.0 like Crusoe's Ubuntu 22.04); the pool runs gvisor: the rehearsal's VMs have no KVM for cloud-hypervisor",
    overrides: {
      ...SLOW_HOST_ENV,
      nodePools: JSON.stringify([{ name: 'default', driver: 'gvisor', instanceType: 'c1a.8x', count: 2 }]),
    },
  },
} as const satisfies Record<
  Options['stack'],
  { release: string; why: string; overrides: Record<string, string> }
>;

/** Console lines that say a step of the user data failed (systemd, cloud-init, podman). */
const BLOCKER = /(Error:|Failed to |FAILED|failed because|not found|unauthorized|E: )/;

/** What the run found: printed as a table, or as JSON with `--json`. */
interface Summary {
  ok: boolean;
  wallSeconds: number;
  vms: { name: string; address: string; cloudInitSeconds: number | null; blockers: string[] }[];
  apiReady: boolean;
  /**
   * Redis on the control VM, asked from inside the private network (the bridge's own address)
   * without the password: true when it refused (NOAUTH), as a node without the password must be.
   */
  redisRefusesWithoutPassword: boolean | null;
  /** One sandbox per node VM and the command run in it (through the load balancer). */
  nodeRuns: NodeRun[];
  /** A node VM drained with `space nodes drain`: where creates went meanwhile (never there). */
  drain: DrainRun | null;
  /** `space bench latency --target` through the load balancer: create latency medians, ms. */
  bench: { source: string; metric: string; n: number; p50Ms: number }[] | null;
  /** The version bump, applied as `pulumi up` applies it, while counters streamed. */
  upgrade: {
    from: string;
    to: string;
    /** Seconds from the write of the new version until every node, the API and the router ran it. */
    rolledSeconds: number | null;
    streams: {
      sandbox: string;
      count: number | null;
      lost: number;
      repeated: number;
      exitCode: number | null;
      /** Lines the client received (the counter's and any other). */
      received: number;
      /** The end of the client's stderr (its coded error when it gave up). */
      stderrTail: string;
    }[];
  } | null;
  /** With several control VMs: the one holding the Redis primary powered off (issue 44). */
  failover: FailoverRun | null;
  /** What failed after the VMs were up (the first error of each phase). */
  errors: string[];
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

/** What the phases after boot need besides the target. */
interface ExerciseContext {
  /** The stack's config overrides the first rendering was made with (a bump renders again with them). */
  readonly overrides: Record<string, string>;
  readonly nodeCount: number;
  /** The control VMs (Redis, the API and the router on each). */
  readonly controls: readonly Vm[];
  /** The Redis password the rehearsal set (`space:redisPassword`). */
  readonly redisPassword: string;
  /** The API backends the load-balancer stand-in has in rotation. */
  readonly apiInRotation: () => string[];
  readonly registry: Registry;
  readonly ca: RehearsalCa;
  readonly repository: string;
  readonly log: (line: string) => void;
}

/** `GET <url>/healthz` → the build that answers, or null when it does not. */
async function healthVersion(url: string): Promise<string | null> {
  const res = await request(`${url}/healthz`, { headersTimeout: 10_000, bodyTimeout: 10_000 }).catch(
    () => undefined,
  );
  if (!res) return null;
  const body = (await res.body.json().catch(() => ({}))) as { version?: string };
  return res.statusCode === 200 ? (body.version ?? null) : null;
}

/**
 * The deployment used as a platform team would, through the load-balancer stand-in: nodes
 * registered, a sandbox and a command on every node VM, the latency benchmark with `--target`,
 * then (unless `--no-upgrade`) a version bump applied as `pulumi up` applies it (the program
 * rendered again with the new `space:version`; its `space:VmConfig` inputs written through
 * `writeVmConfig`) while two sandboxes stream counters. Each phase's first error is recorded in
 * `summary.errors`; a failed phase stops the ones after it.
 */
async function exercise(o: Options, summary: Summary, t: Target, x: ExerciseContext) {
  const phase = async (name: string, f: () => Promise<void>) => {
    try {
      await f();
      return true;
    } catch (err) {
      summary.errors.push(`${name}: ${(err as Error).message.slice(0, 600)}`);
      x.log(`${name} FAILED: ${(err as Error).message.slice(0, 600)}`);
      return false;
    }
  };
  await phase('redis', async () => {
    // from the namespace, the bridge's address (10.88.0.1) is inside the private network: past the
    // control VMs' firewall guard, so only the password stands between it and the state of record
    for (const c of x.controls) {
      const out = await run('ip', [
        'netns',
        'exec',
        REHEARSAL_NET.namespace,
        'redis-cli',
        '-h',
        c.spec.address,
        '-p',
        '6379',
        'GET',
        DEPLOY_TARGET_VERSION_KEY,
      ]).catch((err: Error) => err.message);
      const refused = /NOAUTH|Authentication required/i.test(out);
      summary.redisRefusesWithoutPassword = refused;
      x.log(`redis on ${c.spec.name} without the password: ${out.trim().slice(0, 200)}`);
      if (!refused)
        throw new Error(
          `Redis on ${c.spec.name} answered a client without the password: ${out.slice(0, 200)}`,
        );
    }
  });
  const registered = await phase('nodes', async () => {
    const deadline = Date.now() + o.apiWaitMinutes * 60_000;
    let seen = '';
    for (;;) {
      // every node the API knows, alive or not: a node that registered and then went quiet reads
      // differently from one that never came
      const all = await space<{ nodes: NodeInfo[] }>(t, ['nodes'])
        .then((r) => r.nodes)
        .catch((err: Error) => {
          const line = `nodes: ${err.message.slice(0, 200)}`;
          if (line !== seen) x.log(line);
          seen = line;
          return [] as NodeInfo[];
        });
      const view = all.map((n) => `${n.id} ${n.alive ? 'alive' : 'not alive'} (${n.version})`).join(', ');
      if (all.length && view !== seen) x.log(`nodes: ${view}`);
      if (all.length) seen = view;
      const alive = all.filter((n) => n.alive);
      if (alive.length >= x.nodeCount) return;
      if (Date.now() > deadline)
        throw new Error(`${alive.length} of ${x.nodeCount} nodes alive (known: ${view || 'none'})`);
      await new Promise((r) => setTimeout(r, 10_000));
    }
  });
  if (!registered) return;
  const ran = await phase('sandboxes', async () => {
    summary.nodeRuns = await sandboxesOnEveryNode(t, x.nodeCount, x.log);
    for (const r of summary.nodeRuns) x.log(`${r.node}: ${r.sandbox} ran: ${r.output.replace(/\n/g, ' | ')}`);
  });
  if (!ran) return;
  // a drain needs another node to send creates to
  if (x.nodeCount > 1)
    await phase('drain', async () => {
      const node = [...new Set(summary.nodeRuns.map((r) => r.node))].sort()[0]!;
      summary.drain = await drainElsewhere(t, node, 2);
      x.log(`drain: ${node} drained; creates went to ${summary.drain.placedOn.join(', ')}; undrained`);
    });
  await phase('bench', async () => {
    const doc = (await benchLatency(t, o.benchN)) as {
      summary: { rows: { source: string; metric: string; summary: { n: number; p50: number } }[] };
    };
    summary.bench = doc.summary.rows.map((r) => ({
      source: r.source,
      metric: r.metric,
      n: r.summary.n,
      p50Ms: r.summary.p50,
    }));
    for (const r of summary.bench)
      x.log(`bench latency: ${r.source} ${r.metric} n=${r.n} p50 ${r.p50Ms.toFixed(0)} ms`);
  });
  if (o.upgrade) await upgrade(o, summary, t, x, phase);
  if (x.controls.length > 1)
    await phase('failover', async () => {
      const f = await powerOffPrimary(t, {
        controls: x.controls.map((v) => ({
          name: v.spec.name,
          address: v.spec.address,
          powerOff: () => v.powerOff(),
        })),
        namespace: REHEARSAL_NET.namespace,
        redisPassword: x.redisPassword,
        inRotation: x.apiInRotation,
        apiPort: API_PORT,
        waitMs: o.failoverWaitMinutes * 60_000,
        log: x.log,
      });
      summary.failover = f;
      if (f.firstCreateS === null)
        throw new Error(`no create succeeded within ${o.failoverWaitMinutes} min of the power-off`);
      if (f.boundS === null)
        throw new Error('the new primary or the dead API leaving the rotation was not seen');
      if (f.firstCreateS > f.boundS)
        throw new Error(
          `the first create came ${f.firstCreateS.toFixed(1)} s after the power-off, past the measured failover plus two creates (${f.boundS.toFixed(1)} s)`,
        );
      if (!f.survivorAnswered)
        throw new Error('the sandbox made before the power-off did not run a command after it');
    });
}

/** The version bump phase of {@link exercise}. */
async function upgrade(
  o: Options,
  summary: Summary,
  t: Target,
  x: ExerciseContext,
  phase: (name: string, f: () => Promise<void>) => Promise<boolean>,
) {
  const to = o.upgradeTo ?? `${o.version}-next`;
  await phase('upgrade', async () => {
    x.log(`upgrade: stamp and push ${x.repository}:${to}`);
    await pushImage(x.registry, x.ca, await stampedImage(o.image, to), `${x.repository}:${to}`);
    const sandboxes: string[] = [];
    const streams: CounterStream[] = [];
    try {
      // they must outlive the whole roll: the API's default lifetime (300 s) ended them mid-roll in a
      // run whose VMs took 578 s to roll, and the reaper's kill read as an upgrade that lost them
      const lifetimeSec = String(o.upgradeWaitMinutes * 60 + 900);
      for (let i = 0; i < 2; i++)
        sandboxes.push((await space<{ id: string }>(t, ['sandbox', 'create', '--timeout', lifetimeSec])).id);
      // the streams wait out restarts as long as the roll may take (a router restart under
      // emulation took 141 s, an agent's 181 s: past the CLI's default 60 s)
      for (const id of sandboxes) streams.push(streamCounter(t, id, o.upgradeWaitMinutes * 60));
      // a few lines before the roll starts
      await new Promise((r) => setTimeout(r, 10_000));
      const bumped = await renderStack(o.stack, { ...x.overrides, version: to });
      if (!bumped.vmConfig) throw new Error('the program rendered no space:VmConfig');
      const t1 = Date.now();
      await writeVmConfig(
        { ...(bumped.vmConfig as unknown as VmConfigInputs), apiUrl: t.apiUrl },
        { allowPlain: false },
      );
      x.log(`upgrade: target version ${to} written; waiting for every VM`);
      const deadline = Date.now() + o.upgradeWaitMinutes * 60_000;
      let rolledSeconds: number | null = null;
      for (;;) {
        const nodes = await liveNodes(t).catch(() => [] as NodeInfo[]);
        // every control VM's API and router, each asked directly (the load balancer picks one)
        const apis = await Promise.all(
          x.controls.map((c) => healthVersion(`http://${c.spec.address}:${API_PORT}`)),
        );
        const routers = await Promise.all(
          x.controls.map((c) => healthVersion(`http://${c.spec.address}:${ROUTER_PORT}`)),
        );
        const api = apis.join(',');
        const router = routers.join(',');
        const done = nodes.filter((n) => n.version === to).length;
        if (apis.every((v) => v === to) && routers.every((v) => v === to) && done >= x.nodeCount) {
          rolledSeconds = Math.round((Date.now() - t1) / 1000);
          break;
        }
        if (Date.now() > deadline) {
          x.log(
            `upgrade: not rolled after ${o.upgradeWaitMinutes} min (api ${api}, router ${router}, nodes ${done}/${x.nodeCount})`,
          );
          break;
        }
        await new Promise((r) => setTimeout(r, 10_000));
      }
      x.log(
        `upgrade: ${rolledSeconds === null ? 'did not roll' : `every VM on ${to} after ${rolledSeconds} s`}`,
      );
      for (const id of sandboxes) await space(t, ['exec', id, '--', 'touch', STOP_FILE]);
      const results = await Promise.all(
        streams.map((st) =>
          Promise.race([st.done, new Promise<null>((r) => setTimeout(() => r(null), 120_000))]),
        ),
      );
      summary.upgrade = {
        from: o.version,
        to,
        rolledSeconds,
        streams: results.map((r, i) => {
          const damage = r ? counterDamage(r.lines) : { count: null, lost: 0, repeated: 0 };
          return {
            sandbox: sandboxes[i]!,
            ...damage,
            exitCode: r?.exitCode ?? null,
            received: r?.lines.length ?? 0,
            stderrTail: (r?.stderr ?? '').trim().slice(-600),
          };
        }),
      };
      for (const st of summary.upgrade.streams)
        x.log(
          `stream ${st.sandbox}: ${st.count ?? '?'} lines (${st.received} received), lost ${st.lost}, repeated ${st.repeated}, exit ${st.exitCode}${st.stderrTail ? `; stderr: ${st.stderrTail}` : ''}`,
        );
    } finally {
      for (const st of streams) st.child.kill('SIGKILL');
      for (const id of sandboxes) await space(t, ['sandbox', 'rm', id]).catch(() => undefined);
    }
  });
}

async function main(o: Options): Promise<Summary> {
  if (process.getuid?.() !== 0) throw new Error('rehearse: run as root (namespaces, taps, debootstrap)');
  const missing = await missingTools();
  if (missing.length > 0)
    throw new Error(
      `rehearse: missing tools: apt-get install -y --no-install-recommends ${missing.join(' ')}`,
    );
  const t0 = Date.now();
  if (![1, 3, 5].includes(o.controlVms))
    throw new Error(
      `rehearse: --control-vms is 1, 3 or 5 (got ${o.controlVms}), as space:controlPlane.replicas`,
    );
  if (o.controlVms > 1 && o.stack !== 'akamai')
    throw new Error(
      "rehearse: --control-vms > 1 is rehearsed on akamai only: Crusoe's stack has no load balancer (clients reach the first control VM), so there is nothing to fail over to",
    );
  if (o.nodeVms !== undefined && !(Number.isInteger(o.nodeVms) && o.nodeVms >= 1))
    throw new Error(`rehearse: --node-vms is a whole number of at least 1 (got ${o.nodeVms})`);
  const log = (line: string) => {
    // progress on stderr either way: with --json, stdout carries the summary alone
    process.stderr.write(`[${((Date.now() - t0) / 1000).toFixed(0).padStart(5)} s] ${line}\n`);
  };
  const cleanup: (() => Promise<void>)[] = [];
  // once, last step first: a signal and the normal end may both ask for it
  let tornDown: Promise<void> | undefined;
  const tearDown = () =>
    (tornDown ??= (async () => {
      for (const c of [...cleanup].reverse()) await c().catch(() => undefined);
    })());
  const vms: Vm[] = [];
  // Ctrl-C or a kill: the VMs, stand-ins and namespace go as at a normal end (unless --keep)
  const onSignal = (signal: NodeJS.Signals) => {
    log(`${signal}: stopping`);
    void (o.keep ? Promise.resolve() : tearDown()).then(() => process.exit(signal === 'SIGINT' ? 130 : 143));
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  try {
    await rm(o.workDir, { recursive: true, force: true });
    await mkdir(o.workDir, { recursive: true });
    const ca = await rehearsalCa(o.cacheDir);
    const target = STACKS[o.stack];
    log(`stack ${o.stack}: ${target.why}`);
    const base = await baseImage({
      release: target.release,
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
    const apiKey = process.env['SPACE_REHEARSAL_API_KEY'] ?? `space_${randomBytes(24).toString('hex')}`;
    // a password the rehearsal knows, so it can ask the control VMs' Redis which is the primary
    const redisPassword = randomBytes(24).toString('hex');
    const overrides = {
      ...target.overrides,
      ...controlVms(o.controlVms),
      ...(o.nodeVms !== undefined ? nodeVms(o.stack, o.nodeVms) : {}),
      redisPassword,
      imageRepository: repository,
      privateCidr: REHEARSAL_NET.privateCidr,
      routerUrl: `http://${lbHost}:${ROUTER_PORT}`,
      bootstrapApiKey: apiKey,
      // the registry stand-in asks for credentials, as a private registry does
      imagePullUsername: registry.username,
      imagePullPassword: registry.password,
    };
    const rendering = await renderStack(o.stack, { ...overrides, version: o.version });
    log(`rendered: ${rendering.vms.map((v) => v.resource).join(', ')}`);
    let nodeIndex = 0;
    let controlIndex = 0;
    for (const r of rendering.vms) {
      const name = r.role === 'control' ? `control${controlIndex++ || ''}` : `node${nodeIndex++}`;
      const address = r.address;
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
    const controls = vms.filter((v) => v.spec.name.startsWith('control'));
    if (controls.length === 0) throw new Error('the program rendered no control VM');
    const nodeCount = vms.length - controls.length;
    // the NodeBalancer: one backend per control VM, checked as the program configured it
    const backends = (port: number) => controls.map((c) => ({ host: c.spec.address, port }));
    const api = await balance(lbHost, API_PORT, backends(API_PORT), rendering.healthChecks.api);
    const router = await balance(lbHost, ROUTER_PORT, backends(ROUTER_PORT), rendering.healthChecks.router);
    cleanup.push(api.close, router.close);
    const summary: Summary = {
      ok: false,
      wallSeconds: 0,
      vms: [],
      apiReady: false,
      redisRefusesWithoutPassword: null,
      nodeRuns: [],
      drain: null,
      bench: null,
      upgrade: null,
      failover: null,
      errors: [],
    };
    // one deadline for all of them: they boot at once, so waiting for each in turn must not add up
    const bootDeadline = Date.now() + o.bootWaitMinutes * 60_000;
    for (const v of vms) {
      const line = await v
        .waitForConsole(/Cloud-init v\. .* finished/, Math.max(0, bootDeadline - Date.now()))
        .catch(() => null);
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
    if (summary.apiReady)
      await exercise(
        o,
        summary,
        { apiUrl: `http://${lbHost}:${API_PORT}`, apiKey },
        {
          overrides,
          nodeCount,
          controls,
          redisPassword,
          apiInRotation: api.inRotation,
          registry,
          ca,
          repository,
          log,
        },
      );
    summary.wallSeconds = Math.round((Date.now() - t0) / 1000);
    summary.ok =
      summary.apiReady &&
      summary.errors.length === 0 &&
      summary.redisRefusesWithoutPassword === true &&
      summary.vms.every((v) => v.cloudInitSeconds !== null && v.blockers.length === 0) &&
      summary.nodeRuns.length === nodeCount &&
      (nodeCount < 2 || summary.drain !== null) &&
      (controls.length < 2 || summary.failover !== null) &&
      (!o.upgrade ||
        (summary.upgrade?.rolledSeconds != null &&
          summary.upgrade.streams.length === 2 &&
          summary.upgrade.streams.every((x) => x.count !== null && x.lost === 0 && x.repeated === 0)));
    log(
      `${summary.ok ? 'passed' : 'FAILED'} in ${summary.wallSeconds} s; consoles under ${o.workDir}/<vm>/console.log`,
    );
    return summary;
  } finally {
    if (o.keep) log(`--keep: VMs and services left running; work dir ${o.workDir}`);
    else {
      await tearDown();
      // the VMs are down: their service logs, read from their disks, for whoever looks next
      for (const v of vms)
        await v.journal().then(
          (file) => log(`${v.spec.name}: journal of the space-* units in ${file}`),
          (err: Error) => log(`${v.spec.name}: no journal (${err.message.slice(0, 200)})`),
        );
    }
  }
}

const program = new Command('rehearse')
  .description('boot what `pulumi up` renders for a vm-mode stack in local VMs and try it')
  .addOption(
    new Option('--stack <name>', 'the stack whose rendering boots')
      .choices(Object.keys(STACKS))
      .default('akamai'),
  )
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
  .option(
    '--boot-wait-minutes <n>',
    'how long the VMs may take to finish cloud-init (a loaded 2-core host took over 45)',
    (v) => Number(v),
    75,
  )
  .option(
    '--upgrade-to <tag>',
    'the version bump: the new build is the image stamped with this tag (default <version>-next)',
  )
  .option('--no-upgrade', 'stop after the sandboxes and the benchmark (no version bump)')
  .option('--bench-n <n>', 'creates of `space bench latency --target`', (v) => Number(v), 4)
  .option(
    '--upgrade-wait-minutes <n>',
    'how long every VM may take to run the new version',
    (v) => Number(v),
    40,
  )
  .option(
    '--control-vms <n>',
    'control VMs (space:controlPlane.replicas: 1, 3 or 5); with 3 or 5 (akamai) the one holding the Redis primary is powered off at the end',
    (v) => Number(v),
    1,
  )
  .option(
    '--node-vms <n>',
    "VMs in the stack's node pool (default: the stack file's count); with 1 there is no drain phase",
    (v) => Number(v),
  )
  .option(
    '--failover-wait-minutes <n>',
    'how long creates may fail after the power-off before the phase fails',
    (v) => Number(v),
    10,
  )
  .option('--json', 'print the summary as JSON', false)
  .action(async (opts: Options) => {
    const summary = await main(opts);
    if (opts.json) process.stdout.write(`${JSON.stringify(summary, null, 2)}\n`);
    process.exitCode = summary.ok ? 0 : 1;
  });
try {
  await program.parseAsync();
} catch (err) {
  // a refusal before anything started (flags, root, missing tools): its message, not a stack
  process.stderr.write(`${(err as Error).message}\n`);
  process.exitCode = 2;
}
