/**
 * The official `e2b` SDK (pinned 2.51.0), unchanged, against a real local stack (API, agent,
 * gVisor sandboxes, Redis) and a router process: the SDK is pointed at SPACE only through
 * E2B_API_URL (the API), E2B_SANDBOX_URL (the router) and E2B_API_KEY (a SPACE API key).
 * The oldest SDK SPACE claims (2.14.1, devDependency `e2b-oldest`) runs the core subset
 * (create, commands.run, files write/read, kill); everything else runs on the newest.
 */

import { execFile } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import * as e2b from 'e2b';
import {
  ALL_TRAFFIC,
  CommandExitError,
  FileNotFoundError,
  type FilesystemEvent,
  FilesystemEventType,
  Sandbox,
  SandboxNotFoundError,
} from 'e2b';
import * as e2bOldest from 'e2b-oldest';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { freePort } from './redis-server.ts';
import { type RouterProcess, startRouterProcess } from './router-process.ts';
import { leftovers, NO_LEFTOVERS, type Stack, startStack } from './stack.ts';

let s: Stack;
let router: RouterProcess;
/** A second router replica on the same Redis: nothing about a sandbox may live in one router. */
let router2: RouterProcess;
const saved = { ...process.env };

beforeAll(async () => {
  const port = await freePort();
  s = await startStack({ SPACE_ROUTER_URL: `http://127.0.0.1:${port}` });
  const routerEnv = {
    SPACE_REDIS_URL: s.redisUrl,
    SPACE_VERIFY_KEY_FILE: join(s.dir, 'key.pub.pem'),
  };
  router = await startRouterProcess({ ...routerEnv, SPACE_ROUTER_PORT: String(port) });
  router2 = await startRouterProcess({ ...routerEnv, SPACE_ROUTER_PORT: String(await freePort()) });
  // the whole migration: three variables
  process.env.E2B_API_URL = s.apiUrl;
  process.env.E2B_SANDBOX_URL = router.url;
  process.env.E2B_API_KEY = s.apiKey;
});
afterAll(async () => {
  process.env = saved;
  await router?.stop();
  await router2?.stop();
  if (!s) return;
  await s.stop();
  expect(await leftovers(s)).toEqual(NO_LEFTOVERS);
});

describe('e2b SDK: control plane', () => {
  it('creates, lists, gets, sets the timeout of and kills a sandbox', async () => {
    const sbx = await Sandbox.create('base', { metadata: { suite: 'e2b-int' } });
    expect(sbx.sandboxId).toMatch(/^[a-z0-9]+$/);
    const info = await sbx.getInfo();
    expect(info.sandboxId).toBe(sbx.sandboxId);
    expect(info.templateId).toBe('base');
    expect(info.state).toBe('running');
    expect(info.metadata).toEqual({ suite: 'e2b-int' });

    const listed = await Sandbox.list({ query: { metadata: { suite: 'e2b-int' } } }).nextItems();
    expect(listed.map((x) => x.sandboxId)).toContain(sbx.sandboxId);
    const none = await Sandbox.list({ query: { metadata: { suite: 'other' } } }).nextItems();
    expect(none.map((x) => x.sandboxId)).not.toContain(sbx.sandboxId);

    await sbx.setTimeout(600_000);
    const later = await sbx.getInfo();
    expect(later.endAt.getTime() - Date.now()).toBeGreaterThan(500_000);

    expect(await Sandbox.kill(sbx.sandboxId)).toBe(true);
    // a killed sandbox is gone in E2B's terms: kill again answers false, running lists lack it
    expect(await Sandbox.kill(sbx.sandboxId)).toBe(false);
    const after = await Sandbox.list({ query: { state: ['running'] } }).nextItems();
    expect(after.map((x) => x.sandboxId)).not.toContain(sbx.sandboxId);
  });

  it('refuses an unknown template and a wrong API key in the SDK’s terms', async () => {
    await expect(Sandbox.create('no-such-template')).rejects.toThrow(/template .*not found/);
    await expect(Sandbox.create('base', { apiKey: 'e2b_0000' })).rejects.toThrow(/API key/i);
  });
});

/**
 * The SDK versions SPACE claims, newest and oldest (2.14.0 sends no E2b-Sandbox-Id on `/files`,
 * so it cannot reach a sandbox through E2B_SANDBOX_URL). The oldest is typed as the newest: the
 * core calls used here have the same shape in both.
 */
const SDKS = [
  ['2.51.0 (newest)', e2b],
  ['2.14.1 (oldest)', e2bOldest as unknown as typeof e2b],
] as const;

describe.each(SDKS)('e2b SDK %s: envd data plane through the router', (_, sdk) => {
  it('creates, runs commands (stdout, exit codes), writes/reads/lists files, kills a background command and the sandbox', async () => {
    const sbx = await sdk.Sandbox.create();
    try {
      expect(await sbx.isRunning()).toBe(true);
      const r = await sbx.commands.run('echo hi');
      expect(r.stdout).toBe('hi\n');
      expect(r.exitCode).toBe(0);
      const err = await sbx.commands.run('echo oops >&2; exit 3').catch((e: unknown) => e);
      expect(err).toBeInstanceOf(sdk.CommandExitError);
      expect((err as CommandExitError).exitCode).toBe(3);
      expect((err as CommandExitError).stderr).toBe('oops\n');

      await sbx.files.write('/home/user/hello.txt', 'hello from e2b');
      expect(await sbx.files.read('/home/user/hello.txt')).toBe('hello from e2b');
      const names = (await sbx.files.list('/home/user')).map((e) => e.name);
      expect(names).toContain('hello.txt');
      expect((await sbx.commands.run('cat /home/user/hello.txt')).stdout).toBe('hello from e2b');

      const bg = await sbx.commands.run('sleep 600', { background: true });
      expect(bg.pid).toBeGreaterThan(0);
      expect(await sbx.commands.kill(bg.pid)).toBe(true);
      await expect(bg.wait()).rejects.toBeInstanceOf(sdk.CommandExitError);
    } finally {
      await sbx.kill();
    }
    expect(await sbx.isRunning()).toBe(false);
    expect(await sdk.Sandbox.kill(sbx.sandboxId)).toBe(false);
  });
});

