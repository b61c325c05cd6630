/** Entry point of the router process: reads config, starts the router, stops on SIGTERM/SIGINT. */
import { ConfigError } from '../core/config.ts';
import { loadRouterConfig } from './config.ts';
import { startRouter } from './service.ts';

async function main(): Promise<void> {
  const router = await startRouter(loadRouterConfig());
  process.once('SIGTERM', () => void router.close('SIGTERM'));
  process.once('SIGINT', () => void router.close('SIGINT'));
}

main().catch((err: unknown) => {
  if (err instanceof ConfigError) console.error(err.message);
  else console.error('router failed to start:', err);
  process.exit(1);
});
