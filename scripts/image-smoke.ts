/**
 * Starts each of the image’s commands from the built image and checks what it prints:
 * the API, the router and the gateway become ready (the API against a real redis-server on loopback, its
 * /readyz answering), each service without its required settings prints its configuration error,
 * the image carries what an agent node needs (the baked guest kernel and base template included)
 * and no Pulumi package, and an agent on the qemu driver boots a real sandbox from what the image
 * baked in (scripts/image-smoke-sandbox.ts: in a network namespace of its own).
 *
 * Runs the image with `buildah run --isolation chroot` (no daemon, no cgroup or rlimit setup, so
 * it works inside CI's container as well as on a host; host network). Needs root and buildah.
 *
 * Usage: node scripts/image-smoke.ts [image]   (default localhost/space:<package.json version>)
 * Ends with the line "N passed, N failed"; exits 1 on any failure.
 */
import { execFileSync, spawn } from 'node:child_process';
import { generateKeyPairSync } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SERVICE_COMMANDS } from '../providers/runtime-settings.ts';
import { freePort, startRedisServer } from '../test/redis-server.ts';
import { smokeQemuSandbox } from './image-smoke-sandbox.ts';

const version = (
  JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string }
).version;
const image = process.argv[2] ?? `localhost/space:${version}`;
const isolation = process.env['SPACE_IMAGE_ISOLATION'] ?? 'chroot';

interface RunResult {
  readonly code: number | null;
  readonly output: string;
}

/**
 * Runs `argv` in a fresh working container of the image, with `env` and `volumes`, for at most
 * `seconds` (the command is wrapped in coreutils `timeout` inside the container, so nothing is left
 * running); `whileRunning` is called once `ready` matches the output.
 */
