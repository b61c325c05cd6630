/** `space ops get`, `space nodes`, `space template ls` — read-only views of the control plane. */
import type { Command } from 'commander';
import type { NodeInfo } from '../core/types.ts';
import { type Operation, waitOperation } from './client.ts';
import { apiClient, isJson } from './context.ts';
import { formatRelative, parsePositiveInt, printJson, println, table } from './output.ts';

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

  program
    .command('nodes')
    .description('list the nodes (agents) of the platform')
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
}
