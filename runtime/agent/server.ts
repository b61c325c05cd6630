/** Entry point of the node agent process: reads config, starts the agent, stops on SIGTERM/SIGINT. */
import { ConfigError } from '../core/config.ts';
import { startTracing } from '../core/tracing.ts';
import { loadAgentConfig } from './config.ts';
import { startAgent } from './service.ts';

async function main(): Promise<void> {
  // first, so every span of this process is recorded (no-op unless tracing is configured)
  const tracing = startTracing('space-agent');
  const agent = await startAgent(loadAgentConfig());
  process.once('SIGTERM', () => void agent.close('SIGTERM').finally(() => tracing?.shutdown()));
  process.once('SIGINT', () => void agent.close('SIGINT').finally(() => tracing?.shutdown()));
}

main().catch((err: unknown) => {
  if (err instanceof ConfigError) console.error(err.message);
  else console.error('agent failed to start:', err);
  process.exit(1);
});
