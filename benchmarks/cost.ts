/**
 * `space bench cost`: what one **active hour** of sandbox use costs, per cloud and instance type,
 * for SPACE self-hosted beside two hosted billing models, on session traces. Pure arithmetic over
 * cited inputs: the price catalogue (`prices.json`: source URL and date per price), a session trace
 * (`traces/*.csv`), the measured density (MiB of host memory per idle sandbox) and the options.
 *
 * Definitions (all times in seconds, money in USD):
 * - A trace is sessions of consecutive `active` / `idle` periods (SPACE's metering states: a
 *   command or data-plane traffic running, or neither). A = Σ active, W = Σ all periods (wall).
 * - **SPACE self-hosted**, with activity metering and auto-pause after `autoPauseSec` idle
 *   (0 = never): a sandbox holds a host slot while active and for the first `autoPauseSec` of each
 *   idle period, then is hibernated (snapshot on disk, memory freed):
 *   R = A + Σ_idle min(idle, autoPauseSec)  (resident seconds).
 *   Slots per host = min(memory slots, CPU slots) where
 *   memory slots = floor((host MiB − reserve MiB) ÷ density MiB) and
 *   CPU slots = floor(host vCPU ÷ (sandbox vCPU × A ÷ R)) — on average A ÷ R of the resident
 *   sandboxes are active and use their whole vCPU; idle ones use none.
 *   Cost = R ÷ 3600 × host USD/hour ÷ slots ÷ utilisation.
 * - **Wall-clock hosted**: cost = W × (vCPU × USD/vCPU-s + GiB × USD/GiB-s) — billed on the
 *   allocated shape for the whole life of each session.
 * - **Flat per session**: cost = Σ_sessions ceil(W_session ÷ sessionSeconds) × USD/session — each
 *   started 20-minute block of a session's life is one paid session.
 * - Cost per active hour = cost ÷ (A ÷ 3600).
 */
import { readFileSync } from 'node:fs';
import {
  BENCH_SCHEMA,
  type BenchDocument,
  type BenchOutput,
  composeMarkdown,
  markdownTable,
  type RunInfo,
  renderSvg,
} from './report.ts';

/** One priced host type of the catalogue. */
export interface HostPrice {
  cloud: string;
  instanceType: string;
  vcpus: number;
  /** As the provider lists it ("GB"), taken as GiB. */
  memoryGiB: number;
  /** USD per hour, on-demand. */
  usdPerHour: number;
  /** Page the price was read from. */
  source: string;
  /** ISO date the price was true on. */
  date: string;
  /** Where we read it. */
  via: string;
}

/** The wall-clock-billed hosted sandbox's rates. */
export interface WallClockPrice {
  name: string;
  /** USD per vCPU-second of allocated CPU. */
  usdPerVcpuSecond: number;
  /** USD per GiB-second of allocated memory. */
  usdPerGibSecond: number;
  source: string;
  date: string;
  via: string;
}

/** The flat per-session price. */
export interface FlatSessionPrice {
  name: string;
  /** USD per started session block. */
  usdPerSession: number;
  /** Length of one paid session block, s. */
  sessionSeconds: number;
  source: string;
  date: string;
  via: string;
}

/** `prices.json`. */
export interface PriceCatalogue {
  about: string;
  hosts: HostPrice[];
  hosted: { wallClock: WallClockPrice; flatSession: FlatSessionPrice };
}

/** The catalogue shipped beside this file. */
export function loadCatalogue(file = new URL('./prices.json', import.meta.url)): PriceCatalogue {
  return JSON.parse(readFileSync(file, 'utf8')) as PriceCatalogue;
}

/** One period of a session. */
export interface Period {
  state: 'active' | 'idle';
  /** s */
  seconds: number;
}

/** One session of a trace: its periods in order. */
export interface Session {
  id: string;
  periods: Period[];
}

/**
 * Parses a trace CSV: `#` comment lines, a header `session,state,seconds`, then one period per
 * line; a session's periods are consecutive in file order. Pure.
 * @throws Error naming the line of a malformed row.
 */
