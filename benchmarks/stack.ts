/**
 * The stack a benchmark measures: `--target URL --api-key K`, else the running local stack
 * (`$SPACE_HOME/local.json` of a live `space up`), else a local stack the benchmark starts itself the
 * way a user would — `space up` as a child process (on free ports, with `--warm <pool>`) — and stops
 * with SIGINT when done, so the agent destroys every sandbox it made.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { request } from 'undici';
import { readLocalState, resolveEndpoint, spaceHome } from '../runtime/cli/local.ts';
import { freeLoopbackPort as freePort } from '../runtime/cli/up-host.ts';
import { type BenchClient, benchClient } from './api.ts';

/** A node as `GET /v1/nodes` shows it (the fields benchmarks read). */
export interface NodeView {
  id: string;
  alive: boolean;
  driver: string;
  /** Ready warm instances per template. */
  warm: Record<string, number>;
  /** Sandboxes the node holds (being deleted included). */
  sandboxes: number;
  templates: string[];
}

/** The stack being measured. */
export interface BenchTarget {
  apiUrl: string;
  client: BenchClient;
  /** True when the API runs on this host (local stack): host-side figures (cgroups, floor) are possible. */
  local: boolean;
  /** The agent's state dir (`$SPACE_HOME/agent`) of a local stack, where sandbox records live. */
  agentStateDir: string | null;
  /** Warm pool size the benchmark asked for, when it started the stack; null when not known. */
  poolSize: number | null;
  stackStartedByBench: boolean;
  /**
   * The `SPACE_TRACE_FILE` the stack's services write their spans to (see runtime/core/tracing.ts):
   * set for a stack the benchmark started, null otherwise (a running stack traces where its operator
   * configured, if at all).
   */
  traceFile: string | null;
  nodes(): Promise<NodeView[]>;
  /** Ready warm instances of `template` over alive nodes. */
  warm(template: string): Promise<number>;
  /** Stops the stack when the benchmark started it (SIGINT, then waits); otherwise nothing. */
  close(): Promise<void>;
}

/** How to find or start the stack. */
export interface TargetOptions {
  /** `--target`: a remote API URL. */
  target?: string;
  /** `--api-key` (with `--target`, or to override the local key). */
  apiKey?: string;
  /** Warm pool to start a local stack with (`space up --warm`); ignored for a running stack. */
  pool: number;
  /** Where `space up`'s progress notes go (default: dropped, kept for the error). */
  log?: (line: string) => void;
  /**
   * Where a stack the benchmark starts writes its spans (JSON lines, see runtime/core/tracing.ts),
   * kept after the run for a closer look; default: a temporary file, removed when the stack stops.
   */
  traceFile?: string;
}

async function readyz(apiUrl: string): Promise<boolean> {
  try {
    const res = await request(`${apiUrl}/readyz`, { headersTimeout: 2000, bodyTimeout: 2000 });
    await res.body.dump();
    return res.statusCode === 200;
  } catch {
    return false;
  }
}

function makeTarget(
  ep: { apiUrl: string; apiKey: string },
  extra: Pick<BenchTarget, 'local' | 'agentStateDir' | 'poolSize' | 'stackStartedByBench' | 'close'> &
    Partial<Pick<BenchTarget, 'traceFile'>>,
): BenchTarget {
  const client = benchClient(ep);
  const nodes = async () => (await client.api<{ nodes: NodeView[] }>('GET', '/v1/nodes')).nodes;
  return {
    apiUrl: ep.apiUrl,
    client,
    nodes,
    async warm(template) {
      return (await nodes()).filter((n) => n.alive).reduce((a, n) => a + (n.warm[template] ?? 0), 0);
    },
    traceFile: null,
    ...extra,
  };
}

/**
 * Finds or starts the stack (see the module doc) and waits until a node has template `base` ready.
 * @throws Error when `space up` fails to start (with its last output) or no node gets ready.
 */
