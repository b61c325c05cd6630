import { createHash, randomBytes } from 'node:crypto';
import { readdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AUTH, call, type Guest, q, startGuest } from './test-harness.ts';

const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const code = (r: { json: () => unknown }) => (r.json() as { error: { code: string } }).error.code;

function rssKiB(pid: number): number {
  return Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))![1]);
}

let g: Guest;
beforeAll(async () => {
  g = await startGuest();
});
afterAll(async () => {
  await g?.stop();
});

describe('guest files: names and paths', () => {
  const names = ['🙂.txt', 'naïve.txt', 'a b.txt', 'x%2Fy', '-rf', 'line\nbreak', `${'n'.repeat(251)}.txt`];

  it('writes, reads, stats and lists arbitrary UTF-8 names', async () => {
    for (const name of names) {
      const w = await call(g, 'PUT', `/files?path=${q(`names/${name}`)}`, `content of ${name}`);
      expect(w.status).toBe(200);
      const st = w.json() as { name: string; path: string; type: string; size: number; mode: number };
      expect(st).toMatchObject({ name, path: join(g.home, 'names', name), type: 'file', mode: 0o644 });
      expect(st.size).toBe(Buffer.byteLength(`content of ${name}`));
      const r = await call(g, 'GET', `/files?path=${q(join(g.home, 'names', name))}`);
      expect(r.status).toBe(200);
      expect(r.body.toString()).toBe(`content of ${name}`);
      const s = await call(g, 'GET', `/fs/stat?path=${q(`names/${name}`)}`);
      expect((s.json() as { name: string }).name).toBe(name);
    }
    expect(readdirSync(join(g.home, 'names')).sort()).toEqual([...names].sort());
    const list = await call(g, 'GET', `/fs/list?path=names`);
    const entries = (list.json() as { entries: { name: string }[] }).entries.map((e) => e.name);
    expect(entries).toEqual([...names].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0)));
  });

  it('refuses invalid and platform-owned paths with 400 PATH_INVALID', async () => {
    const bad = [
      'a\0b',
      '../etc/passwd',
      '/tmp/../etc/passwd',
      'x/../../y',
      `${'n'.repeat(256)}`,
      `/${'d/'.repeat(2100)}f`,
      '/proc/self/environ',
      '/proc',
      '/sys/kernel',
      '/dev/null',
      '/opt/space/runtime/guest/main.cjs',
      '',
    ];
    for (const p of bad) {
      const r = await call(g, 'GET', `/files?path=${q(p)}`);
      expect(r.status, p.slice(0, 40)).toBe(400);
      expect(code(r)).toBe('PATH_INVALID');
    }
    const w = await call(g, 'PUT', `/files?path=${q('/dev/evil')}`, 'x');
    expect(w.status).toBe(400);
    const d = await call(g, 'DELETE', `/fs?path=${q('/opt/space')}&recursive=1`);
    expect(d.status).toBe(400);
    symlinkSync('/proc', join(g.home, 'procs'));
    const viaLink = await call(g, 'GET', `/files?path=${q('procs/self/environ')}`);
    expect(viaLink.status).toBe(400);
    expect(code(viaLink)).toBe('PATH_INVALID');
    const linkStat = await call(g, 'GET', `/fs/stat?path=procs`);
    expect((linkStat.json() as { type: string }).type).toBe('symlink');
    expect((await call(g, 'GET', `/files?path=${q('/etc/hostname')}`)).status).toBe(200);
  });
});

