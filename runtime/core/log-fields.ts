import { type DestinationStream, type Logger, type LoggerOptions, pino } from 'pino';

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

/** `url` with the value of any `token` query parameter replaced (session tokens may ride there). */
export function redactUrl(url: string): string {
  return url.replace(/([?&]token=)[^&#]*/gi, '$1[redacted]');
}

/** Request serializer: method, redacted URL, remote address — never headers or bodies. */
function requestSerializer(req: {
  method?: string;
  url?: string;
  ip?: string;
  socket?: { remoteAddress?: string };
}) {
  return {
    method: req.method,
    url: redactUrl(req.url ?? ''),
    remoteAddress: req.ip ?? req.socket?.remoteAddress,
  };
}

/**
 * The root logger of a service: JSON lines on stdout, `service` on every line, tokens and
 * authorization headers redacted. `level` is a pino level (`info`, `debug`, `silent`, …);
 * `destination` (default stdout) lets tests read what a service logs.
 */
export function createLogger(
  service: string,
  level: string,
  extra: LoggerOptions = {},
  destination?: DestinationStream,
): Logger {
  const options: LoggerOptions = {
    level,
    base: { service },
    redact: { paths: REDACT_PATHS, censor: '[redacted]' },
    serializers: { req: requestSerializer, err: pino.stdSerializers.err },
    ...extra,
  };
  return destination ? pino(options, destination) : pino(options);
}

export type { Logger };
