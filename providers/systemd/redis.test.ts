/**
 * The control VM's Redis as rendered, run for real: the rendered redis.conf under this host's
 * `redis-server` (Debian's), with the arguments the rendered unit adds. It must start from that
 * file alone, ask for the password, and keep protected mode. Redis 6.0 (Ubuntu 22.04, Debian 11)
 * cannot be run here; what broke it (an `include` with a glob, read as a literal path) is checked
 * on every file and command the control VM gets.
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { REDIS_PORT } from '../runtime-settings.ts';
import { controlPlan, toCloudConfig, toShellScript } from './cloud-init.ts';
import { REDIS_CONF_FILE, redisConf } from './redis.ts';

const PW = 'redis-pw-Ab3.9_x~Q7';
const plan = controlPlan({
  version: '0.1.0',
  imageRepository: 'registry.example/space',
  privateCidr: '10.10.0.0/24',
  redisPassword: PW,
  routerUrl: 'https://router.example.com',
});
const file = (path: string) => plan.files.find((f) => f.path === path)?.content;

const dir = mkdtempSync(join(tmpdir(), 'space-redis-conf-'));
let server: ChildProcess | undefined;
afterAll(() => {
  server?.kill('SIGKILL');
  rmSync(dir, { recursive: true, force: true });
});

const freePort = () =>
  new Promise<number>((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address() as { port: number };
      s.close(() => resolve(port));
    });
  });

describe('the control VM runs Redis from a configuration SPACE writes in full', () => {
  it('no file or command of the control VM includes a glob, or the distribution’s redis.conf', () => {
    const text = [toCloudConfig(plan), toShellScript(plan)].join('\n');
    expect(text).not.toMatch(/^\s*include\s/m);
    expect(text).not.toContain('/etc/redis/');
    expect(text).not.toMatch(/systemctl (re)?start redis-server/);
    // the package's unit (its own config, no password) is stopped and kept from starting again
    expect(plan.commands).toContain('systemctl mask redis-server.service');
    const unit = file('/etc/systemd/system/space-redis.service')!;
    expect(unit).toContain('ExecStart=/usr/local/sbin/space-redis');
    expect(file('/usr/local/sbin/space-redis')).toContain(
      `exec /usr/bin/redis-server ${REDIS_CONF_FILE} --bind 127.0.0.1 "$ip4"`,
    );
    expect(plan.files.find((f) => f.path === REDIS_CONF_FILE)?.mode).toBe('0600');
  });

  it('the conf asks for the password, keeps protected mode and listens on loopback and the private address only', () => {
    const conf = file(REDIS_CONF_FILE)!;
    expect(conf).toContain(`requirepass ${PW}\n`);
    expect(conf).toContain('protected-mode yes\n');
    expect(conf).not.toMatch(/bind 0\.0\.0\.0|protected-mode no/);
    expect(conf).toContain(`port ${REDIS_PORT}\n`);
    // the private address is the subnet's, found at each start (the cloud may assign it)
    expect(file('/usr/local/sbin/space-redis')).toContain('ip -4 -o addr show to 10.10.0.0/24');
  });

  it('a password that could break the conf, a URL or a shell word is refused', () => {
    for (const bad of ['short', 'has space in it 123', 'quote"inside-0123456', 'new\nline-0123456789'])
      expect(() => redisConf(bad)).toThrow(/16-128 characters/);
  });

  it('this host’s redis-server starts from the rendered conf (as the unit runs it) and refuses clients without the password', async () => {
    const port = await freePort();
    const conf = join(dir, 'redis.conf');
    writeFileSync(conf, file(REDIS_CONF_FILE)!, { mode: 0o600 });
    // as space-redis runs it, with this host's loopback for the private address; the test's own
    // port and data directory
    server = spawn('redis-server', [conf, '--bind', '127.0.0.1', '--port', String(port), '--dir', dir], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let log = '';
    server.stdout!.on('data', (d) => (log += d));
    await new Promise<void>((resolve, reject) => {
      server!.stdout!.on('data', () => log.includes('Ready to accept connections') && resolve());
      server!.once('exit', (code) => reject(new Error(`redis-server exited ${code}: ${log}`)));
    });
    // as the VM's scripts call redis-cli: the password in REDISCLI_AUTH (REDIS_CLI_AUTH), or none
    const cli = (auth: string | undefined, ...args: string[]) =>
      spawnSync('redis-cli', ['-h', '127.0.0.1', '-p', String(port), ...args], {
        encoding: 'utf8',
        env: { PATH: process.env['PATH'], ...(auth === undefined ? {} : { REDISCLI_AUTH: auth }) },
      });
    expect(cli(undefined, 'SET', 'k', 'v').stdout).toMatch(/NOAUTH/);
    expect(cli(`${PW}x`, 'SET', 'k', 'v').stdout + cli(`${PW}x`, 'SET', 'k', 'v').stderr).toMatch(
      /WRONGPASS|AUTH failed/,
    );
    expect(cli(PW, 'SET', 'k', 'v').stdout.trim()).toBe('OK');
    // as the services connect: the URL of /etc/space/redis.env
    const url = file('/etc/space/redis.env')!
      .trim()
      .replace('SPACE_REDIS_URL=', '')
      .replace(`:${REDIS_PORT}`, `:${port}`);
    const ok = new Redis(url);
    expect(await ok.set('k', 'v')).toBe('OK');
    expect(await ok.config('GET', 'protected-mode')).toEqual(['protected-mode', 'yes']);
    expect(await ok.config('GET', 'appendonly')).toEqual(['appendonly', 'yes']);
    ok.disconnect();
  });
});
