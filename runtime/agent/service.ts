/**
 * The node agent service: config → logger → Redis → verify key → driver preflight →
 * network firewall → re-adopt sandboxes → warm pool → heartbeat → listen. On SIGTERM it stops
 * heartbeating (unschedulable), stops serving, drains the warm pool, and — only with
 * SPACE_AGENT_ON_SHUTDOWN=destroy — destroys its sandboxes; by default they keep running and
 * the next agent re-adopts them. While SPACE_DRAIN_FILE exists, or an operator drained the node
 * through the control plane (`space nodes drain`), the node is draining: unschedulable, and a
 * SIGTERM first waits (at most SPACE_DRAIN_WAIT_MS) for its sandboxes to end.
 */

import { existsSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { AGENT_PROTOCOL_VERSION } from '../core/agent-protocol.ts';
import { buildVersion } from '../core/build-version.ts';
import { SpaceError } from '../core/errors.ts';
import { createLogger } from '../core/log-fields.ts';
import { redisConnection } from '../core/redis-connection.ts';
import { keys } from '../core/redis-keys.ts';
import { loadVerifyKey } from '../core/tokens.ts';
import { encodeEndReport } from '../core/types.ts';
import { buildAgentApp } from './app.ts';
import { TeamStreams } from './commands/team-streams.ts';
import { type AgentConfig, hibernateStore, warmTemplates } from './config.ts';
import { forwardingFinding, readUplinks } from './doctor.ts';
import type { TemplateImage } from './drivers/driver.ts';
import { chooseDriver, createDriver } from './drivers/index.ts';
import { qemuKvmBootTest } from './drivers/qemu.ts';
import { DiskGuard } from './host/disk-headroom.ts';
import { GatewayClient } from './host/gateway-client.ts';
import { setKvmBootTest } from './host/kvm.ts';
import { SandboxNetworks } from './host/network.ts';
import { guestKernelDir } from './image/assets.ts';
import { defaultGuestLayerInputs, directoryImage } from './image/images.ts';
import {
  adoptBakedTemplates,
  buildTemplate,
  DEFAULT_TEMPLATES_DIR,
  ensureTemplates,
  listTemplateDefinitions,
  resolveTemplate,
} from './image/templates.ts';
import { vmImage } from './image/vm-image.ts';
import { WarmPool } from './instances/warm-pool.ts';
import { AgentReconciler } from './reconcile.ts';
import { NodeRegistry } from './registry.ts';
import { ActivityMeter } from './sandboxes/activity.ts';
import type { CrashReporter } from './sandboxes/crash-report.ts';
import { SandboxManager } from './sandboxes/manager.ts';
import { MemoryGuard } from './sandboxes/memory-guard.ts';
import { recordedRequest } from './sandboxes/recover-record.ts';
import { scrubCredentialValues } from './sandboxes/state-scrub.ts';

/** Version the agent reports in its heartbeat: the build it runs ({@link buildVersion}). */
export const AGENT_VERSION = buildVersion();

/** A started agent. */
export interface RunningAgent {
  url: string;
  sandboxes: SandboxManager;
  warm: WarmPool;
  /**
   * Stops the agent; `onShutdown` (default: the configured one) says whether its sandboxes keep
   * running for the next agent to re-adopt or are destroyed.
   */
  close(signal?: string, onShutdown?: AgentConfig['onShutdown']): Promise<void>;
}

/** Starts an agent with `config`; resolves once it listens and has sent its first heartbeat. */
export async function startAgent(config: AgentConfig): Promise<RunningAgent> {
  /**
   * Whether the node is draining now: the deployment wrote {@link AgentConfig.drainFile} (a
   * cordoned Kubernetes node), or an operator asked the control plane (`space nodes drain`, read
   * by each heartbeat). Called only once the registry below exists.
   */
  const draining = (): boolean =>
    (!!config.drainFile && existsSync(config.drainFile)) || registry.drainRequested;
  // the guest runs this same Node binary inside every sandbox and needs its TypeScript support
  const major = Number(process.versions.node.split('.')[0]);
  if (major < 24) {
    throw new Error(`the agent needs Node 24 (found ${process.version}); start it through npm run / npx`);
  }
  const log = createLogger('agent', config.logLevel).child({ 'node.id': config.nodeId });
  // named, so `space backup restore` can count the agents connected (CLIENT LIST)
  const redis = redisConnection(config.redisUrl, {
    lazyConnect: true,
    maxRetriesPerRequest: 3,
    connectionName: 'space-agent',
  });
  await redis.connect();
  const verifyKey = await loadVerifyKey(config.verifyKeyFile);

  const driverLog = log.child({ component: 'driver' });
  // KVM counts as usable only when a guest boots under it (a nested /dev/kvm can open and still hang)
  const kernelDir = guestKernelDir(config.imageAssetsDir);
  setKvmBootTest(qemuKvmBootTest({ cacheDir: config.cacheDir, kernelDir, qemuBinary: config.qemuBinary }));
  const choice = await chooseDriver(config);
  const driver = createDriver(
    choice.driver,
    config,
    {
      stateDir: `${config.stateDir}/driver`,
      log: (msg, fields) => driverLog.info(fields ?? {}, msg),
    },
    choice.kvm,
  );
  await driver.preflight();
  log.info({ driver: driver.name, kvm: choice.kvm, why: choice.reason }, 'driver chosen');
  // CIDR egress rules need the uplink to forward their replies: said once at start, as doctor says it
  void readUplinks().then(
    (uplinks) => {
      const f = forwardingFinding(uplinks);
      if (!f.ok) log.warn({ found: f.detail, fix: f.remedy }, 'CIDR egress rules will not work on this node');
    },
    (err: unknown) => log.warn({ err }, 'IPv4 forwarding could not be checked'),
  );
  const guestInputs = defaultGuestLayerInputs();
  const templatesDir = config.templatesDir || DEFAULT_TEMPLATES_DIR;
  const images = new Map<string, Promise<TemplateImage>>();
  /** The image of a template for this driver, made once per agent process. */
  const templateImage = (t: string): Promise<TemplateImage> => {
    let p = images.get(t);
    if (!p) {
      // the gateway's per-deployment CA is part of the image (a trust layer), for every driver
      const ca = config.trustedCaFile || undefined;
      p =
        driver.capabilities.rootfs === 'ext4'
          ? vmImage(t, config.cacheDir, guestInputs, {
              trustedCaFile: ca,
              templatesDir,
              kernelDir,
              progress: (m) => log.info({ 'template.id': t }, m),
            })
          : directoryImage(t, config.cacheDir, guestInputs, ca, templatesDir);
      p.catch(() => images.delete(t));
      images.set(t, p);
    }
    return p;
  };
  const netLog = log.child({ component: 'network' });
  const gateway = config.gatewaySocket ? new GatewayClient(config.gatewaySocket) : null;
  const networks = new SandboxNetworks({
    pool: config.networkPool,
    gateway: gateway
      ? { dns: config.gatewayDnsPort, http: config.gatewayHttpPort, tls: config.gatewayTlsPort }
      : null,
    log: (msg, f) => netLog.info(f ?? {}, msg),
  });
  await networks.ensureFirewall();
  await networks.adopt();

  // the image's baked templates are this node's builds (no debootstrap, no Debian egress); a
  // deployed node has no shell to run `space template build` on: it builds its warm templates that
  // the image lacks itself at the first start (SPACE_BUILD_TEMPLATES=warm), before it registers
  const baked = await adoptBakedTemplates(config.imageAssetsDir, config.cacheDir, templatesDir);
  if (baked.length) log.info({ templates: baked }, 'templates baked into the image are used');
  const ready = await ensureTemplates(await listTemplateDefinitions(templatesDir), {
    resolve: (t) => resolveTemplate(t, config.cacheDir, templatesDir),
    build: (t) => {
      log.info({ 'template.id': t }, 'template build started');
      return buildTemplate(t, {
        cacheDir: config.cacheDir,
        templatesDir,
        onProgress: (m) => log.info({ 'template.id': t }, m),
      });
    },
    toBuild: new Set(config.buildTemplates === 'warm' ? warmTemplates(config) : []),
    warn: (t, message, err) => log.warn({ 'template.id': t, ...(err ? { err } : {}) }, message),
  });

  const activity = new ActivityMeter({
    redis,
    graceMs: config.activeGraceMs,
    log: log.child({ component: 'activity' }),
  });
  // the state disk's floor: under it the node takes no new sandboxes (host/disk-headroom.ts)
  const disk = new DiskGuard(
    [config.stateDir, join(config.stateDir, 'sandboxes')],
    { bytes: config.diskReserveBytes, percent: config.diskReservePercent },
    (h) => {
      const fields = { freeBytes: h.freeBytes, totalBytes: h.totalBytes, stateDir: config.stateDir };
      if (h.pressure) log.error(fields, 'state disk under its floor: the node takes no new sandboxes');
      else log.info(fields, 'state disk has room again: the node takes new sandboxes');
    },
  );
  const sampleDisk = () =>
    disk.sample().catch((err: unknown) => log.warn({ err }, 'the state disk could not be read (statfs)'));
  await mkdir(config.stateDir, { recursive: true });
  await sampleDisk();
  const sandboxes = new SandboxManager({
    stateDir: config.stateDir,
    driver,
    networks,
    templateImage,
    pidsLimit: config.pidsLimit,
    diskMiB: config.diskMiB,
    createConcurrency: config.createConcurrency,
    refillConcurrency: config.warmRefillConcurrency,
    spoolLimitBytes: config.spoolLimitBytes,
    spoolRetention: {
      maxCommands: config.spoolMaxCommands,
      maxBytes: config.spoolSandboxBytes,
      maxAgeMs: config.spoolRetentionMs,
    },
    gateway,
    baseEnv: config.trustedCaFile ? { NODE_EXTRA_CA_CERTS: '/etc/ssl/certs/ca-certificates.crt' } : {},
    hibernateDir: config.hibernateDir || join(config.stateDir, 'hibernated'),
    hibernateStore: hibernateStore(config),
    activity,
    // a torn sandbox.json is rebuilt from the instance and this record (adopt.ts)
    recorded: (id) => recordedRequest(redis, config.nodeId, id),
    admitDisk: () => disk.admit(),
    log,
  });
  // values written by earlier versions leave the state files before anything reads them again
  const scrubbed = await scrubCredentialValues(`${config.stateDir}/sandboxes`);
  if (scrubbed > 0) log.info({ files: scrubbed }, 'credential values removed from sandbox state files');
  const { lost } = await sandboxes.adopt();
  // a sandbox whose VM died while no agent watched: the control plane records why it ended
  for (const id of lost) {
    await redis.hset(
      keys.nodeEnded(config.nodeId),
      id,
      encodeEndReport({
        reason: 'crashed',
        message: 'its VM stopped while the node agent was down (crashed, killed or the node rebooted)',
      }),
    );
  }
  // reconcile with the state of record: a sandbox the control plane ended while this agent was
  // down (or never finished creating) must not keep running here — now, and on every pass after
  const reconciler = new AgentReconciler({
    redis,
    nodeId: config.nodeId,
    sandboxes,
    log: log.child({ component: 'reconcile' }),
  });
  await reconciler.pass();
  const swept = await sandboxes.sweepHibernated(async (id) => {
    const state = await redis.hget(keys.sandbox(id), 'state');
    return state === null || state === 'killing' || state === 'killed';
  });
  if (swept.length) log.info({ sandboxes: swept }, 'hibernated snapshots of ended sandboxes removed');
  const slots = sandboxes.warmSlots;
  const warm = new WarmPool({
    templates: warmTemplates(config).filter((t) => ready.includes(t)),
    min: config.warmPoolSize,
    max: Math.max(config.warmPoolSize, config.warmPoolMax),
    shape: { vcpus: config.warmVcpus, memoryMiB: config.warmMemoryMiB },
    parallel: Math.min(config.warmRefillConcurrency, config.createConcurrency),
    share: config.warmMemoryShare,
    capacityMiB: config.memoryMiB,
    reservedMiB: () => sandboxes.reservedMiB(),
    footprint: async (i) => (await driver.stats(i.instanceId)).memoryBytes,
    // slots come from the instance factory through the node's warm-slot keeper, not the manager
    schedule: () => slots.refillSoon(),
    // a slot takes disk too: none is made while the state disk is under its floor
    boot: (t) =>
      disk.last?.pressure
        ? Promise.reject(new SpaceError('NODE_DISK_FULL', 'the state disk is under its floor: no warm slot'))
        : slots.boot(t, { vcpus: config.warmVcpus, memoryMiB: config.warmMemoryMiB }),
    discard: (i) => slots.discard(i),
    log: log.child({ component: 'warm-pool' }),
  });
  slots.attach(warm);
  // template snapshots first (drivers that can restore), so warm slots and cold creates restore
  // from them instead of booting; the agent serves meanwhile
  const snapshotsMade = (async () => {
    for (const t of warmTemplates(config).filter((x) => ready.includes(x))) {
      await sandboxes
        .prepareSnapshot(t, { vcpus: config.warmVcpus, memoryMiB: config.warmMemoryMiB })
        .catch((err: unknown) =>
          log.warn({ err, 'template.id': t }, 'template snapshot failed; creates boot'),
        );
    }
  })().finally(() => {
    warm.refill();
    // re-sized every heartbeat: grows with demand, shrinks once it has passed
    warm.start(config.heartbeatMs);
  });

  const teamStreams = new TeamStreams({ redis, log: log.child({ component: 'team-streams' }) });
  const app = await buildAgentApp({
    config,
    log,
    verifyKey,
    sandboxes,
    warm,
    activity,
    reconciler,
    teamStreams,
    disk,
  });
  await app.listen({ host: config.host, port: config.port });
  const port = (app.server.address() as { port: number }).port;
  const registry = new NodeRegistry({
    redis,
    log,
    registration: {
      id: config.nodeId,
      url: config.advertiseUrl || `http://${config.host}:${port}`,
      driver: driver.name,
      capabilities: [
        ...Object.entries(driver.capabilities)
          .filter(([, v]) => v === true)
          .map(([k]) => k),
        ...(choice.kvm ? ['kvm'] : []),
      ],
      protocol: AGENT_PROTOCOL_VERSION,
      version: AGENT_VERSION,
      vcpus: config.vcpus,
      memoryMiB: config.memoryMiB,
      maxSandboxes: config.maxSandboxes,
      hibernateStore: hibernateStore(config),
    },
    state: () => ({
      schedulable: !disk.last?.pressure && !draining(),
      disk: disk.last,
      templates: ready,
      warm: warm.counts(),
      warmHeld: (() => {
        const h = warm.held();
        return {
          memoryMiB: h.memoryMiB,
          slotFootprintMiB: h.footprintMiB,
          slotVcpusMilli: Math.round(config.warmVcpus * 1000),
          slotMemoryMiB: config.warmMemoryMiB,
        };
      })(),
      sandboxes: sandboxes.list().map((sb) => sb.id),
    }),
    rejoin: async () => {
      await reconciler.pass();
    },
  });
  // read before each heartbeat writes it (the beat itself reads the last reading)
  const diskSampler = setInterval(() => void sampleDisk(), config.heartbeatMs);
  diskSampler.unref();
  await registry.start(config.heartbeatMs);
  reconciler.start(config.heartbeatMs);
  // watchdog: notice sandboxes that died on their own, and keep the gateway's registrations current
  let watching: Promise<unknown> | null = null;
  const reportCrash: CrashReporter = async (id, report) => {
    await redis.hset(keys.nodeEnded(config.nodeId), id, encodeEndReport(report));
  };
  sandboxes.reportCrashesTo(reportCrash);
  const watchdog = setInterval(() => {
    if (watching) return;
    watching = sandboxes
      .watch(reportCrash)
      .catch((err: unknown) => log.error({ err }, 'watchdog pass failed'))
      .finally(() => (watching = null));
  }, config.watchdogMs);
  // sandboxes without an OOM killer of their own (gVisor): one process's memory never ends them
  const memoryCharge = driver.memoryCharge?.bind(driver);
  const memoryGuard = memoryCharge
    ? new MemoryGuard({
        sandboxes: () =>
          sandboxes
            .list()
            .filter((sb) => !sb.paused && !sb.crashed)
            .map((sb) => ({
              id: sb.id,
              instanceId: sb.instance.instanceId,
              limitBytes: sb.instance.memoryMiB * 2 ** 20,
              vcpus: sb.instance.vcpus,
              oomKill: () => sb.guest.oomKill(),
            })),
        charge: memoryCharge,
        log,
      })
    : null;
  memoryGuard?.start();
  // usage reports that failed (Redis away) go out again
  const meterSync = setInterval(() => {
    activity.sync().catch((err: unknown) => log.warn({ err }, 'usage sync failed'));
  }, config.heartbeatMs);
  meterSync.unref();
  // command outputs read or aged out leave the disk (commands/retention.ts)
  let reclaiming: Promise<unknown> | null = null;
  const outputSweep = setInterval(() => {
    reclaiming ??= sandboxes
      .reclaimOutputs()
      .catch((err: unknown) => log.warn({ err }, 'command output reclaim failed'))
      .finally(() => (reclaiming = null));
  }, config.watchdogMs);
  outputSweep.unref();
  log.info({ port, templates: ready }, 'agent ready');

  let closing: Promise<void> | null = null;
  const close = (signal = 'close', onShutdown = config.onShutdown) => {
    closing ??= (async () => {
      log.info({ signal, onShutdown }, 'agent stopping');
      if (draining() && sandboxes.size > 0) {
        // the node is going away: refuse creates and give its sandboxes the drain budget to end,
        // heartbeating meanwhile (unschedulable) so the control plane does not declare it lost
        sandboxes.stopAccepting();
        log.info(
          { sandboxes: sandboxes.size, waitMs: config.drainWaitMs },
          'draining: waiting for sandboxes to end',
        );
        const until = Date.now() + config.drainWaitMs;
        while (sandboxes.size > 0 && Date.now() < until) await new Promise((r) => setTimeout(r, 250));
        log.info({ left: sandboxes.size }, 'draining: done waiting');
      }
      clearInterval(watchdog);
      memoryGuard?.stop();
      clearInterval(meterSync);
      clearInterval(outputSweep);
      clearInterval(diskSampler);
      await reclaiming;
      await watching;
      await reconciler.stop();
      await snapshotsMade;
      // deregistering is a courtesy (the alive key expires anyway): never let a dead Redis hold up shutdown
      await Promise.race([
        // a restart that keeps its sandboxes holds them for the next agent; a node going away does not
        registry.stop(onShutdown === 'destroy', draining() ? 0 : config.restartHoldMs),
        new Promise((r) => setTimeout(r, 2000)),
      ]).catch((err: unknown) => log.warn({ err }, 'deregistration failed'));
      sandboxes.stopAccepting();
      await warm.drain();
      if (onShutdown === 'destroy') await sandboxes.destroyAll();
      else await sandboxes.detachAll();
      await app.close();
      await gateway?.close();
      redis.disconnect();
      log.info('agent stopped');
    })();
    return closing;
  };
  return { url: `http://${config.host}:${port}`, sandboxes, warm, close };
}
