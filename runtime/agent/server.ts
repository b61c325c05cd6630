/** Entry point of the node agent process: reads config, starts the agent, stops on SIGTERM/SIGINT. */
import { ConfigError } from '../core/config.ts';
import { loadAgentConfig } from './config.ts';
import { startAgent } from './service.ts';

async function main(): Promise<void> {
  const agent = await startAgent(loadAgentConfig());
  process.once('SIGTERM', () => void agent.close('SIGTERM'));
  process.once('SIGINT', () => void agent.close('SIGINT'));
}

main().catch((err: unknown) => {
  if (err instanceof ConfigError) console.error(err.message);
  else console.error('agent failed to start:', err);
  process.exit(1);
});