describe('e2b SDK: commands across router replicas', () => {
  it('lists, reattaches to, feeds, closes and kills commands through a second router', async () => {
    const sbx = await Sandbox.create();
    try {
      // started through router 1 (E2B_SANDBOX_URL) …
      const cat = await sbx.commands.run('cat', { background: true, stdin: true });
      // … and driven through router 2, which never saw the start
      const viaB = await Sandbox.connect(sbx.sandboxId, { sandboxUrl: router2.url });
      const listed = await viaB.commands.list();
      expect(listed.find((p) => p.pid === cat.pid)).toMatchObject({
        cmd: '/bin/bash',
        args: ['-l', '-c', 'cat'],
      });
      const seen: string[] = [];
      const again = await viaB.commands.connect(cat.pid, { onStdout: (d) => void seen.push(d) });
      await viaB.commands.sendStdin(cat.pid, 'ping\n');
      await vi.waitFor(() => expect(seen.join('')).toBe('ping\n'), { timeout: 10_000 });
      await viaB.commands.closeStdin(cat.pid);
      // EOF ends cat: both handles see the same output and exit
      expect(await again.wait()).toMatchObject({ exitCode: 0, stdout: 'ping\n' });
      expect(await cat.wait()).toMatchObject({ exitCode: 0, stdout: 'ping\n' });
      expect((await viaB.commands.list()).map((p) => p.pid)).not.toContain(cat.pid);

      const sleeper = await sbx.commands.run('sleep 600', { background: true });
      expect((await viaB.commands.list()).map((p) => p.pid)).toContain(sleeper.pid);
      expect(await viaB.commands.kill(sleeper.pid)).toBe(true);
      await expect(sleeper.wait()).rejects.toBeInstanceOf(CommandExitError);
      // gone: kill answers false (NotFound), as with E2B
      expect(await viaB.commands.kill(sleeper.pid)).toBe(false);
    } finally {
      await sbx.kill();
    }
  });
});

