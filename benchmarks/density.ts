/**
 * `space bench density`: host memory and host processes per **idle** sandbox, per driver, read on
 * the stack's host (local stacks only: it reads the host's cgroups and /proc).
 *
 * The benchmark creates N sandboxes of the default shape (default N = 8), runs nothing in them,
 * waits `--settle` seconds, then reads each sandbox `--reads` times one second apart and keeps the
 * median of each figure per sandbox:
 * - gVisor: the instance's memory cgroup (`/sys/fs/cgroup/memory/space/<instance>/`, v1, or
 *   `/sys/fs/cgroup/space/<instance>/`, v2): `usage` = memory.usage_in_bytes / memory.current
 *   (what the driver's `stats()` reports, page cache included), `workingSet` = usage − inactive
 *   file pages (what the kernel could not drop), and `processes` = host processes in the cgroup;
 * - VMM drivers (no cgroup of their own): the VmRSS of the VMM process (the one the agent recorded,
 *   else the host processes whose command line names the instance) and its descendants, summed, as
 *   `usage` and `workingSet`; `processes` = how many there are.
 * The sandbox → instance mapping comes from the agent's record `<state>/sandboxes/<id>/sandbox.json`.
 *
 * The floor, measured in the same run with the same settle and reads: for gVisor, N bare idle
 * containers of the same template (`sleep` as the only process, no guest daemon, no network; see
 * gvisor-lib.ts `startIdleRunscFloor`), read from their cgroups the same way. Its rows are the
 * driver's name plus ` floor`, and each sandbox figure is given as a multiple of it.
 */
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { ProgressFactory } from './progress.ts';
import {
  BENCH_SCHEMA,
  type BenchDocument,
  type BenchOutput,
  composeMarkdown,
  distributionSpec,
  markdownTable,
  type PlotPoint,
  type RunInfo,
  renderSvg,
} from './report.ts';
import type { BenchTarget } from './stack.ts';
import { fmt, type Summary, summarise } from './stats.ts';

/** One idle sandbox's figures (medians over the reads). */
export interface DensitySample {
  sandboxId: string;
  instanceId: string;
  driver: string;
  /** Where the figures come from: `cgroup v1`, `cgroup v2` or `process rss`. */
  source: string;
  /** MiB (2^20 bytes). */
  usageMiB: number;
  /** MiB (2^20 bytes). */
  workingSetMiB: number;
  /** Host processes of the sandbox. */
  processes: number;
  /** A floor container (no SPACE around it), not a sandbox; `sandboxId` is `-`. */
  floor?: boolean;
}

/** Bare idle instances a floor started: their ids name their cgroups; `stop` removes them. */
export interface FloorInstances {
  instanceIds: string[];
  stop: () => Promise<void>;
}

/** A driver's density floor: bare idle instances started beside the sandboxes (see the module doc). */
export interface DensityFloor {
  /** Driver the floor belongs to (`gvisor`). */
  driver: string;
  /** Starts `n` bare idle instances. */
  start: (n: number) => Promise<FloorInstances>;
}

/** Median of a non-empty list (mean of the middle two for even sizes). Pure. */
function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

/** `key value` lines of a cgroup stat file → record. Pure. */
export function parseStatFile(text: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const line of text.split('\n')) {
    const [k, v] = line.trim().split(/\s+/);
    if (k && v !== undefined && /^\d+$/.test(v)) out[k] = Number(v);
  }
  return out;
}

const MIB = 1_048_576;

/** Where each cgroup version keeps an instance's memory figures (the driver's cgroupsPath `/space/<id>`). */
const CGROUP_LAYOUTS = [
  {
    version: 'cgroup v1',
    dir: '/sys/fs/cgroup/memory/space',
    usage: 'memory.usage_in_bytes',
    inactive: 'total_inactive_file',
  },
  { version: 'cgroup v2', dir: '/sys/fs/cgroup/space', usage: 'memory.current', inactive: 'inactive_file' },
] as const;