export async function openTarget(o: TargetOptions): Promise<BenchTarget> {
  const home = spaceHome();
  // spans come from the services' environment: only a stack started here writes them to the file
  const noSpans = (where: string) => {
    if (o.traceFile)
      o.log?.(
        `--trace-file ignored: ${where} was not started by this benchmark (start it with SPACE_TRACE_FILE=<path> to keep its spans)`,
      );
  };
  if (o.target) {
    noSpans(`the API at ${o.target}`);
    const ep = resolveEndpoint({ apiUrl: o.target, apiKey: o.apiKey });
    const local = readLocalState(home);
    const t = makeTarget(ep, {
      local: local?.apiUrl === ep.apiUrl,
      agentStateDir: local?.apiUrl === ep.apiUrl ? `${home}/agent` : null,
      poolSize: null,
      stackStartedByBench: false,
      close: async () => {},
    });
    await t.client.waitReady('base');
    return t;
  }
  const running = readLocalState(home);
  if (running && (await readyz(running.apiUrl))) {
    noSpans(`the running local stack (${running.apiUrl})`);
    const ep = resolveEndpoint({ apiKey: o.apiKey });
    const t = makeTarget(ep, {
      local: true,
      agentStateDir: `${home}/agent`,
      poolSize: null,
      stackStartedByBench: false,
      close: async () => {},
    });
    await t.client.waitReady('base');
    return t;
  }
  return startLocalStack(o, home);
}

async function startLocalStack(o: TargetOptions, home: string): Promise<BenchTarget> {
  const space = fileURLToPath(new URL('../runtime/cli/space.ts', import.meta.url));
  const [api, agent, router] = [await freePort(), await freePort(), await freePort()];
  const args = [
    space,
    '--json',
    'up',
    '--api-port',
    String(api),
    '--agent-port',
    String(agent),
    '--router-port',
    String(router),
    '--warm',
    String(o.pool),
  ];
  o.log?.(`starting the local stack: space up --warm ${o.pool} (ports ${api}, ${agent}, ${router})`);
  // the services write their spans here: the latency command prints where the time went
  const traceFile = o.traceFile ?? join(tmpdir(), `space-bench-spans-${process.pid}-${Date.now()}.jsonl`);
  if (o.traceFile) await rm(traceFile, { force: true }); // this run's spans only
  const child: ChildProcess = spawn(process.execPath, args, {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, SPACE_TRACE_FILE: traceFile },
  });
  let out = '';
  let err = '';
  child.stdout!.on('data', (d: Buffer) => {
    out += d.toString();
  });
  child.stderr!.on('data', (d: Buffer) => {
    err += d.toString();
    for (const line of d.toString().split('\n').filter(Boolean)) o.log?.(line);
  });
  const exited = once(child, 'exit');
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGINT'); // never SIGKILL: the agent must get to destroy its sandboxes
      await exited;
    }
  };
  const deadline = Date.now() + 600_000; // a first start builds template base
  while (!out.includes('"apiUrl"')) {
    if (child.exitCode !== null || child.signalCode !== null || Date.now() > deadline) {
      await stop();
      throw new Error(`space up did not start:\n${err.split('\n').slice(-20).join('\n')}`);
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  const state = JSON.parse(out.slice(out.indexOf('{'))) as { apiUrl: string };
  const ep = resolveEndpoint({ apiUrl: state.apiUrl, apiKey: o.apiKey });
  const t = makeTarget(ep, {
    local: true,
    agentStateDir: `${home}/agent`,
    poolSize: o.pool,
    stackStartedByBench: true,
    traceFile,
    close: async () => {
      await stop();
      if (!o.traceFile) await rm(traceFile, { force: true });
      else o.log?.(`spans kept in ${traceFile}`);
    },
  });
  try {
    await t.client.waitReady('base');
  } catch (e) {
    await stop();
    throw e;
  }
  return t;
}