describe('e2b SDK: files', () => {
  it('makes dirs, stats, renames, removes and checks existence in the SDK’s terms', async () => {
    const sbx = await Sandbox.create();
    try {
      // true when made, false when already there
      expect(await sbx.files.makeDir('/home/user/d1/d2')).toBe(true);
      expect(await sbx.files.makeDir('/home/user/d1/d2')).toBe(false);
      await sbx.files.write('d1/a.txt', 'abc'); // relative: under the user's home
      expect(await sbx.files.getInfo('/home/user/d1/a.txt')).toMatchObject({
        name: 'a.txt',
        type: 'file',
        path: '/home/user/d1/a.txt',
        size: 3,
        mode: 0o644,
        permissions: '-rw-r--r--',
        owner: 'user',
      });
      expect(await sbx.files.getInfo('/home/user/d1')).toMatchObject({ type: 'dir', mode: 0o755 });

      // rename makes the destination's parents, as envd does
      const moved = await sbx.files.rename('/home/user/d1/a.txt', '/home/user/d3/b.txt');
      expect(moved).toMatchObject({ name: 'b.txt', path: '/home/user/d3/b.txt', type: 'file' });
      expect(await sbx.files.exists('/home/user/d1/a.txt')).toBe(false);
      expect(await sbx.files.exists('/home/user/d3/b.txt')).toBe(true);
      expect(await sbx.files.read('/home/user/d3/b.txt')).toBe('abc');
      await expect(sbx.files.rename('/home/user/nope', '/home/user/x')).rejects.toBeInstanceOf(
        FileNotFoundError,
      );
      await expect(sbx.files.getInfo('/home/user/nope')).rejects.toBeInstanceOf(FileNotFoundError);

      // list depth: 1 is the directory itself; deeper walks real directories, each entry
      // followed by what is under it (envd's WalkDir order)
      await sbx.commands.run(
        'mkdir -p d1/d2/d4 && echo x > d1/d2/d4/deep.txt && ln -s /home/user/d1 d1link',
        {
          cwd: '/home/user',
        },
      );
      const paths = async (depth: number) =>
        (await sbx.files.list('/home/user', { depth })).map((e) => e.path).filter((p) => /\/d[0-9l]/.test(p));
      expect(await paths(1)).toEqual(['/home/user/d1', '/home/user/d1link', '/home/user/d3']);
      expect(await paths(2)).toEqual([
        '/home/user/d1',
        '/home/user/d1/d2',
        '/home/user/d1link',
        '/home/user/d3',
        '/home/user/d3/b.txt',
      ]);
      const deep = await sbx.files.list('/home/user', { depth: 4 });
      expect(deep.find((e) => e.path === '/home/user/d1/d2/d4/deep.txt')).toMatchObject({
        name: 'deep.txt',
        type: 'file',
        size: 2,
      });
      // the symlink is listed, not walked
      expect(deep.filter((e) => e.path.startsWith('/home/user/d1link/'))).toEqual([]);

      // remove is recursive, and removing what is not there is no error (envd)
      await sbx.files.remove('/home/user/d1');
      expect(await sbx.files.exists('/home/user/d1')).toBe(false);
      await sbx.files.remove('/home/user/d1');
    } finally {
      await sbx.kill();
    }
  });

  it('r10: reports a symlink as envd does (getInfo, list) and a download of it sends the target', async () => {
    const sbx = await Sandbox.create();
    try {
      await sbx.commands.run(
        'head -c 1000000 /dev/urandom > big.bin && chmod 600 big.bin && ln -s big.bin big.lnk && mkdir d && ln -s d dl && ln -s nowhere dead',
        { cwd: '/home/user' },
      );
      // envd: the link's own lstat (size = length of "big.bin", Go text Lrwxrwxrwx) typed as its target
      expect(await sbx.files.getInfo('/home/user/big.lnk')).toMatchObject({
        name: 'big.lnk',
        path: '/home/user/big.lnk',
        type: 'file',
        size: 7,
        mode: 0o600,
        permissions: 'Lrwxrwxrwx',
        symlinkTarget: '/home/user/big.bin',
      });
      expect(await sbx.files.getInfo('dl')).toMatchObject({ type: 'dir', symlinkTarget: '/home/user/d' });
      const dead = await sbx.files.getInfo('dead');
      expect([dead.type, dead.size, dead.symlinkTarget]).toEqual([undefined, 7, '/home/user/dead']);
      // a listing types links the same way
      const listed = Object.fromEntries((await sbx.files.list('/home/user')).map((e) => [e.name, e]));
      expect(listed['big.lnk']).toMatchObject({ type: 'file', size: 7, symlinkTarget: '/home/user/big.bin' });
      expect(listed.dl).toMatchObject({ type: 'dir', symlinkTarget: '/home/user/d' });
      // what a download of the link sends: the whole target, byte for byte
      const sum = (await sbx.commands.run('sha256sum big.bin', { cwd: '/home/user' })).stdout.split(' ')[0];
      const got = await sbx.files.read('/home/user/big.lnk', { format: 'bytes' });
      expect(got.length).toBe(1_000_000);
      expect(createHash('sha256').update(got).digest('hex')).toBe(sum);
    } finally {
      await sbx.kill();
    }
  });

  it('watches a directory: create, write and remove events, recursively (inotify under gVisor)', async () => {
    const sbx = await Sandbox.create();
    try {
      await sbx.files.makeDir('/home/user/w');
      const events: FilesystemEvent[] = [];
      const handle = await sbx.files.watchDir('/home/user/w', (e) => void events.push(e), {
        recursive: true,
      });
      await sbx.files.write('/home/user/w/new.txt', 'one');
      await sbx.commands.run('mkdir -p /home/user/w/sub && echo x > /home/user/w/sub/deep.txt');
      await sbx.files.write('/home/user/w/new.txt', 'overwritten');
      await sbx.files.remove('/home/user/w/new.txt');
      const seen = (name: string, type: FilesystemEventType) =>
        events.some((e) => e.name === name && e.type === type);
      await vi.waitFor(
        () => {
          expect(seen('new.txt', FilesystemEventType.CREATE)).toBe(true);
          expect(events.filter((e) => e.name === 'new.txt' && e.type === 'write').length).toBeGreaterThan(1);
          expect(seen('new.txt', FilesystemEventType.REMOVE)).toBe(true);
          expect(seen('sub', FilesystemEventType.CREATE)).toBe(true);
          expect(seen('sub/deep.txt', FilesystemEventType.CREATE)).toBe(true);
          expect(seen('sub/deep.txt', FilesystemEventType.WRITE)).toBe(true);
        },
        { timeout: 10_000 },
      );
      // the upload's temp file is never reported
      expect(events.filter((e) => e.name.includes('.space-upload-'))).toEqual([]);
      await handle.stop();
      // a watch open while the sandbox is killed does not hold the kill up
      await sbx.files.watchDir('/home/user/w', () => {});
      const t0 = Date.now();
      await sbx.kill();
      expect(Date.now() - t0).toBeLessThan(15_000);
    } finally {
      await sbx.kill();
    }
  });

  it('counts open watchDir streams against the team’s stream quota, like command streams', async () => {
    const made = await s.call('POST', '/v1/teams', { id: 'e2bwatch', quotas: { streams: 2 } });
    expect(made.status).toBe(201);
    const key = await s.call<{ secret: string }>('POST', '/v1/keys', {
      name: 'e2b-watch',
      team: 'e2bwatch',
      scopes: ['sandboxes:read', 'sandboxes:write'],
    });
    expect(key.status).toBe(201);
    const sbx = await Sandbox.create({ apiKey: key.body.secret });
    try {
      const w1 = await sbx.files.watchDir('/home/user', () => {});
      const w2 = await sbx.files.watchDir('/tmp', () => {});
      // the quota is full: a third watch and a command's output stream are refused
      await expect(sbx.files.watchDir('/home/user', () => {})).rejects.toThrow(
        /team e2bwatch has 2 of its 2 streams open/,
      );
      await expect(sbx.commands.run('true')).rejects.toThrow(/2 of its 2 streams open/);
      // a stopped watch gives its stream back
      await w1.stop();
      await vi.waitFor(async () => expect((await sbx.commands.run('echo ok')).stdout).toBe('ok\n'), {
        timeout: 10_000,
        interval: 500,
      });
      await w2.stop();
    } finally {
      await sbx.kill();
    }
  });

  it('envd 0.6.2–0.6.4: file metadata (X-Metadata-*), watch entries and allowNetworkMounts', async () => {
    const sbx = await Sandbox.create();
    try {
      // the version that opens every gate the SDK has
      expect((await sbx.getInfo()).envdVersion).toBe('0.6.4');
      const one = await sbx.files.write('/home/user/m/one.txt', 'one', {
        metadata: { Author: 'ann', purpose: 'a test run' },
      });
      // envd lowercases the keys; the answer is name, type, path and metadata, nothing else
      expect(one).toEqual({
        name: 'one.txt',
        type: 'file',
        path: '/home/user/m/one.txt',
        metadata: { author: 'ann', purpose: 'a test run' },
      });
      const batch = await sbx.files.write(
        [
          { path: '/home/user/m/a.txt', data: 'a' },
          { path: '/home/user/m/b.txt', data: new ReadableStream({ start: (c) => c.close() }) },
        ],
        { metadata: { batch: '7' } },
      );
      expect(batch.map((f) => f.metadata)).toEqual([{ batch: '7' }, { batch: '7' }]);
      expect((await sbx.files.getInfo('/home/user/m/one.txt')).metadata).toEqual({
        author: 'ann',
        purpose: 'a test run',
      });
      const listed = await sbx.files.list('/home/user/m');
      expect(listed.map((e) => [e.name, e.metadata])).toEqual([
        ['a.txt', { batch: '7' }],
        ['b.txt', { batch: '7' }],
        ['one.txt', { author: 'ann', purpose: 'a test run' }],
      ]);
      // it follows the file through the SDK's rename; a command's `mv` leaves it behind (SPACE
      // keeps it by path in the guest daemon, not as an xattr: docs/e2b.md)
      await sbx.files.rename('/home/user/m/one.txt', '/home/user/m/two.txt');
      expect((await sbx.files.getInfo('/home/user/m/two.txt')).metadata).toEqual({
        author: 'ann',
        purpose: 'a test run',
      });
      await sbx.commands.run('mv /home/user/m/two.txt /home/user/m/three.txt');
      expect((await sbx.files.getInfo('/home/user/m/three.txt')).metadata).toBeUndefined();
      // an upload without metadata leaves the file with none (envd clears the old xattrs)
      expect((await sbx.files.write('/home/user/m/a.txt', 'again')).metadata).toBeUndefined();
      expect((await sbx.files.getInfo('/home/user/m/a.txt')).metadata).toBeUndefined();
      // a key over envd's 246 bytes: 400 → InvalidArgumentError, and the file is left as it was
      await expect(
        sbx.files.write('/home/user/m/a.txt', 'changed', { metadata: { ['k'.repeat(247)]: 'v' } }),
      ).rejects.toThrow(e2b.InvalidArgumentError);
      expect(await sbx.files.read('/home/user/m/a.txt')).toBe('again');
      // a repeated header counts once, with its first value (raw request on a signed URL)
      const url = await sbx.uploadUrl('/home/user/m/raw.txt');
      const raw = await request(url, {
        method: 'POST',
        headers: [
          ['content-type', 'application/octet-stream'],
          ['e2b-sandbox-id', sbx.sandboxId],
          ['x-metadata-k', 'first'],
          ['x-metadata-k', 'second'],
          // SPACE's own header from a client is not passed on: only X-Metadata-* count
          ['x-space-file-metadata', '{"injected":"1"}'],
        ].flat(),
        body: 'raw',
      });
      expect(raw.statusCode).toBe(200);
      expect(await raw.body.json()).toEqual([
        { name: 'raw.txt', type: 'file', path: '/home/user/m/raw.txt', metadata: { k: 'first' } },
      ]);
      // watch events carry the entry (metadata included) when asked; network mounts may be allowed
      const events: FilesystemEvent[] = [];
      const handle = await sbx.files.watchDir('/home/user/m', (e) => void events.push(e), {
        includeEntry: true,
        allowNetworkMounts: true,
      });
      await sbx.files.write('/home/user/m/w.txt', 'abc', { metadata: { w: '1' } });
      await vi.waitFor(() => expect(events.some((e) => e.name === 'w.txt' && e.entry)).toBe(true), {
        timeout: 10_000,
      });
      await handle.stop();
      expect(events.find((e) => e.name === 'w.txt' && e.entry)?.entry).toMatchObject({
        name: 'w.txt',
        path: '/home/user/m/w.txt',
        type: 'file',
        size: 3,
        metadata: { w: '1' },
      });
    } finally {
      await sbx.kill();
    }
  });

  it('moves 20 MiB of random bytes both ways, multipart and octet-stream (gzip), byte for byte', async () => {
    const sbx = await Sandbox.create();
    try {
      const bytes = randomBytes(20 * 1024 * 1024);
      const sha = createHash('sha256').update(bytes).digest('hex');
      const ab = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length);
      await sbx.files.write('/home/user/big.bin', ab); // multipart
      await sbx.files.write('/home/user/big.gz.bin', ab, { gzip: true }); // octet-stream + gzip
      await sbx.files.write('/home/user/big.raw.bin', new Blob([bytes]).stream(), { useOctetStream: true });
      const sums = await sbx.commands.run('sha256sum big.bin big.gz.bin big.raw.bin', { cwd: '/home/user' });
      expect(
        sums.stdout
          .split('\n')
          .filter(Boolean)
          .map((l) => l.split(/\s+/)[0]),
      ).toEqual([sha, sha, sha]);
      const back = await sbx.files.read('/home/user/big.gz.bin', { format: 'bytes' });
      expect(back.length).toBe(bytes.length);
      expect(createHash('sha256').update(back).digest('hex')).toBe(sha);
    } finally {
      await sbx.kill();
    }
  });
});

