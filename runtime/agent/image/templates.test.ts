/**
 * What a node can serve at start: a deployed node (SPACE_BUILD_TEMPLATES=warm) builds its warm
 * templates itself, since nobody can run `space template build` on it (no SSH). Before this, every
 * create on a fresh deployment answered TEMPLATE_NOT_READY.
 */
import { describe, expect, it } from 'vitest';
import { agentSettings } from '../config.ts';
import { ensureTemplates } from './templates.ts';

function fakeNode(built: string[], failing: string[] = []) {
  const have = new Set(built);
  const calls: string[] = [];
  const warned: string[] = [];
  return {
    calls,
    warned,
    deps: (toBuild: string[]) => ({
      resolve: async (t: string) => {
        if (!have.has(t)) throw new Error('TEMPLATE_NOT_READY');
      },
      build: async (t: string) => {
        calls.push(t);
        if (failing.includes(t)) throw new Error('debootstrap failed');
        have.add(t);
      },
      toBuild: new Set(toBuild),
      warn: (t: string, m: string) => warned.push(`${t}: ${m}`),
    }),
  };
}

describe('templates at agent start', () => {
  it('fresh-node-builds-warm: a missing warm template is built and served; others are only reported', async () => {
    const n = fakeNode([]);
    expect(await ensureTemplates(['base', 'python'], n.deps(['base']))).toEqual(['base']);
    expect(n.calls).toEqual(['base']);
    expect(n.warned).toEqual([
      'python: template not built on this node; build it with `space template build`',
    ]);
  });

  it('a template built already is not built again; a failed build leaves it not ready and the agent up', async () => {
    const n = fakeNode(['base'], ['python']);
    expect(await ensureTemplates(['base', 'python'], n.deps(['base', 'python']))).toEqual(['base']);
    expect(n.calls).toEqual(['python']);
    expect(n.warned).toEqual(['python: template build failed']);
  });

  it('off by default (the local stack builds templates itself); deployments turn it on', async () => {
    expect(agentSettings.buildTemplates.default).toBe('off');
    const { agentEnvironment } = await import('../../../providers/runtime-settings.ts');
    const pool = {
      name: 'default',
      driver: 'gvisor' as const,
      instanceType: 'x',
      count: 1,
      labels: {},
      allowUnverifiedKvm: false,
    };
    expect(agentEnvironment(pool)['SPACE_BUILD_TEMPLATES']).toBe('warm');
  });
});
