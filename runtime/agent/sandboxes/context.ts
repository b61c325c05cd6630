/**
 * What every sandbox verb (create.ts, delete.ts, pause.ts, hibernate.ts, resume.ts, watchdog.ts,
 * adopt.ts) works on: the manager's options and its parts. The manager (manager.ts) makes one and
 * hands it to each verb.
 */

import type { InstanceFactory } from '../instances/factory.ts';
import type { WarmSlots } from '../instances/warm-slots.ts';
import type { CrashReporter } from './crash-report.ts';
import type { EgressBinding } from './egress-binding.ts';
import type { SandboxRegistry } from './registry.ts';
import type { StateFiles } from './state-files.ts';
import type { SandboxManagerOptions } from './types.ts';

export interface SandboxContext {
  readonly o: SandboxManagerOptions;
  readonly reg: SandboxRegistry;
  readonly files: StateFiles;
  readonly factory: InstanceFactory;
  readonly slots: WarmSlots;
  readonly egress: EgressBinding;
  /** Where sandboxes that end on their own are reported (set by the watchdog's first pass or the service). */
  onCrash: CrashReporter | null;
  /** The delete verb (joins a delete in flight): verbs that end a sandbox go through it. */
  delete(id: string): Promise<void>;
}
