/**
 * `space ops get`, `space nodes` (and `nodes drain|undrain`), `space template ls` — views of the
 * control plane, and draining a node before it goes.
 */

import { setTimeout as sleep } from 'node:timers/promises';
import type { Command } from 'commander';
import type { NodeInfo } from '../core/types.ts';
import type { ApiClient } from './client.ts';
import { type Operation, waitOperation } from './client.ts';
import { apiClient, isJson } from './context.ts';
import { CliError, formatRelative, note, parsePositiveInt, printJson, println, table } from './output.ts';

/** A node as `GET /v1/nodes` returns it. */
type NodeView = NodeInfo;

function printOperation(op: Operation): void {
  println(`id:       ${op.id}`);
  println(`kind:     ${op.kind}`);
  println(`target:   ${op.target}`);
  println(`state:    ${op.state}`);
  if (op.error) println(`error:    ${op.error.code}: ${op.error.message}`);
  println(`created:  ${op.createdAt}`);
  println(`updated:  ${op.updatedAt}`);
}

export function registerOps(program: Command): void {
  const ops = program.command('ops').alias('op').description('asynchronous operations (create, delete)');
  ops
    .command('get')
    .description('show an operation; with --wait, wait up to SEC seconds for it to end')
    .argument('<id>', 'operation id')
    .option('--wait <sec>', 'wait until it succeeds or fails, at most this long', parsePositiveInt('--wait'))
    .addHelpText('after', '\nExamples:\n  space ops get op_123\n  space ops get op_123 --wait 60 --json')
    .action(async (id: string, o: { wait?: number }, cmd: Command) => {
      const api = apiClient(cmd);
      const op = o.wait
        ? await waitOperation(api, id, o.wait * 1000)
        : await api.json<Operation>('GET', `/v1/operations/${encodeURIComponent(id)}`);
      if (isJson(cmd)) printJson(op);
      else printOperation(op);
    });

  const nodes = program
    .command('nodes')
    .description('list the nodes (agents) of the platform; drain one before it goes')
    .action(async (_o: unknown, cmd: Command) => {
      const { nodes } = await apiClient(cmd).json<{ nodes: NodeView[] }>('GET', '/v1/nodes');
      if (isJson(cmd)) return printJson({ nodes });
      if (nodes.length === 0) return println('no nodes');
      println(
        table(
          ['ID', 'ALIVE', 'DRIVER', 'SANDBOXES', 'VCPUS', 'MEMORY', 'WARM', 'HEARTBEAT', 'URL'],
          nodes.map((n) => [
            n.id,
            n.alive ? (n.schedulable ? 'yes' : 'draining') : 'no',
            n.driver,
            `${n.sandboxes}/${n.maxSandboxes}`,
            `${n.usedVcpus}/${n.vcpus}`,
            `${n.usedMemoryMiB}/${n.memoryMiB}M`,
            Object.entries(n.warm)
              .map(([t, c]) => `${t}:${c}`)
              .join(',') || '-',
            formatRelative(n.heartbeatAt),
            n.url,
          ]),
        ),
      );
    });
  registerDrain(nodes);
}

/** What `PUT /v1/nodes/:id/drain` answers. */
interface DrainAnswer {
  node: NodeView;
  hibernating: { sandboxId: string; operationId: string }[];
  skipped: { sandboxId: string; reason: string }[];
}

/** `space nodes drain <id>` and `space nodes undrain <id>`. */
function registerDrain(nodes: Command): void {
  nodes
    .command('drain')
    .description(
      'stop placing sandboxes on a node before it is replaced or retired; with --wait, wait until its sandboxes have ended (or, with --hibernate, moved to the shared hibernation store)',
    )
    .argument('<id>', 'node id (see `space nodes`)')
    .option(
      '--hibernate',
      'also hibernate its running sandboxes so they resume on another node (shared store only)',
    )
    .option(
      '--wait <sec>',
      'wait until the node holds no sandbox, at most this long',
      parsePositiveInt('--wait'),
    )
    .addHelpText(
      'after',
      '\nExamples:\n  space nodes drain node-a --wait 3600\n  space nodes drain node-a --hibernate --wait 600 --json\n  space nodes undrain node-a',
    )
    .action(async (id: string, o: { hibernate?: boolean; wait?: number }, cmd: Command) => {
      const api = apiClient(cmd);
      const answer = await api.json<DrainAnswer>('PUT', `/v1/nodes/${encodeURIComponent(id)}/drain`, {
        body: { hibernate: o.hibernate ?? false },
      });
      const json = isJson(cmd);
      if (!json) {
        println(`node ${id} drained: it takes no new sandboxes`);
        if (answer.hibernating.length > 0) println(`hibernating ${answer.hibernating.length} sandboxes`);
        for (const s of answer.skipped) println(`left as is: ${s.sandboxId} (${s.reason})`);
      }
      const node = o.wait ? await waitDrained(api, id, o.wait * 1000) : answer.node;
      if (json) printJson({ ...answer, node });
      else if (o.wait) println(`node ${id} holds no sandbox: it can go`);
    });
  nodes
    .command('undrain')
    .description('let a drained node take new sandboxes again')
    .argument('<id>', 'node id')
    .action(async (id: string, _o: unknown, cmd: Command) => {
      const { node } = await apiClient(cmd).json<{ node: NodeView }>(
        'DELETE',
        `/v1/nodes/${encodeURIComponent(id)}/drain`,
      );
      if (isJson(cmd)) printJson({ node });
      else println(`node ${id} takes new sandboxes again`);
    });
}

/** How often `drain --wait` reads the node, ms. */
const DRAIN_POLL_MS = 2_000;

/**
 * Waits until node `id` holds no sandbox (its reservation count, which a hibernation or an end
 * releases), printing the count on stderr when it changes. @throws CliError DRAIN_TIMEOUT after
 * `timeoutMs`, NODE_NOT_FOUND when the node's registration goes away meanwhile.
 */
async function waitDrained(api: ApiClient, id: string, timeoutMs: number): Promise<NodeView> {
  const until = Date.now() + timeoutMs;
  let last = -1;
  for (;;) {
    const { nodes } = await api.json<{ nodes: NodeView[] }>('GET', '/v1/nodes');
    const node = nodes.find((n) => n.id === id);
    if (!node) throw new CliError('NODE_NOT_FOUND', `node ${id} is no longer registered`);
    if (node.sandboxes === 0) return node;
    if (node.sandboxes !== last) note(`node ${id}: ${node.sandboxes} sandboxes left`);
    last = node.sandboxes;
    if (Date.now() >= until) {
      throw new CliError('DRAIN_TIMEOUT', `node ${id} still holds ${node.sandboxes} sandboxes`, {
        details: { nodeId: id, sandboxes: node.sandboxes },
        hint: 'it stays drained; wait again, end its sandboxes, or `space nodes undrain` it',
      });
    }
    await sleep(Math.min(DRAIN_POLL_MS, Math.max(0, until - Date.now())));
  }
}
