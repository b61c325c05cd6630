/**
 * R14: the `base` template does what agents try first — pip, venv, npm/npx, git, curl, a resolvable
 * `localhost` — and `pip install` / `npm install` work through an egress policy that allows a
 * package index. The index is local: a Python `http.server` in a network namespace of its own
 * (`pkg-…`, 10.198.250.0/24, outside the gateway's deny set for this run), named `pkg.test` by a DNS
 * server in this process that the gateway uses as its upstream. Nothing leaves the machine.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { createSocket, type Socket } from 'node:dgram';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import dnsPacket from 'dns-packet';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEFAULT_DENY_CIDRS } from '../runtime/gateway/addresses.ts';
import { type Stack, startStack, stopThenClean, waitFor } from './stack.ts';
import { makeWorldLink, worldLinkNames } from './world-link.ts';

const run = promisify(execFile);
const LINK = worldLinkNames('pkg');
const HOST_ADDR = '10.198.250.1';
const INDEX_ADDR = '10.198.250.2';
const INDEX = 'pkg.test';
/** The gateway's deny set for this run: its defaults with 10/8 carved around the index's /24. */
const DENY = [
  ...DEFAULT_DENY_CIDRS.filter((c) => c !== '10.0.0.0/8'),
  '10.0.0.0/9',
  '10.128.0.0/10',
  '10.192.0.0/14',
  '10.196.0.0/15',
  '10.198.0.0/17',
  '10.198.128.0/18',
  '10.198.192.0/19',
  '10.198.224.0/20',
  '10.198.240.0/21',
  '10.198.248.0/23',
  '10.198.251.0/24',
  '10.198.252.0/22',
  '10.199.0.0/16',
  '10.200.0.0/13',
  '10.208.0.0/12',
  '10.224.0.0/11',
];

const cleanups: (() => Promise<unknown>)[] = [];
let s: Stack;
let id: string;
let dir: string;
let server: ChildProcess;
let dns: Socket;
const asked: string[] = [];
const served: string[] = [];

/** A wheel (a zip with the package and its dist-info) of `tinypkg` 1.0, made with the host's python3. */
async function makeWheel(out: string): Promise<void> {
  const py = [
    'import sys, zipfile, hashlib, base64',
    'files = {',
    '  "tinypkg/__init__.py": "VALUE = 1014\\n",',
    '  "tinypkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\\nName: tinypkg\\nVersion: 1.0\\n",',
    '  "tinypkg-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\\nGenerator: space-test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",',
    '}',
    'rec = []',
    'for n, t in files.items():',
    '    d = hashlib.sha256(t.encode()).digest()',
    '    rec.append(f"{n},sha256={base64.urlsafe_b64encode(d).rstrip(b\'=\').decode()},{len(t)}")',
    'rec.append("tinypkg-1.0.dist-info/RECORD,,")',
    'files["tinypkg-1.0.dist-info/RECORD"] = "\\n".join(rec) + "\\n"',
    'with zipfile.ZipFile(sys.argv[1], "w") as z:',
    '    for n, t in files.items(): z.writestr(n, t)',
  ].join('\n');
  await run('python3', ['-c', py, out]);
}

/** The index's tree: a PEP 503 simple index with the wheel, and an npm registry document with its tarball. */
async function makeIndex(root: string): Promise<void> {
  await mkdir(join(root, 'simple', 'tinypkg'), { recursive: true });
  await mkdir(join(root, 'packages'), { recursive: true });
  const wheel = join(root, 'packages', 'tinypkg-1.0-py3-none-any.whl');
  await makeWheel(wheel);
  const wsha = createHash('sha256')
    .update(await readFile(wheel))
    .digest('hex');
  await writeFile(
    join(root, 'simple', 'tinypkg', 'index.html'),
    `<!DOCTYPE html><html><body><a href="/packages/tinypkg-1.0-py3-none-any.whl#sha256=${wsha}">tinypkg-1.0-py3-none-any.whl</a></body></html>\n`,
  );
  const pkg = join(root, 'build', 'package');
  await mkdir(pkg, { recursive: true });
  await writeFile(
    join(pkg, 'package.json'),
    JSON.stringify({ name: 'tinynpm', version: '1.0.0', main: 'index.js' }),
  );
  await writeFile(join(pkg, 'index.js'), 'module.exports = 1014;\n');
  await mkdir(join(root, 'tarballs'), { recursive: true });
  const tgz = join(root, 'tarballs', 'tinynpm-1.0.0.tgz');
  await run('tar', ['-czf', tgz, '-C', join(root, 'build'), '--owner=0', '--group=0', 'package']);
  const bytes = await readFile(tgz);
  const dist = {
    tarball: `http://${INDEX}/tarballs/tinynpm-1.0.0.tgz`,
    shasum: createHash('sha1').update(bytes).digest('hex'),
    integrity: `sha512-${createHash('sha512').update(bytes).digest('base64')}`,
  };
  await writeFile(
    join(root, 'tinynpm'),
    JSON.stringify({
      name: 'tinynpm',
      'dist-tags': { latest: '1.0.0' },
      versions: { '1.0.0': { name: 'tinynpm', version: '1.0.0', main: 'index.js', dist } },
    }),
  );
}