export function parseTrace(csv: string): Session[] {
  const lines = csv.split('\n').map((l) => l.trim());
  const rows = lines.map((l, i) => [l, i + 1] as const).filter(([l]) => l && !l.startsWith('#'));
  const [header, ...data] = rows;
  if (header?.[0] !== 'session,state,seconds') {
    throw new Error(`trace: the first row must be "session,state,seconds", got "${header?.[0] ?? ''}"`);
  }
  const sessions = new Map<string, Session>();
  for (const [line, no] of data) {
    const [id, state, secs] = line.split(',');
    const seconds = Number(secs);
    if (!id || (state !== 'active' && state !== 'idle') || !(seconds >= 0)) {
      throw new Error(`trace line ${no}: expected "<session>,active|idle,<seconds ≥ 0>", got "${line}"`);
    }
    const s = sessions.get(id) ?? { id, periods: [] };
    s.periods.push({ state, seconds });
    sessions.set(id, s);
  }
  if (!sessions.size) throw new Error('trace: no periods');
  return [...sessions.values()];
}

/** Totals of a trace under an auto-pause setting (s). */
export interface TraceTotals {
  sessions: number;
  activeSec: number;
  idleSec: number;
  wallSec: number;
  /** Seconds a sandbox holds a host slot under auto-pause after `autoPauseSec` (0 = never). */
  residentSec: number;
}

/** See {@link TraceTotals}. Pure. */
export function traceTotals(sessions: readonly Session[], autoPauseSec: number): TraceTotals {
  let activeSec = 0;
  let idleSec = 0;
  let residentSec = 0;
  for (const s of sessions) {
    for (const p of s.periods) {
      if (p.state === 'active') {
        activeSec += p.seconds;
        residentSec += p.seconds;
      } else {
        idleSec += p.seconds;
        residentSec += autoPauseSec > 0 ? Math.min(p.seconds, autoPauseSec) : p.seconds;
      }
    }
  }
  return { sessions: sessions.length, activeSec, idleSec, wallSec: activeSec + idleSec, residentSec };
}

/** The sandbox shape every option is priced for. */
export interface SandboxShape {
  vcpus: number;
  memoryGiB: number;
}

/** SPACE's own inputs. */
export interface SelfHostedInputs {
  /** Host memory per idle sandbox, MiB (measured or `--density`). */
  densityMiB: number;
  /** Host memory kept for the OS and SPACE's services, MiB. */
  reserveMiB: number;
  /** Idle seconds before auto-pause (0 = never). */
  autoPauseSec: number;
  /** Average fill of the hosts (1 = fully packed). */
  utilisation: number;
}

/** One SPACE figure on one host type and trace. */
export interface SelfHostedCost {
  memorySlots: number;
  cpuSlots: number;
  /** min of the two. */
  slots: number;
  /** USD for the whole trace. */
  usd: number;
  /** USD per active hour; NaN when no sandbox fits or the trace has no active time. */
  usdPerActiveHour: number;
}

/** SPACE self-hosted cost of a trace on `host` (see the module doc). Pure. */
export function selfHostedCost(
  host: HostPrice,
  t: TraceTotals,
  shape: SandboxShape,
  i: SelfHostedInputs,
): SelfHostedCost {
  const memorySlots = Math.floor((host.memoryGiB * 1024 - i.reserveMiB) / i.densityMiB);
  const activeShare = t.residentSec > 0 ? t.activeSec / t.residentSec : 0;
  const cpuSlots =
    activeShare > 0 ? Math.floor(host.vcpus / (shape.vcpus * activeShare)) : Number.POSITIVE_INFINITY;
  const slots = Math.max(0, Math.min(memorySlots, cpuSlots));
  const usd = slots > 0 ? ((t.residentSec / 3600) * host.usdPerHour) / slots / i.utilisation : Number.NaN;
  return { memorySlots, cpuSlots, slots, usd, usdPerActiveHour: perActiveHour(usd, t) };
}

