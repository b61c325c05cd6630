/**
 * A stack ({@link startStack}) with its router as its own process, and the published `e2b` and
 * `@e2b/code-interpreter` SDKs pointed at both as a migrating user points them: `E2B_API_URL`,
 * `E2B_API_KEY`, `E2B_SANDBOX_URL` and `E2B_DOMAIN` (`localhost:<router port>`, so `getHost(port)`
 * names `<port>-<id>.localhost:<router port>`) in `process.env`, nothing passed in code.
 */
import { join } from 'node:path';
import { freePort } from './redis-server.ts';
import { type RouterProcess, startRouterProcess } from './router-process.ts';
import { type Stack, startStack } from './stack.ts';

/** What {@link startE2bStack} started. */
export interface E2bStack {
  s: Stack;
  router: RouterProcess;
  /** Puts `process.env` back as it was and stops the router; the stack stays for the caller. */
  stopRouter(): Promise<void>;
}

/** Starts the stack with `env` (plus its router's URL), the router, and sets the E2B_* variables. */
export async function startE2bStack(env: Record<string, string> = {}): Promise<E2bStack> {
  const saved = { ...process.env };
  const port = await freePort();
  const s = await startStack({ ...env, SPACE_ROUTER_URL: `http://127.0.0.1:${port}` });
  const router = await startRouterProcess({
    SPACE_REDIS_URL: s.redisUrl,
    SPACE_VERIFY_KEY_FILE: join(s.dir, 'key.pub.pem'),
    SPACE_ROUTER_PORT: String(port),
  });
  process.env.E2B_API_URL = s.apiUrl;
  process.env.E2B_API_KEY = s.apiKey;
  process.env.E2B_SANDBOX_URL = router.url;
  process.env.E2B_DOMAIN = `localhost:${port}`;
  return {
    s,
    router,
    stopRouter: async () => {
      process.env = saved;
      await router.stop();
    },
  };
}
