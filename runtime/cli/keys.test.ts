import { describe, expect, it } from 'vitest';
import { collectQuota, collectScope } from './keys.ts';
import { buildProgram } from './program.ts';

describe('space keys / teams options', () => {
  it('--scope takes known scopes, repeated or comma-separated, once each', () => {
    expect(collectScope('sandboxes:read,sandboxes:write', undefined)).toEqual([
      'sandboxes:read',
      'sandboxes:write',
    ]);
    expect(collectScope('sandboxes:read', ['sandboxes:read'])).toEqual(['sandboxes:read']);
    expect(() => collectScope('root', undefined)).toThrow(/unknown scope "root"/);
  });

  it('--quota takes NAME=N for known quotas', () => {
    expect(collectQuota('sandboxes=3', { vcpus: 4 })).toEqual({ vcpus: 4, sandboxes: 3 });
    expect(() => collectQuota('disk=3', undefined)).toThrow(/--quota takes NAME=N/);
    expect(() => collectQuota('sandboxes=-1', undefined)).toThrow(/--quota/);
  });

  it('registers keys create|ls|revoke|rotate and teams create|ls', () => {
    const program = buildProgram();
    const sub = (name: string) =>
      program.commands.find((c) => c.name() === name)!.commands.map((c) => c.name());
    expect(sub('keys')).toEqual(['create', 'ls', 'revoke', 'rotate']);
    expect(sub('teams')).toEqual(['create', 'ls']);
  });
});
