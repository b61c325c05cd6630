import { describe, expect, it } from 'vitest';
import { agentSettings } from '../runtime/agent/config.ts';
import { parseIntList } from '../runtime/cli/bench.ts';
import { agentPoolSize, defaultTraces } from './suite.ts';

describe('bench suite options', () => {
  it('a started stack keeps SPACE_WARM_POOL_SIZE, else the agent config’s default pool', () => {
    expect(agentPoolSize({ SPACE_WARM_POOL_SIZE: '5' })).toBe(5);
    expect(agentPoolSize({ SPACE_WARM_POOL_SIZE: '0' })).toBe(0);
    expect(agentPoolSize({})).toBe(agentSettings.warmPoolSize.default);
    expect(agentPoolSize({ SPACE_WARM_POOL_SIZE: 'x' })).toBe(agentSettings.warmPoolSize.default);
  });

  it('--concurrency takes a comma list of positive integers', () => {
    expect(parseIntList('--concurrency')('1, 8,32')).toEqual([1, 8, 32]);
    expect(() => parseIntList('--concurrency')('1,0')).toThrow(/positive integers/);
    expect(() => parseIntList('--concurrency')('')).toThrow(/positive integers/);
  });

  it('ships the agent and busy traces', () => {
    expect(Object.keys(defaultTraces())).toEqual(['agent', 'busy']);
  });
});
