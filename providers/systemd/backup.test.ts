/**
 * The control VM's backup units as rendered, read by this host's systemd (`systemd-analyze
 * verify`): the timer and the oneshot service parse without a complaint (but for podman, which
 * this test host does not have), the timer names the service it starts, and a control VM without
 * `backup` gets none of it.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { controlPlan } from './cloud-init.ts';

const args = {
  version: '0.1.0',
  imageRepository: 'registry.example/space',
  privateCidr: '10.10.0.0/24',
  redisPassword: 'redis-pw-Ab3.9_x~Q7',
  routerUrl: 'https://router.example.com',
};
const backup = {
  schedule: '30 */6 * * 1,4',
  bucket: 'space-backups',
  region: 'us-ord',
  prefix: 'space-backups/',
  deployment: 'prod',
  keepLast: 7,
  keepDays: 0,
  accessKeyId: 'AKIDEXAMPLE',
  secretAccessKey: 'backup-secret-0f3a',
};
const dir = mkdtempSync(join(tmpdir(), 'space-backup-units-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('the control VM’s backup timer and service', () => {
  it('parse under systemd, and the timer starts the service on the schedule', () => {
    const plan = controlPlan({ ...args, backup });
    const units = plan.files.filter((f) => /\/space-backup\.(service|timer)$/.test(f.path));
    expect(units.map((u) => u.path).sort()).toEqual([
      '/etc/systemd/system/space-backup.service',
      '/etc/systemd/system/space-backup.timer',
    ]);
    const paths = units.map((u) => {
      const p = join(dir, u.path.split('/').at(-1)!);
      writeFileSync(p, u.content);
      return p;
    });
    const r = spawnSync('systemd-analyze', ['verify', ...paths], { encoding: 'utf8' });
    const complaints = `${r.stdout}${r.stderr}`
      .split('\n')
      .filter((l) => l.trim() && !/\/usr\/bin\/podman is not executable/.test(l));
    expect(complaints).toEqual([]);
    const timer = units.find((u) => u.path.endsWith('.timer'))!.content;
    expect(timer).toContain('OnCalendar=Mon,Thu *-*-* 00/6:30:00 UTC');
    const next = spawnSync('systemd-analyze', ['calendar', 'Mon,Thu *-*-* 00/6:30:00 UTC'], {
      encoding: 'utf8',
    });
    expect(next.stdout).toMatch(/Next elapse: (Mon|Thu) \S+ (00|06|12|18):30:00 UTC/);
    expect(plan.commands).toContain('systemctl enable --now space-backup.timer');
    const env = plan.files.find((f) => f.path === '/etc/space/space-backup.env')!;
    expect(env.mode).toBe('0600');
    expect(env.content).toContain('SPACE_BACKUP_S3_SECRET_ACCESS_KEY=backup-secret-0f3a\n');
  });

  it('without backup the control VM has no backup file or command', () => {
    const plan = controlPlan(args);
    expect(plan.files.filter((f) => f.path.includes('backup'))).toEqual([]);
    expect(plan.commands.join('\n')).not.toContain('backup');
  });
});