/** Wall-clock hosted cost of a trace (see the module doc). Pure. */
export function wallClockCost(
  p: WallClockPrice,
  t: TraceTotals,
  shape: SandboxShape,
): { usd: number; usdPerActiveHour: number } {
  const usd = t.wallSec * (shape.vcpus * p.usdPerVcpuSecond + shape.memoryGiB * p.usdPerGibSecond);
  return { usd, usdPerActiveHour: perActiveHour(usd, t) };
}

/** Flat per-session cost of a trace (see the module doc). Pure. */
export function flatSessionCost(
  p: FlatSessionPrice,
  sessions: readonly Session[],
  t: TraceTotals,
): { usd: number; blocks: number; usdPerActiveHour: number } {
  let blocks = 0;
  for (const s of sessions) {
    const wall = s.periods.reduce((a, x) => a + x.seconds, 0);
    blocks += Math.max(1, Math.ceil(wall / p.sessionSeconds));
  }
  const usd = blocks * p.usdPerSession;
  return { usd, blocks, usdPerActiveHour: perActiveHour(usd, t) };
}

/** USD ÷ active hours (NaN without active time). Pure. */
export function perActiveHour(usd: number, t: TraceTotals): number {
  return t.activeSec > 0 ? usd / (t.activeSec / 3600) : Number.NaN;
}

/** Parameters of a cost run (as printed in the JSON). */
export interface CostParams {
  /** Trace name → file. */
  traces: Record<string, string>;
  densityMiB: number;
  /** Where the density came from (`--density`, or the measurement's summary). */
  densitySource: string;
  shape: SandboxShape;
  reserveMiB: number;
  autoPauseSec: number;
  utilisation: number;
  clouds: string[] | null;
}

/** USD with enough digits to compare small figures. Pure. */
export function usd(x: number): string {
  if (!Number.isFinite(x)) return '-';
  return x >= 1 ? `$${x.toFixed(2)}` : x >= 0.01 ? `$${x.toFixed(3)}` : `$${x.toFixed(4)}`;
}