describe('e2b SDK: signed /files URLs', () => {
  it('uploadUrl/downloadUrl work without a token; tampered, moved, expired and killed ones are refused', async () => {
    const sbx = await Sandbox.create();
    const bytes = randomBytes(100_000);
    const envdUrl = new URL(router.url);
    try {
      // upload: a plain multipart POST that carries no token, only the URL's signature; the
      // sandbox is named the way a client behind E2B_SANDBOX_URL does (header)
      const up = new URL(await sbx.uploadUrl('/home/user/signed.bin'));
      expect(up.searchParams.get('signature')).toMatch(/^v1_[A-Za-z0-9+/]+$/);
      const form = new FormData();
      form.append('file', new Blob([bytes]), '/home/user/signed.bin');
      const posted = await fetch(up, {
        method: 'POST',
        body: form,
        headers: { 'e2b-sandbox-id': sbx.sandboxId },
      });
      expect(posted.status).toBe(200);
      expect(await posted.json()).toEqual([
        { name: 'signed.bin', type: 'file', path: '/home/user/signed.bin' },
      ]);
      const back = await sbx.files.read('/home/user/signed.bin', { format: 'bytes' });
      expect(Buffer.from(back).equals(bytes)).toBe(true);

      // download by host routing (49983-<id>.<domain>), from a handle made by connect: one
      // token per sandbox, so what create signed and what connect signs agree
      const again = await Sandbox.connect(sbx.sandboxId);
      const down = new URL(await again.downloadUrl('/home/user/signed.bin'));
      const byHost = async (url: URL) => {
        const res = await request(`${envdUrl.origin}${url.pathname}${url.search}`, {
          headers: { host: `49983-${sbx.sandboxId}.space.test` },
        });
        return { status: res.statusCode, body: Buffer.from(await res.body.arrayBuffer()) };
      };
      const got = await byHost(down);
      expect(got.status).toBe(200);
      expect(got.body.equals(bytes)).toBe(true);
      // an expiring URL within its time works
      expect(
        (
          await byHost(
            new URL(await sbx.downloadUrl('/home/user/signed.bin', { useSignatureExpiration: 60 })),
          )
        ).status,
      ).toBe(200);

      const refused = async (url: URL, message: string) => {
        const r = await byHost(url);
        expect([r.status, JSON.parse(r.body.toString())]).toEqual([401, { code: 401, message }]);
      };
      // tampered signature
      const tampered = new URL(down);
      const sig = tampered.searchParams.get('signature') ?? '';
      tampered.searchParams.set('signature', `${sig.slice(0, -2)}${sig.endsWith('AA') ? 'BB' : 'AA'}`);
      await refused(tampered, 'invalid signature');
      // the signature of one path does not open another, nor an upload
      const moved = new URL(down);
      moved.searchParams.set('path', '/home/user/.bashrc');
      await refused(moved, 'invalid signature');
      const asUpload = await fetch(down, {
        method: 'POST',
        body: form,
        headers: { 'e2b-sandbox-id': sbx.sandboxId },
      });
      expect(asUpload.status).toBe(401);
      // expired (signed 10 s in the past), and an expiration moved on after signing
      const expired = new URL(
        await sbx.downloadUrl('/home/user/signed.bin', { useSignatureExpiration: -10 }),
      );
      await refused(expired, 'signature is already expired');
      const extended = new URL(expired);
      extended.searchParams.set('signature_expiration', String(Math.floor(Date.now() / 1000) + 3600));
      await refused(extended, 'invalid signature');
      // neither token nor signature
      const bare = new URL(down);
      bare.searchParams.delete('signature');
      await refused(
        bare,
        'unauthorized access, please provide a valid access token or method signing if supported',
      );
    } finally {
      await sbx.kill();
    }
    // a killed sandbox's URLs open nothing: its token is gone with it
    const after = await request(`${envdUrl.origin}/files?path=%2Fhome%2Fuser%2Fsigned.bin`, {
      headers: { host: `49983-${sbx.sandboxId}.space.test` },
    });
    await after.body.dump();
    expect(after.statusCode).toBeGreaterThanOrEqual(400);
    const late = new URL(await sbx.downloadUrl('/home/user/signed.bin'));
    const lateRes = await request(`${envdUrl.origin}${late.pathname}${late.search}`, {
      headers: { host: `49983-${sbx.sandboxId}.space.test` },
    });
    expect([lateRes.statusCode, await lateRes.body.json()]).toEqual([
      401,
      { code: 401, message: 'invalid signature' },
    ]);
  });
});

