import type { Static } from '@sinclair/typebox';
import type { OperationSchema, SandboxSchema } from './api-schemas.ts';

/**
 * Shared data shapes of the control plane: the sandbox lifecycle as data, operations, nodes.
 * Wire and Redis representations are built from these.
 */

/** Lifecycle states of a sandbox. */
export const SANDBOX_STATES = [
  'creating',
  'running',
  'pausing',
  'paused',
  'resuming',
  'killing',
  'killed',
] as const;
export type SandboxState = (typeof SANDBOX_STATES)[number];

/**
 * Allowed transitions: `from → to[]`. Every state change goes through the Redis transition script
 * with this table, so two racing writers can't both win.
 */
export const TRANSITIONS: Readonly<Record<SandboxState, readonly SandboxState[]>> = {
  creating: ['running', 'killing', 'killed'],
  running: ['pausing', 'killing'],
  pausing: ['paused', 'running', 'killing'],
  paused: ['resuming', 'killing'],
  resuming: ['running', 'paused', 'killing'],
  killing: ['killed'],
  killed: [],
};

/** States from which `to` may be entered (inverse of {@link TRANSITIONS}). */
export function statesLeadingTo(to: SandboxState): SandboxState[] {
  return SANDBOX_STATES.filter((s) => TRANSITIONS[s].includes(to));
}

/** Why a sandbox ended. */
export const KILL_REASONS = [
  'request',
  'timeout',
  'create_failed',
  'crashed',
  'oom',
  'pids',
  'node_lost',
  'node_drained',
  'retention',
] as const;
export type KillReason = (typeof KILL_REASONS)[number];

/**
 * Kill reasons a node reports for a sandbox that ended on its own (not asked to end): `oom` and
 * `pids` when the host's cgroup counters name the exhausted resource, `crashed` otherwise.
 */
export type EndedOnItsOwn = Extract<KillReason, 'crashed' | 'oom' | 'pids'>;

/**
 * What a node says of a sandbox that ended on its own: the value of its `node:<id>:ended` hash
 * field (core/redis-keys.ts), read by the API's reconciler and by a delete that raced the end.
 */
export interface EndReport {
  reason: EndedOnItsOwn;
  /** Human text for `endMessage`. */
  message: string;
}

/** The hash value of an {@link EndReport} (JSON). Pure. */
export function encodeEndReport(report: EndReport): string {
  return JSON.stringify({ reason: report.reason, message: report.message });
}

/**
 * Reads an `ended` hash value. Agents before the `oom`/`pids` reasons wrote the message alone:
 * anything that is not a report with a known reason reads as `crashed` with the value as its
 * message. Pure; never throws.
 */
export function parseEndReport(value: string): EndReport {
  try {
    const v = JSON.parse(value) as Partial<EndReport> | null;
    if (
      v &&
      typeof v.message === 'string' &&
      (v.reason === 'crashed' || v.reason === 'oom' || v.reason === 'pids')
    )
      return { reason: v.reason, message: v.message };
  } catch {
    // a plain message (an older agent)
  }
  return { reason: 'crashed', message: value };
}

/** Human text for a kill reason (what the sandbox record says). */
export function describeKillReason(reason: KillReason): string {
  switch (reason) {
    case 'request':
      return 'deleted by request';
    case 'timeout':
      return 'lifetime (timeoutSec) reached';
    case 'create_failed':
      return 'creation failed';
    case 'crashed':
      return 'the sandbox stopped on its own (its kernel or platform failed)';
    case 'oom':
      return 'the sandbox ran out of memory: it used all of its memoryMiB and the host ended it';
    case 'pids':
      return 'the sandbox ran out of tasks: it reached the host’s task limit and its kernel failed';
    case 'node_lost':
      return 'its node stopped heartbeating';
    case 'node_drained':
      return 'its node was drained';
    case 'retention':
      return 'it stayed paused longer than the paused retention (pausedRetentionSec)';
    default: {
      const never: never = reason;
      return never;
    }
  }
}

/**
 * How a paused sandbox is held: *frozen* keeps its memory on its node (instant resume, capacity
 * still reserved); *hibernated* writes a snapshot to disk and frees the memory and the node's
 * capacity (resume restores the snapshot, on any node that can read it).
 */
export const PAUSE_MODES = ['frozen', 'hibernated'] as const;
export type PauseMode = (typeof PAUSE_MODES)[number];

/**
 * What asked for a pause: a client, the idle timer (`autoPauseSec`), or the end of the running
 * lifetime of a sandbox created with `onTimeout: 'pause'` (its resume restarts the lifetime).
 */
export const PAUSE_REASONS = ['request', 'idle', 'timeout'] as const;
export type PauseReason = (typeof PAUSE_REASONS)[number];

/** What a sandbox's deadline does to it (E2B's `lifecycle.onTimeout`). */
export const ON_TIMEOUT = ['kill', 'pause'] as const;
export type OnTimeout = (typeof ON_TIMEOUT)[number];

/**
 * The public sandbox record (API JSON), as its schema (`SandboxSchema`, core/api-schemas.ts)
 * declares it: the API answers with it and the CLI reads it.
 */
export type Sandbox = Static<typeof SandboxSchema>;

/** Kinds of asynchronous operations. */
export const OPERATION_KINDS = [
  'sandbox.create',
  'sandbox.delete',
  'sandbox.pause',
  'sandbox.resume',
] as const;
export type OperationKind = (typeof OPERATION_KINDS)[number];

export const OPERATION_STATES = ['pending', 'running', 'succeeded', 'failed'] as const;
export type OperationState = (typeof OPERATION_STATES)[number];

/** An operation (API JSON), as its schema (`OperationSchema`, core/api-schemas.ts) declares it. */
export type Operation = Static<typeof OperationSchema>;

/** A node as it registers itself (Redis, API JSON). */
export interface NodeInfo {
  id: string;
  /** Base URL of the agent: internal routes and the data plane. */
  url: string;
  driver: string;
  /** What the node's driver can do (`pause`, `snapshot`, `restore`, …; `kvm` when KVM is usable). */
  capabilities: string[];
  version: string;
  /** Capacity totals. */
  vcpus: number;
  memoryMiB: number;
  maxSandboxes: number;
  /** Currently reserved by placed sandboxes. */
  usedVcpus: number;
  usedMemoryMiB: number;
  sandboxes: number;
  /** Warm slots available per template. */
  warm: Record<string, number>;
  /**
   * Whether the node accepts new sandboxes: its agent says so (no disk pressure, no drain file)
   * and no operator drained it.
   */
  schedulable: boolean;
  /** ISO time an operator drained the node through the control plane (`space nodes drain`), or null. */
  drainRequestedAt: string | null;
  /** ISO time of the last heartbeat. */
  heartbeatAt: string;
  alive: boolean;
  /** Templates built and ready on the node. */
  templates: string[];
  /** Hibernation store the node reads ('' from agents older than pause support). */
  hibernateStore: string;
  /**
   * Agent protocol version the node registered (`AGENT_PROTOCOL_VERSION`); 0 when unknown. A
   * control plane one release newer checks it before using routes the node may not have.
   */
  protocol?: number;
}
