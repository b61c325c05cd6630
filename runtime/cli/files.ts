/**
 * `space files put|get|ls|rm|mkdir`: the sandbox filesystem over the data plane, with a session
 * token from `POST /v1/sandboxes/:id/tokens`. Uploads and downloads stream; nothing is held whole.
 */
import { randomBytes } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import { rename, stat, unlink } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import type { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { Command } from 'commander';
import { FILE_METADATA_HEADER, type FileStat, fileMetadataProblem } from '../core/guest-protocol.ts';
import { apiClient, dataPlane, isJson } from './context.ts';
import {
  CliError,
  collectKeyValue,
  formatBytes,
  formatMode,
  printJson,
  println,
  table,
  usageError,
} from './output.ts';

/** Table rows of `space files ls`. Pure. */
export function fileRows(entries: FileStat[]): string[][] {
  return entries.map((e) => [
    formatMode(e.type, e.mode),
    e.type === 'dir' ? '-' : formatBytes(e.size),
    new Date(e.mtimeMs).toISOString().replace('T', ' ').slice(0, 19),
    e.type === 'dir' ? `${e.name}/` : e.name,
  ]);
}

/** Where `get` writes: `-` is stdout; no local path means the remote name in the cwd. Pure. */
export function localTarget(remote: string, local: string | undefined): string {
  if (local) return local;
  const name = basename(remote.replace(/\/+$/, ''));
  if (!name || name === '/' || name === '.' || name === '..') {
    throw new CliError('USAGE', `cannot derive a local file name from "${remote}"; give one`, {
      exitCode: 2,
    });
  }
  return name;
}

export function registerFiles(program: Command): void {
  const files = program
    .command('files')
    .alias('fs')
    .description('read and write files in a sandbox')
    .addHelpText(
      'after',
      `
Examples:
  space files put sbx_123 ./data.csv /home/user/data.csv
  space files put sbx_123 ./data.csv /home/user/data.csv -m source=crm -m day=2026-12-01
  space files get sbx_123 /home/user/out.json            # writes ./out.json
  space files get sbx_123 /etc/os-release - | head
  space files ls sbx_123 /home/user
  space files mkdir sbx_123 /home/user/a/b -p
  space files rm sbx_123 /home/user/a -r`,
    );

  files
    .command('put')
    .description('upload a local file (- for stdin) to <remote>')
    .argument('<id>', 'sandbox id')
    .argument('<local>', 'local file, or - for stdin')
    .argument('<remote>', 'path in the sandbox')
    .option(
      '-m, --metadata <key=value>',
      'file metadata (repeatable; printable ASCII, ≤ 4096 bytes in all); shown by stat and ls --json',
      collectKeyValue('--metadata'),
    )
    .action(
      async (
        id: string,
        local: string,
        remote: string,
        o: { metadata?: Record<string, string> },
        cmd: Command,
      ) => {
        const api = apiClient(cmd);
        const headers: Record<string, string> = { 'content-type': 'application/octet-stream' };
        if (o.metadata) {
          const problem = fileMetadataProblem(o.metadata);
          if (problem) throw usageError(`--metadata: ${problem}`);
          headers[FILE_METADATA_HEADER] = JSON.stringify(o.metadata);
        }
        let body: Readable;
        if (local === '-') body = process.stdin as unknown as Readable;
        else {
          const st = await stat(local).catch((err: NodeJS.ErrnoException) => {
            throw new CliError(
              'LOCAL_FILE',
              `${local}: ${err.code === 'ENOENT' ? 'no such file' : err.message}`,
            );
          });
          if (!st.isFile()) throw new CliError('LOCAL_FILE', `${local} is not a regular file`);
          headers['content-length'] = String(st.size);
          body = createReadStream(local);
        }
        const dp = await dataPlane(api, id, ['files']);
        const res = await dp.json<Partial<FileStat> | undefined>('PUT', '/files', {
          query: { path: remote },
          body,
          headers,
        });
        if (isJson(cmd)) printJson(res ?? { path: remote });
        else
          println(
            `uploaded ${res?.size !== undefined ? formatBytes(res.size) : local} to ${res?.path ?? remote}`,
          );
      },
    );

  files
    .command('get')
    .description(
      'download <remote> to a local file (default: its name in the current directory; - for stdout)',
    )
    .argument('<id>', 'sandbox id')
    .argument('<remote>', 'path in the sandbox')
    .argument('[local]', 'local file, or - for stdout')
    .action(async (id: string, remote: string, localArg: string | undefined, _o: unknown, cmd: Command) => {
      const local = localTarget(remote, localArg);
      const dp = await dataPlane(apiClient(cmd), id, ['files']);
      const res = await dp.call('GET', '/files', { query: { path: remote } });
      if (local === '-') {
        await pipeline(res.body, process.stdout, { end: false });
        return;
      }
      // write next to the target, then rename: an interrupted download never leaves a partial file
      const tmp = join(dirname(local), `.${basename(local)}.space-${randomBytes(4).toString('hex')}`);
      let bytes = 0;
      res.body.on('data', (c: Buffer) => {
        bytes += c.length;
      });
      try {
        await pipeline(res.body, createWriteStream(tmp, { flags: 'wx' }));
        await rename(tmp, local);
      } catch (err) {
        await unlink(tmp).catch(() => {});
        throw err;
      }
      if (isJson(cmd)) printJson({ path: remote, local, size: bytes });
      else println(`downloaded ${formatBytes(bytes)} to ${local}`);
    });

  files
    .command('ls')
    .description('list a directory (default: the user’s home)')
    .argument('<id>', 'sandbox id')
    .argument('[path]', 'directory', '/home/user')
    .action(async (id: string, path: string, _o: unknown, cmd: Command) => {
      const dp = await dataPlane(apiClient(cmd), id, ['files']);
      const res = await dp.json<{ entries: FileStat[] }>('GET', '/fs/list', { query: { path } });
      if (isJson(cmd)) return printJson(res);
      if (res.entries.length === 0) return;
      println(table(['MODE', 'SIZE', 'MODIFIED (UTC)', 'NAME'], fileRows(res.entries)));
    });

  files
    .command('stat')
    .description('show one path')
    .argument('<id>', 'sandbox id')
    .argument('<path>', 'path in the sandbox')
    .action(async (id: string, path: string, _o: unknown, cmd: Command) => {
      const dp = await dataPlane(apiClient(cmd), id, ['files']);
      const st = await dp.json<FileStat>('GET', '/fs/stat', { query: { path } });
      if (isJson(cmd)) return printJson(st);
      println(table(['MODE', 'SIZE', 'MODIFIED (UTC)', 'NAME'], fileRows([{ ...st, name: st.path }])));
      for (const [k, v] of Object.entries(st.metadata ?? {})) println(`metadata ${k}=${v}`);
    });

  files
    .command('rm')
    .description('remove a file, or a directory with -r')
    .argument('<id>', 'sandbox id')
    .argument('<path>', 'path in the sandbox')
    .option('-r, --recursive', 'remove a directory and everything in it')
    .action(async (id: string, path: string, o: { recursive?: boolean }, cmd: Command) => {
      const dp = await dataPlane(apiClient(cmd), id, ['files']);
      await dp.call('DELETE', '/fs', { query: { path, recursive: o.recursive ? true : undefined } });
      if (isJson(cmd)) printJson({ path, removed: true });
      else println(`removed ${path}`);
    });

  files
    .command('mkdir')
    .description('create a directory')
    .argument('<id>', 'sandbox id')
    .argument('<path>', 'path in the sandbox')
    .option('-p, --parents', 'create missing parents; no error if it exists')
    .action(async (id: string, path: string, o: { parents?: boolean }, cmd: Command) => {
      const dp = await dataPlane(apiClient(cmd), id, ['files']);
      const res = await dp.json<unknown>('POST', '/fs/mkdir', {
        body: { path, parents: o.parents === true },
      });
      if (isJson(cmd)) printJson(res ?? { path });
      else println(`created ${path}`);
    });
}