describe('e2b SDK: pause, resume, connect', () => {
  it('pauses (false when already paused), lists it paused, resumes on connect and on traffic', async () => {
    const sbx = await Sandbox.create({ metadata: { suite: 'e2b-pause' } });
    try {
      await sbx.files.write('/home/user/keep.txt', 'kept');
      const bg = await sbx.commands.run('sleep 600', { background: true });
      expect(await sbx.pause()).toBe(true);
      expect(await Sandbox.pause(sbx.sandboxId)).toBe(false);
      expect((await sbx.getInfo()).state).toBe('paused');
      const listed = await Sandbox.list({ query: { metadata: { suite: 'e2b-pause' } } }).nextItems();
      expect(listed.map((x) => [x.sandboxId, x.state])).toEqual([[sbx.sandboxId, 'paused']]);

      // connect resumes it, synchronously: running when it answers, memory and files kept
      const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 120_000 });
      expect((await again.getInfo()).state).toBe('running');
      expect(await again.files.read('/home/user/keep.txt')).toBe('kept');
      expect((await again.commands.list()).map((p) => p.pid)).toContain(bg.pid);
      // connecting to a running sandbox only extends its lifetime
      const info = await again.getInfo();
      await Sandbox.connect(sbx.sandboxId, { timeoutMs: 1_000 });
      expect((await again.getInfo()).endAt.getTime()).toBe(info.endAt.getTime());

      // paused again, the next envd call through the router resumes it
      expect(await again.pause()).toBe(true);
      expect((await again.commands.run('cat /home/user/keep.txt')).stdout).toBe('kept');
      expect((await again.getInfo()).state).toBe('running');

      await expect(Sandbox.connect('sbxnosuchsandbox0000000')).rejects.toBeInstanceOf(SandboxNotFoundError);
    } finally {
      await sbx.kill();
    }
  });
});

describe('e2b SDK: PTY', () => {
  it('creates a terminal of the asked size, types into it, resizes it, sees its exit and kills one', async () => {
    const sbx = await Sandbox.create();
    try {
      let out = '';
      const dec = new TextDecoder();
      const enc = (text: string) => new TextEncoder().encode(text);
      const term = await sbx.pty.create({
        cols: 80,
        rows: 24,
        onData: (d) => {
          out += dec.decode(d, { stream: true });
        },
      });
      await sbx.pty.sendInput(term.pid, enc('stty size; tty; echo TERM=$TERM\n'));
      await vi.waitFor(() => expect(out).toContain('TERM=xterm-256color'), { timeout: 10_000 });
      expect(out).toContain('24 80');
      expect(out).toMatch(/\/dev\/pts\/\d+/);
      // a resize reaches the terminal (TIOCSWINSZ; the shell sees the new size)
      await sbx.pty.resize(term.pid, { cols: 100, rows: 30 });
      await sbx.pty.sendInput(term.pid, enc('stty size\n'));
      await vi.waitFor(() => expect(out).toContain('30 100'), { timeout: 10_000 });
      expect((await sbx.commands.list()).map((p) => p.pid)).toContain(term.pid);
      await sbx.pty.sendInput(term.pid, enc('exit 0\n'));
      expect(await term.wait()).toMatchObject({ exitCode: 0 });

      const other = await sbx.pty.create({ cols: 40, rows: 10, onData: () => {} });
      expect(await sbx.pty.kill(other.pid)).toBe(true);
      await expect(other.wait()).rejects.toBeInstanceOf(CommandExitError);
    } finally {
      await sbx.kill();
    }
  });
});

