/** `space sandbox create|ls|get|rm|timeout|pause|resume|usage`. */
import { randomUUID } from 'node:crypto';
import type { Command } from 'commander';
import {
  type ApiClient,
  assertSucceeded,
  LONG_POLL_MS,
  type Operation,
  type Sandbox,
  type SandboxUsage,
  waitOperation,
} from './client.ts';
import { apiClient, isJson } from './context.ts';
import {
  collectKeyValue,
  formatRelative,
  metadataQuery,
  note,
  parseNonNegativeInt,
  parsePositiveInt,
  parsePositiveNumber,
  printJson,
  println,
  table,
  usageError,
} from './output.ts';

interface CreateOptions {
  template: string;
  vcpus?: number;
  memory?: number;
  timeout?: number;
  autoPause?: number;
  /** `--on-timeout kill|pause`. */
  onTimeout?: 'kill' | 'pause';
  /** false with `--no-auto-resume`. */
  autoResume?: boolean;
  metadata?: Record<string, string>;
  env?: Record<string, string>;
  idempotencyKey?: string;
  wait: boolean;
}

/** Request body of `POST /v1/sandboxes`. Pure. */
export function createBody(o: CreateOptions): Record<string, unknown> {
  const body: Record<string, unknown> = { template: o.template };
  if (o.vcpus !== undefined) body['vcpus'] = o.vcpus;
  if (o.memory !== undefined) body['memoryMiB'] = o.memory;
  if (o.timeout !== undefined) body['timeoutSec'] = o.timeout;
  if (o.autoPause !== undefined) body['autoPauseSec'] = o.autoPause;
  if (o.onTimeout !== undefined) body['onTimeout'] = o.onTimeout;
  if (o.autoResume === false) body['autoResume'] = false;
  if (o.metadata && Object.keys(o.metadata).length) body['metadata'] = o.metadata;
  if (o.env && Object.keys(o.env).length) body['env'] = o.env;
  return body;
}

const STATES = ['creating', 'running', 'pausing', 'paused', 'resuming', 'killing', 'killed'];

/** Validates a `--state` comma list. Pure. */
export function parseStates(value: string): string {
  const parts = value
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  const bad = parts.filter((s) => !STATES.includes(s));
  if (parts.length === 0 || bad.length) {
    throw usageError(`--state takes a comma list of ${STATES.join(', ')}; got "${value}"`);
  }
  return parts.join(',');
}

/** Table rows of `space sandbox ls`. Pure. */
export function sandboxRows(sandboxes: Sandbox[], now = Date.now()): string[][] {
  return sandboxes.map((s) => [
    s.id,
    s.template,
    s.state,
    String(s.vcpus),
    `${s.memoryMiB}M`,
    s.nodeId ?? '-',
    formatRelative(s.createdAt, now),
    s.state === 'killed' ? '-' : formatRelative(s.expiresAt, now),
    Object.entries(s.metadata)
      .map(([k, v]) => `${k}=${v}`)
      .join(',') || '-',
  ]);
}

const SANDBOX_HEADER = [
  'ID',
  'TEMPLATE',
  'STATE',
  'VCPUS',
  'MEMORY',
  'NODE',
  'CREATED',
  'EXPIRES',
  'METADATA',
];

function sandboxPath(id: string): string {
  return `/v1/sandboxes/${encodeURIComponent(id)}`;
}

/** How `show` names what paused a sandbox. */
const PAUSED_BY = { idle: 'idle', request: 'requested', timeout: 'its lifetime ended' } as const;

function printSandbox(s: Sandbox): void {
  const lines: [string, string][] = [
    ['id', s.id],
    ['template', s.template],
    ['state', s.state],
    ['vcpus', String(s.vcpus)],
    ['memory', `${s.memoryMiB} MiB`],
    ['node', s.nodeId ?? '-'],
    ['created from', s.createdFrom ?? (s.fromWarmPool ? 'warm' : '-')],
    ['created', `${s.createdAt} (${formatRelative(s.createdAt)})`],
    ['expires', `${s.expiresAt} (${formatRelative(s.expiresAt)})`],
    ['auto-pause', s.autoPauseSec ? `after ${s.autoPauseSec} s idle` : 'off'],
    ['on timeout', s.onTimeout ?? 'kill'],
    ['auto-resume', s.autoResume === false ? 'off (resume through the API only)' : 'on traffic'],
  ];
  if (s.pause) {
    lines.push([
      'paused',
      `${s.pause.mode} since ${s.pause.pausedAt} (${PAUSED_BY[s.pause.reason]}; ${s.pause.timeLeftSec} s of lifetime left)`,
    ]);
  }
  if (s.endedAt) lines.push(['ended', `${s.endedAt}${s.killReason ? ` (${s.killReason})` : ''}`]);
  if (s.endMessage) lines.push(['message', s.endMessage]);
  for (const [k, v] of Object.entries(s.metadata)) lines.push([`metadata.${k}`, v]);
  const w = Math.max(...lines.map(([k]) => k.length));
  for (const [k, v] of lines) println(`${`${k}:`.padEnd(w + 2)}${v}`);
}

