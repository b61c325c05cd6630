import { describe, expect, it } from 'vitest';
import { parseVmConfigPolicy, type VmServicePolicy, vmServiceDocument, vmServiceEnv } from './vm-config.ts';

const policy: VmServicePolicy = {
  service: 'space-agent@default',
  file: '/etc/space/space-agent.env',
  unit: 'space-agent',
  tunable: ['SPACE_LOG_LEVEL', 'SPACE_WARM_POOL_SIZE'],
  pinned: { SPACE_DRIVER: 'gvisor', SPACE_VERIFY_KEY_FILE: '/etc/space/keys/verify.pem' },
};

describe('a VM service’s configuration document', () => {
  it('renders the env file from the tunable settings plus every pinned one, sorted', () => {
    const r = vmServiceEnv(policy, vmServiceDocument({ SPACE_WARM_POOL_SIZE: '4', SPACE_DRIVER: 'gvisor' }));
    expect(r).toEqual({
      ok: true,
      env: 'SPACE_DRIVER=gvisor\nSPACE_VERIFY_KEY_FILE=/etc/space/keys/verify.pem\nSPACE_WARM_POOL_SIZE=4\n',
    });
  });

  it.each([
    [
      'a loader variable',
      { NODE_OPTIONS: '--require /tmp/x.js' },
      /"NODE_OPTIONS": not a setting of space-agent@default/,
    ],
    ['a linker variable', { LD_PRELOAD: '/tmp/x.so' }, /"LD_PRELOAD": not a setting/],
    ['an unknown name', { SPACE_NO_SUCH: '1' }, /"SPACE_NO_SUCH": not a setting/],
    ['a newline in a value', { SPACE_LOG_LEVEL: 'info\nNODE_OPTIONS=x' }, /control character/],
    ['a pinned setting changed', { SPACE_DRIVER: 'qemu' }, /"SPACE_DRIVER": set by the deployment/],
    ['a number', { SPACE_WARM_POOL_SIZE: 4 }, /not a string/],
    ['a value too long', { SPACE_LOG_LEVEL: 'x'.repeat(8193) }, /longer than 8192/],
  ])('refuses %s, and the whole document with it', (_what, doc, problem) => {
    const r = vmServiceEnv(policy, JSON.stringify({ SPACE_WARM_POOL_SIZE: '4', ...doc }));
    expect(r.ok).toBe(false);
    expect(r.ok ? [] : r.problems).toEqual([expect.stringMatching(problem)]);
  });

  it('OpenTelemetry variables reach a service that traces (tracing switched on by pulumi up), and no other', () => {
    const doc = vmServiceDocument({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://10.0.0.5:4318' });
    expect(vmServiceEnv({ ...policy, otel: true }, doc)).toMatchObject({ ok: true });
    expect(vmServiceEnv(policy, doc)).toMatchObject({ ok: false });
    // the pattern admits OTEL_* names only: not a prefix trick
    expect(
      vmServiceEnv({ ...policy, otel: true }, vmServiceDocument({ OTEL: 'x', XOTEL_A: 'y' })),
    ).toMatchObject({
      ok: false,
    });
    // an OTEL_ name longer than an env file's names may be is refused, not thrown on
    expect(
      vmServiceEnv({ ...policy, otel: true }, vmServiceDocument({ [`OTEL_${'A'.repeat(130)}`]: 'x' })),
    ).toMatchObject({ ok: false });
  });

  it('refuses what is not a JSON object (an env file, an array, null)', () => {
    for (const text of ['SPACE_LOG_LEVEL=debug\n', '["SPACE_LOG_LEVEL=debug"]', '[]', 'null', '"x"'])
      expect(vmServiceEnv(policy, text).ok, text).toBe(false);
  });

  it('a policy that is not one is refused, naming where', () => {
    expect(() => parseVmConfigPolicy('{')).toThrow(/not JSON/);
    expect(() =>
      parseVmConfigPolicy(JSON.stringify({ services: [{ ...policy, file: '/etc/passwd' }] })),
    ).toThrow(/services\/0\/file/);
    expect(parseVmConfigPolicy(JSON.stringify({ services: [policy] }))).toEqual({ services: [policy] });
  });

  it('stores the same settings as the same bytes', () => {
    expect(vmServiceDocument({ B: '2', A: '1' })).toBe(vmServiceDocument({ A: '1', B: '2' }));
  });
});
