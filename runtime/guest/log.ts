/** JSON-lines logging to stderr: one object per line, short lower-case messages. */

export type LogLevel = 'debug' | 'info' | 'warn' | 'error';

export type Logger = (level: LogLevel, msg: string, fields?: Record<string, unknown>) => void;

/** Writes `{ time, level, msg, ...fields }` as one line to stderr. */
export const log: Logger = (level, msg, fields) => {
  const line = JSON.stringify({ time: new Date().toISOString(), level, svc: 'guest', msg, ...fields });
  process.stderr.write(line + '\n');
};

/** Turns an unknown thrown value into loggable fields. */
export function errorFields(err: unknown): Record<string, unknown> {
  if (err instanceof Error) {
    const code = (err as NodeJS.ErrnoException).code;
    return { err: err.message, ...(code ? { code } : {}) };
  }
  return { err: String(err) };
}
