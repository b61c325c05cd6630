/** Entry point of the node agent process: reads config, starts the agent, stops on SIGTERM/SIGINT. */
import { ConfigError } from '../core/config.ts';
import { startTracing } from '../core/tracing.ts';
import { loadAgentConfig } from './config.ts';
import { startAgent } from './service.ts';

async function main(): Promise<void> {
  // first, so every span of this process is recorded (no-op unless tracing is configured)
  const tracing = startTracing('space-agent');
  const agent = await startAgent(loadAgentConfig());
  // once: a second signal (tini passing one on beside a direct `pkill`) must not end the process
  // midway through the first one's shutdown, which destroys or hands over its sandboxes
  let closing = false;
  const stop = (signal: 'SIGTERM' | 'SIGINT') => {
    if (closing) return;
    closing = true;
    void agent.close(signal).finally(() => tracing?.shutdown());
  };
  process.on('SIGTERM', () => stop('SIGTERM'));
  process.on('SIGINT', () => stop('SIGINT'));
}

main().catch((err: unknown) => {
  if (err instanceof ConfigError) console.error(err.message);
  else console.error('agent failed to start:', err);
  process.exit(1);
});
