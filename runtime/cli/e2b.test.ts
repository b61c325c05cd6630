/** `space e2b env`'s variables (pure). */
import { describe, expect, it } from 'vitest';
import { e2bEnv } from './e2b.ts';

describe('e2bEnv', () => {
  it('gives a loopback router the domain localhost:<port>, so getHost(port) needs no DNS', () => {
    expect(e2bEnv('http://127.0.0.1:8080', 'http://127.0.0.1:8082/x', 'e2b_00ff')).toEqual({
      E2B_API_URL: 'http://127.0.0.1:8080',
      E2B_SANDBOX_URL: 'http://127.0.0.1:8082',
      E2B_API_KEY: 'e2b_00ff',
      E2B_DOMAIN: 'localhost:8082',
    });
  });

  it('gives a deployed router no domain unless told one; a key not shaped e2b_<hex> turns the 2.45 check off', () => {
    const env = e2bEnv('https://api.example.com', 'https://router.example.com', 'sk_1');
    expect(env.E2B_DOMAIN).toBeUndefined();
    expect(env.E2B_VALIDATE_API_KEY).toBe('false');
    expect(e2bEnv('https://a', 'https://router.example.com', 'k', 'sandboxes.example.com').E2B_DOMAIN).toBe(
      'sandboxes.example.com',
    );
  });
});
