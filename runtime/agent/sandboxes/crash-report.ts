/**
 * What the node says of a sandbox that ended on its own (core/types.ts EndReport): the kill reason
 * its driver could read from the host, and where the report goes.
 */
import { describeKillReason, type EndReport } from '../../core/types.ts';
import type { InstanceEndCause } from '../drivers/driver.ts';

/**
 * The end report of a sandbox that stopped on its own: `oom` or `pids` when the driver read the
 * exhausted resource from the host's counters, else `crashed`; the message names it. Pure.
 */
export function crashReport(cause: InstanceEndCause | undefined): EndReport {
  switch (cause) {
    case 'memory':
      return { reason: 'oom', message: describeKillReason('oom') };
    case 'processes':
      return { reason: 'pids', message: describeKillReason('pids') };
    case undefined:
      return {
        reason: 'crashed',
        message: 'the sandbox stopped on its own (out of memory or processes, or its kernel failed)',
      };
    default: {
      const never: never = cause;
      return never;
    }
  }
}

/** Reports a sandbox that ended on its own to the control plane (`node:<id>:ended`). */
export type CrashReporter = (id: string, report: EndReport) => Promise<void>;