describe('e2b SDK: egress', () => {
  /** The sandbox's SPACE egress policy, read from SPACE's own API. */
  const policyOf = async (id: string) => {
    const r = await fetch(`${s.apiUrl}/v1/sandboxes/${id}`, {
      headers: { authorization: `Bearer ${s.apiKey}` },
    });
    return ((await r.json()) as { egress: { mode: string; allow: string[]; deny: string[] } }).egress;
  };

  it('maps allowInternetAccess and network allow/deny lists onto SPACE egress policies', async () => {
    const open = await Sandbox.create();
    const closed = await Sandbox.create({ allowInternetAccess: false });
    const listed = await Sandbox.create({
      network: { denyOut: [ALL_TRAFFIC], allowOut: ['pypi.org', '*.pythonhosted.org'] },
    });
    try {
      // E2B's default is internet on
      expect(await policyOf(open.sandboxId)).toMatchObject({ mode: 'allow-all', deny: [] });
      expect(await policyOf(closed.sandboxId)).toMatchObject({ mode: 'deny-all' });
      expect(await policyOf(listed.sandboxId)).toMatchObject({
        mode: 'allow-list',
        allow: ['pypi.org', '*.pythonhosted.org'],
      });
      expect((await closed.getInfo()).allowInternetAccess).toBe(false);
      expect((await open.getInfo()).allowInternetAccess).toBe(true);
      // enforced by the gateway: a denied name does not even resolve
      const denied = await closed.commands
        .run('curl -sS -m 5 http://example.com', { timeoutMs: 20_000 })
        .catch((e) => e);
      expect(denied).toBeInstanceOf(CommandExitError);

      // updateNetwork replaces the whole configuration
      await closed.updateNetwork({ allowInternetAccess: true, denyOut: ['example.com'] });
      expect(await policyOf(closed.sandboxId)).toMatchObject({ mode: 'allow-all', deny: ['example.com'] });

      // what SPACE cannot enforce is refused, not half-applied
      await expect(Sandbox.create({ network: { allowOut: ['1.1.1.1'] } })).rejects.toThrow(
        /not supported.*1\.1\.1\.1/,
      );
    } finally {
      await Promise.all([open.kill(), closed.kill(), listed.kill()]);
    }
  });
});

/**
 * The runtime cases (R1–R18) through the SDK. The same cases run against SPACE's own API in
 * runtime-cases.int.test.ts (r1–r13), packages.int.test.ts (r14 installs), bad-input (r18) and
 * the guest's unit tests (r15); here each is driven the way an E2B user would. Not here: r16/r17
 * (the `space` CLI's own exit codes and --json, no SDK path), r5's 256 MiB upload and r8's 100-way
 * burst (sizes kept to what a shared 2-core CI machine runs; the API tests run the full sizes).
 */