describe('guest files: read, write, errors', () => {
  it('streams a large file both ways without buffering it', async () => {
    const data = randomBytes(96 * 1024 * 1024);
    const before = rssKiB(g.child.pid!);
    const w = await call(g, 'PUT', `/files?path=big/blob.bin&mode=0600`, data);
    expect(w.status).toBe(200);
    expect(w.json()).toMatchObject({ size: data.length, mode: 0o600 });
    expect(sha(readFileSync(join(g.home, 'big/blob.bin')))).toBe(sha(data));
    const r = await call(g, 'GET', `/files?path=big/blob.bin`);
    expect(r.status).toBe(200);
    expect(Number(r.headers['content-length'])).toBe(data.length);
    expect(sha(r.body)).toBe(sha(data));
    expect(rssKiB(g.child.pid!) - before).toBeLessThan(64 * 1024);
  }, 60_000);

  it('an aborted upload leaves the previous file and no temp file', async () => {
    writeFileSync(join(g.home, 'keep.txt'), 'previous');
    for (const target of ['keep.txt', 'never.txt']) {
      await new Promise<void>((resolve) => {
        const req = httpRequest(`${g.base}/files?path=${q(target)}`, {
          method: 'PUT',
          agent: false,
          headers: { ...AUTH, 'content-length': '1000000' },
        });
        req.on('error', () => resolve());
        req.write(Buffer.alloc(100_000, 1));
        setTimeout(() => {
          req.destroy();
          resolve();
        }, 200);
      });
    }
    await sleep(200);
    expect(readFileSync(join(g.home, 'keep.txt'), 'utf8')).toBe('previous');
    const names = readdirSync(g.home);
    expect(names).not.toContain('never.txt');
    expect(names.filter((n) => n.startsWith('.space-upload'))).toEqual([]);
  });

  it('overwrites atomically and keeps the mode of the file it replaces', async () => {
    expect((await call(g, 'PUT', `/files?path=over.sh&mode=0755`, 'one')).status).toBe(200);
    const w = await call(g, 'PUT', `/files?path=over.sh`, 'two');
    expect(w.json()).toMatchObject({ size: 3, mode: 0o755 });
    expect((await call(g, 'GET', `/files?path=over.sh`)).body.toString()).toBe('two');
    const bad = await call(g, 'PUT', `/files?path=over.sh&mode=999`, 'x');
    expect(bad.status).toBe(400);
  });

  it('reports FILE_NOT_FOUND and FILE_CONFLICT where fitting', async () => {
    const missing = await call(g, 'GET', `/files?path=nope.txt`);
    expect([missing.status, code(missing)]).toEqual([404, 'FILE_NOT_FOUND']);
    expect((await call(g, 'GET', `/fs/stat?path=nope.txt`)).status).toBe(404);
    expect((await call(g, 'GET', `/fs/list?path=nope`)).status).toBe(404);
    await call(g, 'POST', '/fs/mkdir', { path: 'adir' });
    const readDir = await call(g, 'GET', `/files?path=adir`);
    expect([readDir.status, code(readDir)]).toEqual([409, 'FILE_CONFLICT']);
    const writeDir = await call(g, 'PUT', `/files?path=adir`, 'x');
    expect([writeDir.status, code(writeDir)]).toEqual([409, 'FILE_CONFLICT']);
    await call(g, 'PUT', `/files?path=afile`, 'x');
    const under = await call(g, 'PUT', `/files?path=afile/child`, 'x');
    expect([under.status, code(under)]).toEqual([409, 'FILE_CONFLICT']);
    const listFile = await call(g, 'GET', `/fs/list?path=afile`);
    expect([listFile.status, code(listFile)]).toEqual([409, 'FILE_CONFLICT']);
  });

  it('mkdir (with and without parents), list and delete (recursive)', async () => {
    const noParent = await call(g, 'POST', '/fs/mkdir', { path: 'm/a/b' });
    expect([noParent.status, code(noParent)]).toEqual([404, 'FILE_NOT_FOUND']);
    const mk = await call(g, 'POST', '/fs/mkdir', { path: 'm/a/b', parents: true });
    expect(mk.status).toBe(200);
    expect(mk.json()).toMatchObject({ name: 'b', path: join(g.home, 'm/a/b'), type: 'dir' });
    expect((await call(g, 'POST', '/fs/mkdir', { path: 'm/a/b' })).status).toBe(200);
    await call(g, 'PUT', `/files?path=m/a/f.txt`, 'x');
    const onFile = await call(g, 'POST', '/fs/mkdir', { path: 'm/a/f.txt' });
    expect([onFile.status, code(onFile)]).toEqual([409, 'FILE_CONFLICT']);
    const list = (await call(g, 'GET', `/fs/list?path=m/a`)).json() as {
      entries: { name: string; type: string }[];
    };
    expect(list.entries.map((e) => [e.name, e.type])).toEqual([
      ['b', 'dir'],
      ['f.txt', 'file'],
    ]);
    const notEmpty = await call(g, 'DELETE', `/fs?path=m`);
    expect([notEmpty.status, code(notEmpty)]).toEqual([409, 'FILE_CONFLICT']);
    expect((await call(g, 'DELETE', `/fs?path=m/a/f.txt`)).status).toBe(204);
    expect((await call(g, 'DELETE', `/fs?path=m/a/b`)).status).toBe(204);
    expect((await call(g, 'DELETE', `/fs?path=m&recursive=1`)).status).toBe(204);
    const gone = await call(g, 'DELETE', `/fs?path=m`);
    expect([gone.status, code(gone)]).toEqual([404, 'FILE_NOT_FOUND']);
  });
});