/** One read of a gVisor instance's cgroup (v1 or v2, whichever the host has); null when it has none. */
async function readCgroup(instanceId: string): Promise<Omit<DensitySample, 'sandboxId' | 'driver'> | null> {
  const text = (f: string) => readFile(f, 'utf8').catch(() => null);
  for (const l of CGROUP_LAYOUTS) {
    const dir = join(l.dir, instanceId);
    const usageText = await text(join(dir, l.usage));
    if (usageText === null) continue;
    const stat = parseStatFile((await text(join(dir, 'memory.stat'))) ?? '');
    const procs = ((await text(join(dir, 'cgroup.procs'))) ?? '').split('\n').filter(Boolean).length;
    const usage = Number(usageText.trim());
    return {
      instanceId,
      source: l.version,
      usageMiB: usage / MIB,
      workingSetMiB: (usage - (stat[l.inactive] ?? 0)) / MIB,
      processes: procs,
    };
  }
  return null;
}

/** Pids of `pid` and its descendants (from /proc/<pid>/task/<pid>/children). */
async function processTree(pid: number): Promise<number[]> {
  const out = [pid];
  for (let i = 0; i < out.length; i++) {
    const kids = await readFile(`/proc/${out[i]}/task/${out[i]}/children`, 'utf8').catch(() => '');
    for (const k of kids.split(/\s+/).filter(Boolean)) out.push(Number(k));
  }
  return out;
}

/**
 * Host pids whose command line names `instanceId` as a whole argument (a VMM started for it: QEMU's
 * `-name`, Firecracker's `--id`), without their own descendants listed twice.
 */
async function pidsNaming(instanceId: string): Promise<number[]> {
  const out: number[] = [];
  for (const entry of await readdir('/proc').catch(() => [] as string[])) {
    if (!/^\d+$/.test(entry)) continue;
    const argv = (await readFile(`/proc/${entry}/cmdline`, 'utf8').catch(() => '')).split('\0');
    if (argv.some((a) => a === instanceId || a.split(/[=,/]/).includes(instanceId))) out.push(Number(entry));
  }
  return out;
}

/**
 * One read of a VMM instance: the summed VmRSS of the process the agent recorded (or, failing that,
 * those whose command line names the instance) and of their descendants; null when none is found.
 */
async function readProcess(
  instanceId: string,
  pid: number | undefined,
): Promise<Omit<DensitySample, 'sandboxId' | 'driver'> | null> {
  const roots = pid ? [pid] : await pidsNaming(instanceId);
  const pids = new Set<number>();
  for (const r of roots) for (const p of await processTree(r)) pids.add(p);
  let kib = 0;
  let seen = 0;
  for (const p of pids) {
    const m = /^VmRSS:\s+(\d+)\s+kB/m.exec(await readFile(`/proc/${p}/status`, 'utf8').catch(() => ''));
    if (!m) continue;
    kib += Number(m[1]);
    seen++;
  }
  if (!seen) return null;
  const rss = (kib * 1024) / MIB;
  return { instanceId, source: 'process rss', usageMiB: rss, workingSetMiB: rss, processes: seen };
}

/** The agent's record of sandbox `id` on a local stack: its instance id and host pid. */
async function instanceOf(stateDir: string, id: string): Promise<{ instanceId: string; pid?: number }> {
  const rec = JSON.parse(await readFile(join(stateDir, 'sandboxes', id, 'sandbox.json'), 'utf8')) as {
    instance: { instanceId: string; pid?: number };
  };
  return rec.instance;
}

/**
 * Measures N idle sandboxes on a local target (see the module doc); deletes them after.
 * @throws Error when the target is not local, or a sandbox has neither a cgroup nor a VMM process.
 */