/** The gateway's upstream resolver: `pkg.test` → the index; every other name NXDOMAIN. */
async function startDns(): Promise<number> {
  dns = createSocket('udp4');
  dns.on('message', (msg, from) => {
    let q: dnsPacket.DecodedPacket;
    try {
      q = dnsPacket.decode(msg);
    } catch {
      return;
    }
    const question = q.questions?.[0];
    if (!question) return;
    asked.push(question.name);
    const hit = question.name.toLowerCase() === INDEX;
    const reply = dnsPacket.encode({
      type: 'response',
      id: q.id,
      flags: dnsPacket.AUTHORITATIVE_ANSWER | (hit ? 0 : 3), // rcode 3: NXDOMAIN
      questions: q.questions,
      answers:
        hit && question.type === 'A' ? [{ type: 'A', name: question.name, ttl: 60, data: INDEX_ADDR }] : [],
    });
    dns.send(reply, from.port, from.address);
  });
  await new Promise<void>((r) => dns.bind(0, '127.0.0.1', r));
  return dns.address().port;
}

async function startIndex(): Promise<void> {
  await makeWorldLink(LINK, { hostCidr: `${HOST_ADDR}/24`, nsCidrs: [`${INDEX_ADDR}/24`] }, cleanups);
  server = spawn(
    'ip',
    [
      'netns',
      'exec',
      LINK.ns,
      'python3',
      '-m',
      'http.server',
      '80',
      '--bind',
      INDEX_ADDR,
      '--directory',
      dir,
    ],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  // its request log: one line per request, on stderr
  server.stderr!.on('data', (d: Buffer) => served.push(...d.toString().split('\n').filter(Boolean)));
  cleanups.push(async () => {
    server.kill('SIGKILL');
  });
  await waitFor('the package index', async () => {
    const r = await run('curl', ['-sf', '-o', '/dev/null', `http://${INDEX_ADDR}/tinynpm`]).catch(() => null);
    return r ? true : undefined;
  });
}

describe('r14 template tools and package installs', () => {
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'space-pkg-'));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    await makeIndex(dir);
    await startIndex();
    const dnsPort = await startDns();
    cleanups.push(async () => dns.close());
    s = await startStack({}, { upstreamDns: `127.0.0.1:${dnsPort}`, denyCidrs: DENY.join(',') });
    id = await s.createSandbox({ egress: { allow: [INDEX] }, timeoutSec: 900 });
  }, 600_000);

  afterAll(() => stopThenClean(s, cleanups));

  it('r14-template-tools: venv + pip, npm, npx, git, curl and localhost work in base', async () => {
    const r = await s.exec(id, {
      cmd: 'sh',
      args: [
        '-c',
        [
          'python3 -m venv /tmp/v && /tmp/v/bin/pip --version | cut -d" " -f1',
          'npm --version >/dev/null && echo npm',
          'npx --version >/dev/null && echo npx',
          'git --version | cut -d" " -f1-2',
          'curl --version | head -1 | cut -d" " -f1',
          'getent hosts localhost >/dev/null && echo localhost',
          `python3 -c "import socket; print(socket.gethostbyname('localhost'))"`,
        ].join(' && '),
      ],
      timeoutMs: 60_000,
    });
    expect(r.stderr.toString()).toBe('');
    expect(r.stdout.toString()).toBe('pip\nnpm\nnpx\ngit version\ncurl\nlocalhost\n127.0.0.1\n');
  });

  it('r14-package-installs: pip install --user and npm install fetch from an allowed index through the gateway', async () => {
    const pip = await s.exec(id, {
      cmd: 'sh',
      args: [
        '-c',
        `pip install --user --index-url http://${INDEX}/simple --trusted-host ${INDEX} tinypkg 2>&1 && python3 -c "import tinypkg; print(tinypkg.VALUE)"`,
      ],
      timeoutMs: 120_000,
    });
    expect(pip.exit.exitCode, pip.stdout.toString()).toBe(0);
    expect(pip.stdout.toString()).toMatch(/Successfully installed tinypkg-1\.0\n1014\n$/);
    const npm = await s.exec(id, {
      cmd: 'sh',
      args: [
        '-c',
        `mkdir -p /tmp/proj && cd /tmp/proj && npm install --registry http://${INDEX}/ tinynpm 2>&1 && node -e "console.log(require('tinynpm'))"`,
      ],
      timeoutMs: 120_000,
    });
    expect(npm.exit.exitCode, npm.stdout.toString()).toBe(0);
    expect(npm.stdout.toString()).toMatch(/added 1 package[\s\S]*\n1014\n$/);
    // both really came from the index, by its name, through the gateway
    expect(asked).toContain(INDEX);
    expect(served.some((l) => l.includes('GET /packages/tinypkg-1.0-py3-none-any.whl'))).toBe(true);
    expect(served.some((l) => l.includes('GET /tarballs/tinynpm-1.0.0.tgz'))).toBe(true);
  }, 300_000);

  it('r14-denied-index: without the index on its allow list, the same install fails', async () => {
    const other = await s.createSandbox({ timeoutSec: 300 });
    const before = served.length;
    const pip = await s.exec(other, {
      cmd: 'sh',
      args: [
        '-c',
        `pip install --user --retries 0 --timeout 5 --index-url http://${INDEX}/simple --trusted-host ${INDEX} tinypkg 2>&1`,
      ],
      timeoutMs: 120_000,
    });
    expect(pip.exit.exitCode).not.toBe(0);
    expect(served.length).toBe(before);
    await s.call('DELETE', `/v1/sandboxes/${other}`);
  }, 180_000);
});