async function runInImage(
  argv: string[],
  opts: {
    env?: Record<string, string>;
    volumes?: string[];
    seconds?: number;
    ready?: RegExp;
    whileRunning?: () => Promise<void>;
  } = {},
): Promise<RunResult> {
  const ctr = execFileSync('buildah', ['from', '--pull=false', image], { encoding: 'utf8' })
    .trim()
    .split('\n')
    .pop()!;
  try {
    const args = [
      'run',
      '--isolation',
      isolation,
      ...Object.entries(opts.env ?? {}).flatMap(([k, v]) => ['--env', `${k}=${v}`]),
      ...(opts.volumes ?? []).flatMap((v) => ['--volume', v]),
      ctr,
      '--',
      'timeout',
      '--signal=TERM',
      '--kill-after=5',
      String(opts.seconds ?? 20),
      ...argv,
    ];
    const child = spawn('buildah', args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    let fired = false;
    let hook: Promise<void> = Promise.resolve();
    const onData = (d: Buffer) => {
      output += d.toString();
      if (!fired && opts.ready?.test(output)) {
        fired = true;
        hook = (opts.whileRunning ?? (async () => {}))();
      }
    };
    child.stdout.on('data', onData);
    child.stderr.on('data', onData);
    const code = await new Promise<number | null>((r) => child.on('close', r));
    await hook;
    return { code, output };
  } finally {
    execFileSync('buildah', ['rm', ctr], { stdio: 'ignore' });
  }
}

const results: { name: string; ok: boolean; detail: string }[] = [];
async function check(name: string, fn: () => Promise<string | undefined>): Promise<void> {
  try {
    const problem = await fn();
    results.push({ name, ok: !problem, detail: problem ?? '' });
  } catch (err) {
    results.push({ name, ok: false, detail: String(err) });
  }
  const r = results.at(-1)!;
  console.log(
    `${r.ok ? 'ok  ' : 'FAIL'} ${name}${r.ok ? '' : `\n     ${r.detail.replaceAll('\n', '\n     ')}`}`,
  );
}

const expectLine = (r: RunResult, re: RegExp, code?: number) =>
  re.test(r.output) && (code === undefined || r.code === code)
    ? undefined
    : `expected ${re} (exit ${code ?? 'any'}), got exit ${r.code}:\n${r.output.slice(0, 2000)}`;

const work = mkdtempSync(join(tmpdir(), 'space-image-smoke-'));
const redis = await startRedisServer();
try {
  const keys = generateKeyPairSync('ed25519');
  writeFileSync(
    join(work, 'signing.pem'),
    keys.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(),
  );
  writeFileSync(join(work, 'verify.pem'), keys.publicKey.export({ type: 'spki', format: 'pem' }).toString());

  await check('api: without settings it names the missing one and exits 1', async () =>
    expectLine(
      await runInImage(['node', 'runtime/api/server.ts']),
      /invalid api configuration:\n\s+SPACE_/,
      1,
    ),
  );
  await check('agent: without settings it names the missing one and exits 1', async () =>
    expectLine(await runInImage([...SERVICE_COMMANDS.agent]), /invalid agent configuration:\n\s+SPACE_/, 1),
  );
  await check('gateway: without a Redis URL it says so', async () =>
    expectLine(
      await runInImage(['node', 'runtime/gateway/server.ts'], {
        env: { SPACE_GATEWAY_CONTROL_SOCKET: '/tmp/g.sock', SPACE_REDIS_URL: 'redis://127.0.0.1:1' },
        seconds: 4,
      }),
      /credential store unreachable/,
    ),
  );

  await check('api: with a real Redis and a key it listens and /readyz answers 200', async () => {
    const port = await freePort();
    let readyz = 0;
    const r = await runInImage(['node', 'runtime/api/server.ts'], {
      env: {
        SPACE_API_HOST: '127.0.0.1',
        SPACE_API_PORT: String(port),
        SPACE_REDIS_URL: redis.url,
        SPACE_SIGNING_KEY_FILE: '/keys/signing.pem',
      },
      volumes: [`${work}:/keys:ro`],
      seconds: 15,
      ready: /Server listening at/,
      whileRunning: async () => {
        for (let i = 0; i < 20 && readyz !== 200; i++) {
          readyz = await fetch(`http://127.0.0.1:${port}/readyz`).then(
            (res) => res.status,
            () => 0,
          );
          if (readyz !== 200) await new Promise((res) => setTimeout(res, 250));
        }
      },
    });
    return (
      expectLine(r, /Server listening at/) ?? (readyz === 200 ? undefined : `/readyz answered ${readyz}`)
    );
  });

  await check('router: with a real Redis and the verify key it listens', async () =>
    expectLine(
      await runInImage(['node', 'runtime/router/server.ts'], {
        env: {
          SPACE_ROUTER_HOST: '127.0.0.1',
          SPACE_ROUTER_PORT: String(await freePort()),
          SPACE_REDIS_URL: redis.url,
          SPACE_VERIFY_KEY_FILE: '/keys/verify.pem',
        },
        volumes: [`${work}:/keys:ro`],
        seconds: 8,
      }),
      /"msg":"router listening"/,
    ),
  );

  await check('gateway: with a real Redis it listens on its control socket and ports', async () =>
    expectLine(
      await runInImage(['node', 'runtime/gateway/server.ts'], {
        env: {
          SPACE_REDIS_URL: redis.url,
          SPACE_GATEWAY_CONTROL_SOCKET: '/tmp/gateway.sock',
          SPACE_GATEWAY_BIND_HOST: '127.0.0.1',
          SPACE_GATEWAY_DNS_PORT: '0',
          SPACE_GATEWAY_HTTP_PORT: '0',
          SPACE_GATEWAY_TLS_PORT: '0',
          SPACE_GATEWAY_CA_CERT_FILE: '/tmp/ca/ca.crt',
          SPACE_GATEWAY_CA_KEY_FILE: '/tmp/ca/ca.key',
        },
        seconds: 8,
      }),
      /"msg":"gateway listening"/,
    ),
  );

  // not further: a started agent sets up nftables and network namespaces in the host network it
  // shares here. Past its configuration it connects to Redis first; an unreachable one ends it.
  await check(
    'agent: with its key it gets past its configuration to Redis (unreachable here) and exits 1',
    async () =>
      expectLine(
        await runInImage([...SERVICE_COMMANDS.agent], {
          env: {
            SPACE_VERIFY_KEY_FILE: '/keys/verify.pem',
            SPACE_REDIS_URL: 'redis://127.0.0.1:1',
            SPACE_DRIVER: 'gvisor',
          },
          volumes: [`${work}:/keys:ro`],
          seconds: 15,
        }),
        /agent failed to start: .*(Connection is closed|ECONNREFUSED)/,
        1,
      ),
  );

  await check(
    'the image carries Node 24, runsc, nft, qemu, sysctl, tini-static, and no Pulumi package',
    async () => {
      const r = await runInImage([
        'bash',
        '-c',
        'node --version; runsc --version | head -1; nft --version; qemu-system-x86_64 --version | head -1; sysctl --version; ' +
          'test -x /usr/bin/tini-static && echo tini-static; ls node_modules/@pulumi 2>&1 | head -1; echo NODE_ENV=$NODE_ENV',
      ]);
      const want = [
        /^v24\./m,
        /^runsc version/m,
        /^nftables v/m,
        /^QEMU emulator version/m,
        /^sysctl from procps/m,
        /^tini-static$/m,
        /No such file/,
      ];
      const missing = want.filter((re) => !re.test(r.output));
      return missing.length ? `missing ${missing.join(', ')} in:\n${r.output}` : undefined;
    },
  );

  await check(
    'the image carries the guest kernel (virtio_mmio binds ACPI-described devices) and the base template',
    async () => {
      const r = await runInImage([
        'bash',
        '-c',
        'cat /usr/lib/space/guest-kernel/kernel.json; echo; grep -c LNRO0005 /usr/lib/space/guest-kernel/modules/virtio_mmio.ko; ' +
          'ls /usr/lib/space/templates/base/*/complete; stat -c %u /usr/lib/space/templates/base/*/rootfs/home/user',
      ]);
      const want = [
        /"version":"[^"]+-cloud-amd64"/,
        /^[1-9]\d*$/m,
        /templates\/base\/[0-9a-f]{64}\/complete/,
        /^1000$/m,
      ];
      const missing = want.filter((re) => !re.test(r.output));
      return missing.length ? `missing ${missing.join(', ')} in:\n${r.output}` : undefined;
    },
  );

  await check(
    'agent (qemu driver, no KVM, empty cache, no apt lists, template builds off) boots a real sandbox through the API',
    () => smokeQemuSandbox(image, isolation, work),
  );
} finally {
  await redis.stop();
  rmSync(work, { recursive: true, force: true });
}

const failed = results.filter((r) => !r.ok).length;
console.log(`${results.length - failed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