describe('r10-download-matches-its-headers', () => {
  /** GETs on one keep-alive connection; each answer's declared length and the bytes that came. */
  async function getAll(paths: string[], between?: (i: number) => Promise<void>) {
    const { Agent } = await import('node:http');
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    const out: { status: number; declared: number; body: Buffer }[] = [];
    try {
      for (const [i, p] of paths.entries()) {
        out.push(
          await new Promise((resolve, reject) => {
            const req = httpRequest(`${g.base}/files?path=${q(p)}`, { agent, headers: AUTH }, (res) => {
              const chunks: Buffer[] = [];
              let first = true;
              res.on('data', (c: Buffer) => {
                chunks.push(c);
                if (first && between) {
                  first = false;
                  res.pause();
                  void between(i).then(() => res.resume());
                }
              });
              res.on('end', () =>
                resolve({
                  status: res.statusCode!,
                  declared: Number(res.headers['content-length']),
                  body: Buffer.concat(chunks),
                }),
              );
              res.on('error', reject);
            });
            req.on('error', reject);
            req.end();
          }),
        );
      }
    } finally {
      agent.destroy();
    }
    return out;
  }

  it('a symlink downloads as its target, exactly; stat of the link says so', async () => {
    const data = randomBytes(1_000_000);
    writeFileSync(join(g.home, 'big.bin'), data);
    symlinkSync('big.bin', join(g.home, 'big.lnk'));
    const [a, b] = await getAll(['big.lnk', 'big.bin']);
    for (const r of [a!, b!]) {
      expect(r.status).toBe(200);
      expect(r.declared).toBe(1_000_000);
      expect(r.body.length).toBe(1_000_000);
      expect(sha(r.body)).toBe(sha(data));
    }
    const st = (await call(g, 'GET', `/fs/stat?path=${q('big.lnk')}`)).json() as {
      type: string;
      target: { type: string; size: number };
    };
    expect(st.type).toBe('symlink');
    expect(st.target).toMatchObject({ type: 'file', size: 1_000_000 });
  });

  it('a file that grows during its download sends exactly the declared bytes; the connection stays usable', async () => {
    const path = join(g.home, 'growing.bin');
    const start = randomBytes(4 * 1024 * 1024);
    writeFileSync(path, start);
    const [grown, next] = await getAll(['growing.bin', 'big.bin'], async (i) => {
      if (i === 0) writeFileSync(path, randomBytes(2 * 1024 * 1024), { flag: 'a' });
    });
    expect(grown!.declared).toBe(start.length);
    expect(grown!.body.length).toBe(start.length);
    expect(sha(grown!.body)).toBe(sha(start));
    // the next answer on the same connection is whole, not the tail of the previous file
    expect(next!.body.length).toBe(1_000_000);
    expect(next!.declared).toBe(1_000_000);
  });
});
