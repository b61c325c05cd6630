/** Entry point of the gateway process: reads config, starts the gateway, stops on SIGTERM/SIGINT. */
import { ConfigError } from '../core/config.ts';
import { loadGatewayConfig } from './config.ts';
import { startGateway } from './service.ts';

async function main(): Promise<void> {
  const gateway = await startGateway(loadGatewayConfig());
  process.once('SIGTERM', () => void gateway.close('SIGTERM'));
  process.once('SIGINT', () => void gateway.close('SIGINT'));
}

main().catch((err: unknown) => {
  if (err instanceof ConfigError) console.error(err.message);
  else console.error('gateway failed to start:', err);
  process.exit(1);
});
