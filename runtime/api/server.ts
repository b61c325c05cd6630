/** Entry point of the API process: reads config, starts the API, stops on SIGTERM/SIGINT. */
import { ConfigError } from '../core/config.ts';
import { startTracing } from '../core/tracing.ts';
import { loadApiConfig } from './config.ts';
import { startApi } from './service.ts';

async function main(): Promise<void> {
  // first, so every span of this process is recorded (no-op unless tracing is configured)
  const tracing = startTracing('space-api');
  const config = loadApiConfig();
  const api = await startApi(config, { bootstrapKeyFile: config.bootstrapKeyFile || undefined });
  process.once('SIGTERM', () => void api.close('SIGTERM').finally(() => tracing?.shutdown()));
  process.once('SIGINT', () => void api.close('SIGINT').finally(() => tracing?.shutdown()));
}

main().catch((err: unknown) => {
  if (err instanceof ConfigError) console.error(err.message);
  else console.error('api failed to start:', err);
  process.exit(1);
});
