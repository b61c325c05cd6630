/** Entry point of the API process: reads config, starts the API, stops on SIGTERM/SIGINT. */
import { ConfigError } from '../core/config.ts';
import { loadApiConfig } from './config.ts';
import { startApi } from './service.ts';

async function main(): Promise<void> {
  const config = loadApiConfig();
  const api = await startApi(config, { bootstrapKeyFile: config.bootstrapKeyFile || undefined });
  process.once('SIGTERM', () => void api.close('SIGTERM'));
  process.once('SIGINT', () => void api.close('SIGINT'));
}

main().catch((err: unknown) => {
  if (err instanceof ConfigError) console.error(err.message);
  else console.error('api failed to start:', err);
  process.exit(1);
});