describe('e2b SDK: runtime cases', () => {
  let sbx: Sandbox;
  beforeAll(async () => {
    sbx = await Sandbox.create({ timeoutMs: 600_000 });
  });
  afterAll(async () => {
    await sbx?.kill();
  });
  /** Lines of `ps` naming the r7/r11 sleepers still alive (as root: sees every process). */
  const sleepers = async () =>
    (
      await sbx.commands.run('ps -eo args | grep -E "^(sleep|python3 -c) .*101[1-4]" || true', {
        user: 'root',
      })
    ).stdout;

  it('r1-two-readers-one-drops: the reader that stays gets every line after the other disconnects', async () => {
    const h = await sbx.commands.run('seq 1 1000000', { background: true });
    let seen = 0;
    const second = await sbx.commands.connect(h.pid, {
      onStdout: (d) => {
        seen += d.length;
        if (seen > 1_000_000) void second.disconnect();
      },
    });
    const r = await h.wait();
    expect(r.exitCode).toBe(0);
    const lines = r.stdout.split('\n');
    expect(lines.length).toBe(1_000_001);
    expect([lines[0], lines[999_999], lines[1_000_000]]).toEqual(['1', '1000000', '']);
    expect(seen).toBeGreaterThan(1_000_000);
  }, 120_000);

  it('r2-cannot-start: a missing binary is 127, true is 0, a directory is 126, each at once', async () => {
    const t0 = Date.now();
    const missing = await sbx.commands.run('no-such-binary').catch((e: unknown) => e);
    expect(missing).toBeInstanceOf(CommandExitError);
    expect((missing as CommandExitError).exitCode).toBe(127);
    expect((missing as CommandExitError).stderr).toMatch(/no-such-binary: command not found/);
    expect((await sbx.commands.run('true')).exitCode).toBe(0);
    const dir = await sbx.commands.run('/tmp').catch((e: unknown) => e);
    expect((dir as CommandExitError).exitCode).toBe(126);
    expect((dir as CommandExitError).stderr).toMatch(/Is a directory/);
    expect(Date.now() - t0).toBeLessThan(10_000);
  });

  it('r3-big-burst: 4 MiB in one write to stdout, then stderr, then interleaved, byte-exact', async () => {
    const py = [
      'import base64, hashlib, os, sys',
      'd = base64.b64encode(os.urandom(3145728))',
      'assert len(d) == 4194304',
      'open("/tmp/r3.sha", "w").write(hashlib.sha256(d + d).hexdigest())',
      'sys.stdout.buffer.write(d); sys.stdout.flush()',
      'sys.stderr.buffer.write(d); sys.stderr.flush()',
      'for i in range(0, len(d), 65536):',
      '    sys.stdout.buffer.write(d[i:i + 65536]); sys.stdout.flush()',
      '    sys.stderr.buffer.write(d[i:i + 65536]); sys.stderr.flush()',
    ].join('\n');
    await sbx.files.write('/tmp/r3.py', py);
    const r = await sbx.commands.run('python3 /tmp/r3.py', { timeoutMs: 120_000 });
    const want = await sbx.files.read('/tmp/r3.sha');
    expect([r.stdout.length, r.stderr.length]).toEqual([8_388_608, 8_388_608]);
    expect(createHash('sha256').update(r.stdout).digest('hex')).toBe(want);
    expect(createHash('sha256').update(r.stderr).digest('hex')).toBe(want);
  }, 180_000);

  it('r4-names-that-break-parsers: names round-trip through write, list, read and remove; escapes and platform paths are refused', async () => {
    const names = ['🙂.txt', 'naïve.txt', 'a b.txt', 'x%2Fy', '-rf', 'new\nline', `${'n'.repeat(251)}.txt`];
    await sbx.files.makeDir('/home/user/r4');
    for (const [i, name] of names.entries()) await sbx.files.write(`/home/user/r4/${name}`, `content ${i}`);
    const listed = (await sbx.files.list('/home/user/r4')).map((e) => e.name).sort();
    expect(listed).toEqual([...names].sort());
    for (const [i, name] of names.entries()) {
      expect(await sbx.files.read(`/home/user/r4/${name}`)).toBe(`content ${i}`);
      await sbx.files.remove(`/home/user/r4/${name}`);
    }
    expect(await sbx.files.list('/home/user/r4')).toEqual([]);
    // escapes are refused with a clear error, not resolved, and so are the platform's own paths
    await expect(sbx.files.write('/home/user/r4/../r4.txt', 'up')).rejects.toThrow(
      /must not contain a ".." segment/,
    );
    await expect(sbx.files.read('../user/r4.txt')).rejects.toThrow(/".." segment/);
    await expect(sbx.files.write('/opt/space/x', 'no')).rejects.toThrow(/platform-owned/);
    await expect(sbx.files.read('/proc/self/environ')).rejects.toThrow(/platform-owned/);
  });

  it('r5-interrupted-upload: 1 MiB round-trips; an upload that breaks off leaves the previous file', async () => {
    const bytes = randomBytes(1024 * 1024);
    await sbx.files.write('/home/user/r5.bin', new Blob([bytes]));
    const back = await sbx.files.read('/home/user/r5.bin', { format: 'bytes' });
    expect(Buffer.from(back).equals(bytes)).toBe(true);
    let sent = 0;
    const breaking = new ReadableStream<Uint8Array>({
      pull(c) {
        if (sent >= 4) return c.error(new Error('client went away'));
        sent += 1;
        c.enqueue(randomBytes(256 * 1024));
      },
    });
    await expect(sbx.files.write('/home/user/r5.bin', breaking, { useOctetStream: true })).rejects.toThrow();
    await vi.waitFor(async () => {
      const now = await sbx.files.read('/home/user/r5.bin', { format: 'bytes' });
      expect(Buffer.from(now).equals(bytes)).toBe(true);
    });
    // and no temp file of the broken upload is left beside it
    await vi.waitFor(async () =>
      expect((await sbx.files.list('/home/user')).filter((e) => e.name.includes('.space-upload-'))).toEqual(
        [],
      ),
    );
  });

  it('r6-stdin-that-closes-early: EOF at once, early close, writes after exit refused, 10 MB round-trip', async () => {
    const t0 = Date.now();
    const cat = await sbx.commands.run('cat', { background: true, stdin: true });
    await sbx.commands.sendStdin(cat.pid, '123\n');
    await sbx.commands.closeStdin(cat.pid);
    expect(await cat.wait()).toMatchObject({ exitCode: 0, stdout: '123\n' });
    expect(Date.now() - t0).toBeLessThan(5_000);
    // no stdin asked for: cat sees EOF at once
    expect(await sbx.commands.run('cat', { timeoutMs: 10_000 })).toMatchObject({ exitCode: 0, stdout: '' });
    // the process is gone: stdin for it is an error, not silence
    await expect(sbx.commands.sendStdin(cat.pid, 'late')).rejects.toThrow();
    // 10 MB of binary stdin, in 1 MiB messages
    const data = randomBytes(10 * 1024 * 1024);
    const sum = await sbx.commands.run('sha256sum', { background: true, stdin: true });
    for (let i = 0; i < data.length; i += 1024 * 1024) {
      await sbx.commands.sendStdin(sum.pid, data.subarray(i, i + 1024 * 1024));
    }
    await sbx.commands.closeStdin(sum.pid);
    expect((await sum.wait()).stdout.split(' ')[0]).toBe(createHash('sha256').update(data).digest('hex'));
  }, 120_000);

  it('r7-r11-kill-means-everything: a timeout and a kill end setsid, setpgid and double-forked processes', async () => {
    const cmd = [
      'sleep 1011 &',
      'setsid sleep 1012 &',
      'python3 -c "import os,time; os.setpgid(0,0); time.sleep(1013)" &',
      '(nohup sleep 1014 >/dev/null 2>&1 &) &',
      'wait',
    ].join(' ');
    const allRunning = async () =>
      vi.waitFor(async () => expect((await sleepers()).split('\n').filter(Boolean)).toHaveLength(4), {
        timeout: 10_000,
        interval: 200,
      });
    const timed = sbx.commands.run(cmd, { timeoutMs: 1500 }).catch((e: unknown) => e);
    await allRunning();
    expect(await timed).toBeInstanceOf(Error);
    await vi.waitFor(async () => expect(await sleepers()).toBe(''), { timeout: 10_000, interval: 200 });

    const bg = await sbx.commands.run(cmd, { background: true });
    await allRunning();
    expect(await sbx.commands.kill(bg.pid)).toBe(true);
    await expect(bg.wait()).rejects.toBeInstanceOf(CommandExitError);
    await vi.waitFor(async () => expect(await sleepers()).toBe(''), { timeout: 10_000, interval: 200 });
  }, 60_000);

  it('r12-background-servers-outlive-their-exec: `&` and `nohup … &` servers answer from a later command', async () => {
    expect((await sbx.commands.run('cd /tmp && python3 -m http.server 8000 &')).exitCode).toBe(0);
    expect((await sbx.commands.run('cd /tmp && nohup python3 -m http.server 8001 &')).exitCode).toBe(0);
    // http.server looks its address up before it listens: allow the resolver's timeouts (40 s)
    const probe = [
      'import time, urllib.request',
      'for port in (8000, 8001):',
      '    for _ in range(400):',
      '        try:',
      '            print(port, urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).status); break',
      '        except OSError: time.sleep(0.1)',
      '    else: print(port, "down")',
    ].join('\n');
    await sbx.files.write('/tmp/r12.py', probe);
    expect((await sbx.commands.run('python3 /tmp/r12.py', { timeoutMs: 90_000 })).stdout).toBe(
      '8000 200\n8001 200\n',
    );
    // the bracket keeps pkill from matching its own command line
    await sbx.commands.run('pkill -f "[h]ttp.server 800"', { user: 'root' });
    await vi.waitFor(async () =>
      expect((await sbx.commands.run('pgrep -f "[h]ttp.server 800" || true')).stdout).toBe(''),
    );
  }, 120_000);

  it('r13-exhaustion-hits-the-offender: a full /tmp is ENOSPC inside, and the next command runs', async () => {
    const kb = Number((await sbx.commands.run("df -k /tmp | tail -1 | awk '{print $2}'")).stdout);
    expect(kb).toBeGreaterThan(0);
    const dd = await sbx.commands.run(
      `dd if=/dev/zero of=/tmp/fill bs=1M count=${Math.ceil(kb / 1024) + 64} 2>&1; echo "dd=$?"`,
      { timeoutMs: 120_000 },
    );
    expect(dd.stdout).toMatch(/No space left on device/);
    expect(dd.stdout).not.toContain('dd=0');
    expect((await sbx.commands.run('rm /tmp/fill && echo next')).stdout).toBe('next\n');
  }, 180_000);

  it('r14-template-tools: venv + pip, npm, npx, git, curl and localhost work in base', async () => {
    const r = await sbx.commands.run(
      'python3 -m venv /tmp/v && /tmp/v/bin/pip --version && npm --version && npx --version && git --version && curl --version && getent hosts localhost',
      { timeoutMs: 120_000 },
    );
    expect(r.stdout).toMatch(/^pip \d+/m);
    expect(r.stdout).toMatch(/^git version/m);
    expect(r.stdout).toMatch(/^curl \d+/m);
    expect(r.stdout).toMatch(/^(127\.0\.0\.1|::1)\s+localhost/m);
  }, 180_000);

  it('r15-cwd-with-the-users-rights: user with cwd /root is refused before the command starts; root may', async () => {
    const err = await sbx.commands.run('pwd', { cwd: '/root' }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(CommandExitError);
    expect((err as CommandExitError).exitCode).toBe(126);
    expect((err as CommandExitError).stdout).toBe('');
    expect((err as CommandExitError).error).toMatch(/permission denied/);
    expect((await sbx.commands.run('pwd', { cwd: '/root', user: 'root' })).stdout).toBe('/root\n');
  });

  it('r8-burst-of-creates: 6 concurrent creates give 6 distinct, usable sandboxes', async () => {
    const made = await Promise.all(Array.from({ length: 6 }, () => Sandbox.create()));
    try {
      expect(new Set(made.map((x) => x.sandboxId)).size).toBe(6);
      await Promise.all(
        made.map(async (x) => {
          await x.files.write('/home/user/who', x.sandboxId);
          expect((await x.commands.run('cat /home/user/who')).stdout).toBe(x.sandboxId);
        }),
      );
    } finally {
      await Promise.all(made.map((x) => x.kill()));
    }
  }, 180_000);

  it('r9-kill-races: extended timeouts hold, then lapse; two concurrent kills both succeed once', async () => {
    const x = await Sandbox.create({ timeoutMs: 4_000 });
    for (let i = 0; i < 3; i++) {
      await new Promise((r) => setTimeout(r, 2_500));
      await x.setTimeout(4_000);
      expect(await x.isRunning()).toBe(true);
    }
    // stop extending: it ends on its own, within its grace
    await vi.waitFor(async () => expect(await x.isRunning()).toBe(false), { timeout: 20_000, interval: 500 });
    const y = await Sandbox.create();
    const both = await Promise.all([Sandbox.kill(y.sandboxId), Sandbox.kill(y.sandboxId)]);
    expect(both.filter(Boolean).length).toBeGreaterThanOrEqual(1);
    expect(await y.isRunning()).toBe(false);
    expect(await Sandbox.kill(y.sandboxId)).toBe(false);
  }, 120_000);
});

describe('space e2b env', () => {
  it('is the whole migration: the quickstart script runs after eval "$(space e2b env)"', async () => {
    const root = fileURLToPath(new URL('..', import.meta.url));
    const { stdout, stderr } = await promisify(execFile)(
      'bash',
      ['-c', 'eval "$(node runtime/cli/space.ts e2b env)" && node examples/e2b-quickstart.mjs'],
      {
        cwd: root,
        timeout: 120_000,
        // nothing E2B-related inherited: only what `space e2b env` prints
        env: {
          PATH: process.env.PATH ?? '',
          HOME: process.env.HOME ?? '',
          SPACE_API_URL: s.apiUrl,
          SPACE_API_KEY: s.apiKey,
          SPACE_ROUTER_URL: router.url,
        },
      },
    );
    expect(stderr).toBe('');
    expect(stdout).toBe('hello from sandbox\nfile listed\n');
  });
});