export async function measureDensity(
  t: BenchTarget,
  o: { n: number; settleSec: number; reads: number; progress: ProgressFactory; floor?: DensityFloor },
): Promise<DensitySample[]> {
  if (!t.local || !t.agentStateDir) {
    throw new Error('density reads the host’s cgroups: run it on the stack’s host (no --target elsewhere)');
  }
  const stateDir = t.agentStateDir;
  const nodes = (await t.nodes()).filter((n) => n.alive);
  const ids: string[] = [];
  const bar = o.progress.phase('density: create', o.n);
  let floor: FloorInstances | null = null;
  try {
    for (let i = 0; i < o.n; i++) {
      const { sandbox, operation } = await t.client.api<{
        sandbox: { id: string };
        operation: { id: string };
      }>('POST', '/v1/sandboxes', { template: 'base', timeoutSec: 600, autoPauseSec: 0 });
      ids.push(sandbox.id);
      await t.client.waitOp(operation.id);
      bar.tick();
    }
    bar.stop();
    if (o.floor) {
      const fb = o.progress.phase(`density: floor (${o.n} bare ${o.floor.driver} instances)`, 1);
      floor = await o.floor.start(o.n);
      fb.tick();
      fb.stop();
    }
    const wait = o.progress.phase(`density: settle ${o.settleSec} s`, o.settleSec);
    for (let s = 0; s < o.settleSec; s++) {
      await new Promise((r) => setTimeout(r, 1000));
      wait.tick();
    }
    wait.stop();
    type Read = Omit<DensitySample, 'sandboxId' | 'driver'>;
    // what to read, resolved once: each sandbox's instance (the agent's record), then the floor's
    const targets: { key: string; read: () => Promise<Read | null>; what: string }[] = [];
    for (const id of ids) {
      const inst = await instanceOf(stateDir, id);
      targets.push({
        key: id,
        read: async () =>
          (await readCgroup(inst.instanceId)) ?? (await readProcess(inst.instanceId, inst.pid)),
        what: `sandbox ${id} (${inst.instanceId}): no cgroup and no VMM process to read`,
      });
    }
    for (const instanceId of floor?.instanceIds ?? [])
      targets.push({
        key: instanceId,
        read: () => readCgroup(instanceId),
        what: `floor instance ${instanceId}: no cgroup to read`,
      });
    const reads = new Map<string, Read[]>();
    const read = o.progress.phase('density: read', o.reads);
    for (let r = 0; r < o.reads; r++) {
      if (r) await new Promise((res) => setTimeout(res, 1000));
      for (const x of targets) {
        const one = await x.read();
        if (!one) throw new Error(x.what);
        reads.set(x.key, [...(reads.get(x.key) ?? []), one]);
      }
      read.tick();
    }
    read.stop();
    const medians = (rs: Read[]) => ({
      instanceId: rs[0]!.instanceId,
      source: rs[0]!.source,
      usageMiB: median(rs.map((x) => x.usageMiB)),
      workingSetMiB: median(rs.map((x) => x.workingSetMiB)),
      processes: median(rs.map((x) => x.processes)),
    });
    const out: DensitySample[] = [];
    for (const id of ids) {
      const sb = await t.client.api<{ nodeId: string | null }>('GET', `/v1/sandboxes/${id}`);
      const driver = nodes.find((n) => n.id === sb.nodeId)?.driver ?? 'unknown';
      out.push({ sandboxId: id, driver, ...medians(reads.get(id)!) });
    }
    for (const instanceId of floor?.instanceIds ?? [])
      out.push({
        sandboxId: '-',
        driver: `${o.floor!.driver} floor`,
        ...medians(reads.get(instanceId)!),
        floor: true,
      });
    return out;
  } finally {
    bar.stop();
    await floor?.stop();
    for (const id of ids) await t.client.api('DELETE', `/v1/sandboxes/${id}`).catch(() => {});
  }
}