async function listAll(
  api: ApiClient,
  q: { state?: string; metadata?: string; limit?: number },
  all: boolean,
): Promise<{ sandboxes: Sandbox[]; nextCursor: string | null }> {
  const sandboxes: Sandbox[] = [];
  let cursor: string | undefined;
  for (;;) {
    const page = await api.json<{ sandboxes: Sandbox[]; nextCursor: string | null }>('GET', '/v1/sandboxes', {
      query: { ...q, cursor },
    });
    sandboxes.push(...page.sandboxes);
    if (!all || !page.nextCursor) return { sandboxes, nextCursor: page.nextCursor };
    cursor = page.nextCursor;
  }
}

export function registerSandbox(program: Command): void {
  const sandbox = program
    .command('sandbox')
    .alias('sb')
    .description('create, list, inspect and delete sandboxes')
    .addHelpText(
      'after',
      `
Examples:
  id=$(space sandbox create --template base)
  space sandbox ls --state running --metadata team=a
  space sandbox timeout $id 600
  space sandbox rm $id`,
    );

  sandbox
    .command('create')
    .description('create a sandbox and wait until it runs; prints its id')
    .requiredOption('-t, --template <name>', 'template name', 'base')
    .option('--vcpus <n>', 'vCPUs (fractions allowed)', parsePositiveNumber('--vcpus'))
    .option('--memory <MiB>', 'memory, MiB', parsePositiveInt('--memory'))
    .option(
      '--timeout <sec>',
      'running lifetime, seconds; paused time does not count (default: the API’s)',
      parsePositiveInt('--timeout'),
    )
    .option(
      '--auto-pause <sec>',
      'pause after this many idle seconds, 0 = never (default: the API’s)',
      parseNonNegativeInt('--auto-pause'),
    )
    .option(
      '--on-timeout <action>',
      'what the end of the lifetime does: kill (default) or pause',
      (v: string) => {
        if (v !== 'kill' && v !== 'pause') throw usageError('--on-timeout must be kill or pause');
        return v;
      },
    )
    .option('--no-auto-resume', 'traffic through the router does not resume it when paused')
    .option('-m, --metadata <k=v>', 'metadata pair (repeatable)', collectKeyValue('--metadata'))
    .option('-e, --env <K=V>', 'environment variable of every command (repeatable)', collectKeyValue('--env'))
    .option('--idempotency-key <key>', 'makes a retried create return the same sandbox')
    .option('--no-wait', 'return at once (prints the id; the operation id with --json)')
    .addHelpText(
      'after',
      `
Examples:
  space sandbox create --template base
  space sandbox create -t base --vcpus 2 --memory 1024 --timeout 3600 -m owner=me --json
  space sandbox create -t base --no-wait --json   # { sandbox, operation }`,
    )
    .action(async (o: CreateOptions, cmd: Command) => {
      const api = apiClient(cmd);
      // waiting, the API answers once the create has ended: one request unless it takes longer
      // a refused create may be asked again (no node yet, template not ready): under one
      // Idempotency-Key (the caller's, else one of this run) it makes at most one sandbox
      const res = await api.json<{ sandbox: Sandbox; operation: Operation }>('POST', '/v1/sandboxes', {
        repeatable: true,
        body: createBody(o),
        headers: { 'idempotency-key': o.idempotencyKey ?? `cli-${randomUUID()}` },
        query: o.wait ? { waitMs: LONG_POLL_MS } : undefined,
      });
      if (!o.wait) {
        if (isJson(cmd)) printJson(res);
        else println(res.sandbox.id);
        return;
      }
      const ended = res.operation.state === 'succeeded' || res.operation.state === 'failed';
      assertSucceeded(ended ? res.operation : await waitOperation(api, res.operation.id));
      const sb = ended ? res.sandbox : await api.json<Sandbox>('GET', sandboxPath(res.sandbox.id));
      if (isJson(cmd)) printJson(sb);
      else println(sb.id);
    });

  sandbox
    .command('ls')
    .alias('list')
    .description('list sandboxes, newest first')
    .option('--state <s1,s2>', 'only these states (creating, running, paused, killed, …)', parseStates)
    .option(
      '-m, --metadata <k=v>',
      'only sandboxes with this metadata pair (repeatable)',
      collectKeyValue('--metadata'),
    )
    .option('--limit <n>', 'page size (max 1000)', parsePositiveInt('--limit'))
    .option('--all', 'follow cursors and list every page')
    .action(
      async (
        o: { state?: string; metadata?: Record<string, string>; limit?: number; all?: boolean },
        cmd: Command,
      ) => {
        const api = apiClient(cmd);
        const res = await listAll(
          api,
          {
            state: o.state,
            metadata: o.metadata && Object.keys(o.metadata).length ? metadataQuery(o.metadata) : undefined,
            limit: o.limit,
          },
          o.all === true,
        );
        if (isJson(cmd)) return printJson(res);
        if (res.sandboxes.length === 0) return println('no sandboxes');
        println(table(SANDBOX_HEADER, sandboxRows(res.sandboxes)));
        if (res.nextCursor) println(`(more: --all, or --limit)`);
      },
    );

  sandbox
    .command('get')
    .description('show one sandbox')
    .argument('<id>', 'sandbox id')
    .action(async (id: string, _o: unknown, cmd: Command) => {
      const sb = await apiClient(cmd).json<Sandbox>('GET', sandboxPath(id));
      if (isJson(cmd)) printJson(sb);
      else printSandbox(sb);
    });

  sandbox
    .command('rm')
    .alias('kill')
    .description('delete a sandbox (waits until it is gone)')
    .argument('<id>', 'sandbox id')
    .option('--no-wait', 'return at once with the operation')
    .action(async (id: string, o: { wait: boolean }, cmd: Command) => {
      const api = apiClient(cmd);
      const { operation } = await api.json<{ operation: Operation }>('DELETE', sandboxPath(id));
      const op = o.wait ? assertSucceeded(await waitOperation(api, operation.id)) : operation;
      if (isJson(cmd)) printJson(op);
      else println(o.wait ? `deleted ${id}` : `deleting ${id} (operation ${op.id})`);
    });

  sandbox
    .command('timeout')
    .description('set the sandbox’s remaining lifetime to <sec> seconds from now')
    .argument('<id>', 'sandbox id')
    .argument('<sec>', 'seconds', parsePositiveInt('<sec>'))
    .action(async (id: string, sec: number, _o: unknown, cmd: Command) => {
      const sb = await apiClient(cmd).json<Sandbox>('POST', `${sandboxPath(id)}/timeout`, {
        body: { timeoutSec: sec },
      });
      if (isJson(cmd)) printJson(sb);
      else println(`${sb.id} expires at ${sb.expiresAt} (${formatRelative(sb.expiresAt)})`);
    });

  for (const verb of ['pause', 'resume'] as const) {
    const c = sandbox
      .command(verb)
      .description(
        verb === 'pause'
          ? 'pause a sandbox: its files, processes and command output are kept and its lifetime stops (waits until paused)'
          : 'resume a paused sandbox (waits until it runs); commands and the router also resume it',
      )
      .argument('<id>', 'sandbox id')
      .option('--no-wait', 'return at once with the operation');
    if (verb === 'pause') {
      c.option(
        '--mode <mode>',
        'frozen (in memory), hibernated (to disk, capacity freed) or auto',
        (v: string) => {
          if (!['frozen', 'hibernated', 'auto'].includes(v))
            throw usageError('--mode takes frozen, hibernated or auto');
          return v;
        },
      );
    }
    c.action(async (id: string, o: { wait: boolean; mode?: string }, cmd: Command) => {
      const api = apiClient(cmd);
      const started = Date.now();
      const { operation } = await api.json<{ operation: Operation }>('POST', `${sandboxPath(id)}/${verb}`, {
        body: verb === 'pause' && o.mode ? { mode: o.mode } : undefined,
      });
      if (!o.wait) {
        if (isJson(cmd)) printJson(operation);
        else println(`${verb === 'pause' ? 'pausing' : 'resuming'} ${id} (operation ${operation.id})`);
        return;
      }
      if (!isJson(cmd)) note(`${verb === 'pause' ? 'pausing' : 'resuming'} ${id} …`);
      assertSucceeded(await waitOperation(api, operation.id));
      const sb = await api.json<Sandbox>('GET', sandboxPath(id));
      if (isJson(cmd)) return printJson(sb);
      const took = ((Date.now() - started) / 1000).toFixed(1);
      println(
        verb === 'pause'
          ? `paused ${id} (${sb.pause?.mode ?? sb.state}, ${took} s)`
          : `resumed ${id} (${took} s)`,
      );
    });
  }

  sandbox
    .command('usage')
    .description('active, idle and paused time of one sandbox over its life')
    .argument('<id>', 'sandbox id')
    .action(async (id: string, _o: unknown, cmd: Command) => {
      const u = await apiClient(cmd).json<SandboxUsage>('GET', `${sandboxPath(id)}/usage`);
      if (isJson(cmd)) return printJson(u);
      printUsage(u);
    });
}

/** Prints one sandbox's usage as aligned lines. */
function printUsage(u: SandboxUsage): void {
  const total = u.seconds.active + u.seconds.idle + u.seconds.paused;
  println(`sandbox:  ${u.sandboxId} (${u.template})`);
  println(
    `metered:  ${u.startedAt ?? '-'} → ${u.endedAt ?? 'now'} (${total.toFixed(1)} s; now ${u.state ?? 'ended'})`,
  );
  println(
    table(
      ['STATE', 'SECONDS', 'VCPU-SECONDS', 'GIB-SECONDS'],
      (['active', 'idle', 'paused'] as const).map((s) => [
        s,
        u.seconds[s].toFixed(1),
        u.vcpuSeconds[s].toFixed(1),
        u.gibSeconds[s].toFixed(1),
      ]),
    ),
  );
}