/** Computes every option on every trace; the table, JSON document and plot. */
export async function costOutput(
  p: CostParams,
  catalogue: PriceCatalogue,
  run: RunInfo,
): Promise<BenchOutput> {
  const traces = Object.entries(p.traces).map(([name, file]) => {
    const sessions = parseTrace(readFileSync(file, 'utf8'));
    return { name, file, sessions, totals: traceTotals(sessions, p.autoPauseSec) };
  });
  const hosts = catalogue.hosts.filter((h) => !p.clouds || p.clouds.includes(h.cloud));
  const inputs: SelfHostedInputs = {
    densityMiB: p.densityMiB,
    reserveMiB: p.reserveMiB,
    autoPauseSec: p.autoPauseSec,
    utilisation: p.utilisation,
  };
  const { wallClock, flatSession } = catalogue.hosted;
  type Row = {
    option: string;
    host: string;
    perTrace: Record<string, { usd: number; usdPerActiveHour: number; slots?: number }>;
  };
  const rows: Row[] = hosts.map((h) => ({
    option: 'SPACE self-hosted',
    host: `${h.cloud} ${h.instanceType} (${h.vcpus} vCPU, ${h.memoryGiB} GiB, $${h.usdPerHour}/h)`,
    perTrace: Object.fromEntries(traces.map((t) => [t.name, selfHostedCost(h, t.totals, p.shape, inputs)])),
  }));
  rows.push({
    option: wallClock.name,
    host: `$${wallClock.usdPerVcpuSecond}/vCPU-s + $${wallClock.usdPerGibSecond}/GiB-s`,
    perTrace: Object.fromEntries(traces.map((t) => [t.name, wallClockCost(wallClock, t.totals, p.shape)])),
  });
  rows.push({
    option: flatSession.name,
    host: `$${flatSession.usdPerSession} per ${flatSession.sessionSeconds / 60} min`,
    perTrace: Object.fromEntries(
      traces.map((t) => [t.name, flatSessionCost(flatSession, t.sessions, t.totals)]),
    ),
  });
  const header = [
    'option',
    'host / rate',
    ...traces.flatMap((t) => [`${t.name}: $ per active hour`, `${t.name}: sandboxes/host`]),
  ];
  const body = rows.map((r) => [
    r.option,
    r.host,
    ...traces.flatMap((t) => {
      const c = r.perTrace[t.name]!;
      return [usd(c.usdPerActiveHour), c.slots !== undefined ? String(c.slots) : '-'];
    }),
  ]);
  const pct = (x: number) => `${(x * 100).toFixed(1)} %`;
  const assumptions = [
    `Sandbox shape priced everywhere: ${p.shape.vcpus} vCPU, ${p.shape.memoryGiB} GiB (hosted options bill this allocation for the whole session).`,
    `SPACE: host memory per sandbox ${p.densityMiB.toFixed(1)} MiB (${p.densitySource}), counted for active sandboxes too; ${p.reserveMiB} MiB of each host kept for the OS and SPACE's services.`,
    `SPACE: an active sandbox uses its whole ${p.shape.vcpus} vCPU, an idle one none; slots per host = min(memory slots, CPU slots at the trace's average active share); hosts ${pct(p.utilisation)} full on average.`,
    `SPACE: auto-pause after ${p.autoPauseSec} s idle${p.autoPauseSec ? ' hibernates the sandbox (memory freed; snapshot disk and resume time not charged)' : ' (never)'}; metering bills nothing, the host hours are the cost.`,
    `Hosted wall-clock: ${wallClock.name}, $${wallClock.usdPerVcpuSecond} per vCPU-second + $${wallClock.usdPerGibSecond} per GiB-second (${wallClock.source}, ${wallClock.date}; via ${wallClock.via}); billed from a session's start to its end.`,
    `Flat: $${flatSession.usdPerSession} per started ${flatSession.sessionSeconds / 60}-minute block of each session's life (${flatSession.source}, ${flatSession.date}).`,
    ...hosts.map(
      (h) =>
        `Price ${h.cloud} ${h.instanceType}: $${h.usdPerHour}/h from ${h.source} as of ${h.date} (via ${h.via}).`,
    ),
    'No egress, storage, control-plane, support or operations labour costs are included.',
  ];
  const notes = traces.map(
    (t) =>
      `Trace ${t.name} (${t.file.split('/').slice(-2).join('/')}): ${t.totals.sessions} sessions, ${(t.totals.wallSec / 3600).toFixed(2)} h wall, ` +
      `${(t.totals.activeSec / 3600).toFixed(2)} h active (${pct(t.totals.activeSec / t.totals.wallSec)}), ` +
      `${(t.totals.residentSec / 3600).toFixed(2)} h resident on SPACE under auto-pause.`,
  );
  const doc: BenchDocument = {
    schema: BENCH_SCHEMA,
    command: 'cost',
    run,
    params: { ...p },
    samples: { traces: traces.map((t) => ({ name: t.name, file: t.file, totals: t.totals })), catalogue },
    summary: { rows },
    assumptions,
  };
  // a dot per option and trace: bars have no zero on a log scale, and the figures span 100×
  const spec = {
    title: 'USD per active hour (log scale)',
    data: {
      values: rows
        .flatMap((r) =>
          traces.map((t) => ({
            option: r.option.startsWith('SPACE') ? `SPACE on ${r.host.split(' (')[0]}` : r.option,
            trace: t.name,
            usd: r.perTrace[t.name]!.usdPerActiveHour,
          })),
        )
        .filter((v) => Number.isFinite(v.usd) && v.usd > 0),
    },
    mark: { type: 'point', filled: true, size: 90 },
    width: 420,
    encoding: {
      y: { field: 'option', type: 'nominal', title: null, sort: null, axis: { labelLimit: 360 } },
      x: { field: 'usd', type: 'quantitative', title: 'USD per active hour', scale: { type: 'log' } },
      color: { field: 'trace', type: 'nominal' },
      shape: { field: 'trace', type: 'nominal' },
    },
  };
  return {
    doc,
    markdown: composeMarkdown(
      'space bench cost — USD per active sandbox-hour',
      markdownTable(header, body),
      doc,
      notes,
    ),
    svg: await renderSvg(spec),
  };
}
