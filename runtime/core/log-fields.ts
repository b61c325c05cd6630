import { type Logger, type LoggerOptions, pino } from 'pino';

/** Dotted log field names shared by every service; spelled once here. */
export const F = {
  sandboxId: 'sandbox.id',
  templateId: 'template.id',
  nodeId: 'node.id',
  operationId: 'operation.id',
  sessionId: 'session.id',
  commandId: 'command.id',
  instanceId: 'instance.id',
  durationMs: 'duration.ms',
} as const;

/** Paths pino redacts from every log line: credentials never reach logs. */
export const REDACT_PATHS = [
  'req.headers.authorization',
  'headers.authorization',
  'authorization',
  'token',
  '*.token',
  'apiKey',
  '*.apiKey',
  'env',
  '*.env',
];

/**
 * The root logger of a service: JSON lines on stdout, `service` on every line, tokens and
 * authorization headers redacted. `level` is a pino level (`info`, `debug`, `silent`, …).
 */
export function createLogger(service: string, level: string, extra: LoggerOptions = {}): Logger {
  return pino({
    level,
    base: { service },
    redact: { paths: REDACT_PATHS, censor: '[redacted]' },
    ...extra,
  });
}

export type { Logger };
