import type { LogFn } from 'pino';

/** The request's logger (Fastify's or pino's), as far as a use case needs it. */
export interface UseCaseLog {
  info: LogFn;
}
