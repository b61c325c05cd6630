import { describe, expect, it } from 'vitest';
import { agentSettings } from '../agent/config.ts';
import { apiSettings, loadApiConfig } from '../api/config.ts';
import { ConfigError, describeConfig, loadConfig } from './config.ts';

describe('loadConfig', () => {
  it('converts, applies defaults and freezes', () => {
    const c = loadApiConfig({
      SPACE_SIGNING_KEY_FILE: '/k.pem',
      SPACE_API_PORT: '9000',
      SPACE_LOG_LEVEL: 'debug',
    });
    expect(c.port).toBe(9000);
    expect(c.logLevel).toBe('debug');
    expect(c.defaultTimeoutSec).toBe(300);
    expect(Object.isFrozen(c)).toBe(true);
  });

  it('reports every problem at once, naming the variable', () => {
    let err: unknown;
    try {
      loadApiConfig({ SPACE_API_PORT: '70000', SPACE_LOG_LEVEL: 'loud', SPACE_WORKER_CONCURRENCY: 'many' });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(ConfigError);
    const problems = (err as ConfigError).problems.join('\n');
    for (const name of [
      'SPACE_SIGNING_KEY_FILE',
      'SPACE_API_PORT',
      'SPACE_LOG_LEVEL',
      'SPACE_WORKER_CONCURRENCY',
    ]) {
      expect(problems).toContain(name);
    }
    expect((err as ConfigError).problems).toHaveLength(4);
  });

  it('documents every setting with an env name in the SPACE_ namespace', () => {
    for (const spec of [apiSettings, agentSettings]) {
      for (const row of describeConfig(spec)) {
        expect(row.env).toMatch(/^SPACE_[A-Z0-9_]+$/);
        expect(row.doc.length).toBeGreaterThan(10);
      }
    }
    expect(() => loadConfig('x', { a: agentSettings.port }, { SPACE_AGENT_PORT: '-1' })).toThrow(ConfigError);
  });
});
