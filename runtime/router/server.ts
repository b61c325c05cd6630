/** Entry point of the router process: reads config, starts the router, stops on SIGTERM/SIGINT. */
import { ConfigError } from '../core/config.ts';
import { startTracing } from '../core/tracing.ts';
import { loadRouterConfig } from './config.ts';
import { startRouter } from './service.ts';

async function main(): Promise<void> {
  // first, so every span of this process is recorded (no-op unless tracing is configured)
  const tracing = startTracing('space-router');
  const router = await startRouter(loadRouterConfig());
  process.once('SIGTERM', () => void router.close('SIGTERM').finally(() => tracing?.shutdown()));
  process.once('SIGINT', () => void router.close('SIGINT').finally(() => tracing?.shutdown()));
}

main().catch((err: unknown) => {
  if (err instanceof ConfigError) console.error(err.message);
  else console.error('router failed to start:', err);
  process.exit(1);
});