/** Per-driver summary of a density run. */
export interface DensitySummary {
  driver: string;
  source: string;
  sandboxes: number;
  usageMiB: Summary;
  workingSetMiB: Summary;
  processes: Summary;
}

/** Groups samples by driver and summarises each figure. Pure. */
export function densitySummary(samples: readonly DensitySample[]): DensitySummary[] {
  const drivers = [...new Set(samples.map((s) => s.driver))].sort();
  return drivers.map((driver) => {
    const xs = samples.filter((s) => s.driver === driver);
    return {
      driver,
      source: [...new Set(xs.map((s) => s.source))].join('+'),
      sandboxes: xs.length,
      usageMiB: summarise(xs.map((s) => s.usageMiB)),
      workingSetMiB: summarise(xs.map((s) => s.workingSetMiB)),
      processes: summarise(xs.map((s) => s.processes)),
    };
  });
}

/** The table, JSON document and plot of a density run. */
export async function densityOutput(
  samples: DensitySample[],
  params: { n: number; settleSec: number; reads: number },
  run: RunInfo,
): Promise<BenchOutput> {
  const summary = densitySummary(samples);
  const rows: string[][] = [];
  for (const d of summary) {
    const floor = d.driver.endsWith(' floor') ? d : summary.find((f) => f.driver === `${d.driver} floor`);
    const ratio = (s: Summary, f: Summary | undefined) =>
      f && f.p50 > 0 ? `${fmt(s.p50 / f.p50, 1)}×` : '-';
    const line = (figure: string, unit: string, s: Summary, digits: number, f?: Summary) => [
      d.driver,
      d.source,
      figure,
      unit,
      String(s.n),
      fmt(s.p50, digits),
      fmt(s.p90, digits),
      fmt(s.max, digits),
      fmt(s.min, digits),
      ratio(s, f),
    ];
    rows.push(line('host memory (usage)', 'MiB', d.usageMiB, 1, floor?.usageMiB));
    rows.push(line('host memory (working set)', 'MiB', d.workingSetMiB, 1, floor?.workingSetMiB));
    rows.push(line('host processes', 'count', d.processes, 0, floor?.processes));
  }
  const table = markdownTable(
    [
      'driver',
      'read from',
      'figure per idle sandbox',
      'unit',
      'n',
      'p50',
      'p90',
      'max',
      'min',
      'p50 ÷ floor',
    ],
    rows,
    [false, false, false, false, true, true, true, true, true, true],
  );
  const doc: BenchDocument = {
    schema: BENCH_SCHEMA,
    command: 'density',
    run,
    params,
    samples,
    summary,
    assumptions: [
      `Idle: created with the default shape, nothing run in them, read after ${params.settleSec} s; each figure is the median of ${params.reads} reads per sandbox.`,
      'usage = the cgroup’s memory.usage_in_bytes (page cache included: what the driver’s stats() reports); working set = usage − inactive file pages; a VMM driver’s figure is its process’s VmRSS.',
      'Warm-pool instances are not counted; memory outside the sandbox cgroups (agent, API, page cache of the shared template) is not included.',
      samples.some((s) => s.floor)
        ? 'Floor (rows “<driver> floor”): bare idle instances of the same template started beside the sandboxes, with the same settle and reads — for gVisor a runsc container with `sleep` as its only process, no guest daemon and no network.'
        : 'No floor measured (--no-floor, or a driver without one).',
    ],
  };
  const points: PlotPoint[] = samples.flatMap((s) => [
    { series: `${s.driver} usage`, value: s.usageMiB },
    { series: `${s.driver} working set`, value: s.workingSetMiB },
  ]);
  return {
    doc,
    markdown: composeMarkdown(
      `space bench density — ${samples.filter((s) => !s.floor).length} idle sandboxes`,
      table,
      doc,
    ),
    svg: await renderSvg(distributionSpec('Host memory per idle sandbox (MiB)', 'MiB', points)),
  };
}
