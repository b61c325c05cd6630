/**
 * Placement, described once. {@link PLACEMENT_RULES} is the rule a node must meet to take a sandbox
 * (alive, schedulable, holds the template, reads the hibernation store asked for, runs a driver
 * that can run the shape, has room for its vCPUs, memory and one more sandbox), as data. Two
 * places judge by it: the create's pre-check here ({@link precheckPlacement}: could any node ever
 * take it? — room judged on an empty node), before anything is written; and the Lua placement
 * (placement-lib.lua, run by admit.lua when a create is admitted and by place.lua when a
 * hibernated sandbox resumes), which receives the same rules as JSON and picks a node that takes it
 * *now* (room judged on what the node holds), reserving its share in the same step — a create no
 * node has room for is refused at admission ({@link roomError}). placement.test.ts runs the same
 * cases through {@link nodeTakes} and place.lua and compares.
 */
import { acceptingDrivers, isDriverName, shapeProblem } from '../core/drivers.ts';
import { SpaceError } from '../core/errors.ts';
import type { NodeInfo } from '../core/types.ts';
import { knownTemplates, readyTemplates } from './node-store.ts';

/**
 * A node as placement judges it. Field names are those of the node's Redis hash (`node:<id>`,
 * runtime/core/REDIS.md), which place.lua reads; `alive` is its heartbeat key, `heldMemoryMiB` the
 * memory its warm slots hold (less one slot's share when this sandbox would claim one).
 */
export interface NodeView {
  alive: boolean;
  schedulable: boolean;
  /** Templates built on the node. */
  templates: readonly string[];
  driver: string;
  /** Hibernation store the node reads ('' for none). */
  hibernateStore: string;
  /** Capacity and what placed sandboxes reserve: vCPUs in milli-vCPU, memory in MiB. */
  vcpusMilli: number;
  usedVcpusMilli: number;
  memoryMiB: number;
  usedMemoryMiB: number;
  heldMemoryMiB: number;
  maxSandboxes: number;
  sandboxes: number;
}

/** What a sandbox asks of a node, as placement judges it (vCPUs in milli-vCPU, memory in MiB). */
export interface AskView {
  template: string;
  /** Drivers that can run the shape (core/drivers.ts `acceptingDrivers`). */
  drivers: readonly string[];
  /** Hibernation store the node must read ('' = any). */
  store: string;
  vcpusMilli: number;
  memoryMiB: number;
  /** Always 1: the one sandbox slot a placement takes. */
  one: 1;
}

/**
 * One condition on a node. `flag`: `field` is true. `has`: the node's list `field` holds the ask's
 * `ask`. `in`: the ask's list `ask` holds the node's `field`. `matches`: the ask's `ask` is '' or
 * equals the node's `field`. `room`: the node's `used` fields plus the ask's `ask` fit within its
 * `total` (on an empty node, for the pre-check, `used` counts 0).
 */
export type PlacementRule =
  | { name: string; kind: 'flag'; field: 'alive' | 'schedulable' }
  | { name: string; kind: 'has'; field: 'templates'; ask: 'template' }
  | { name: string; kind: 'in'; field: 'driver'; ask: 'drivers' }
  | { name: string; kind: 'matches'; field: 'hibernateStore'; ask: 'store' }
  | {
      name: string;
      kind: 'room';
      total: 'vcpusMilli' | 'memoryMiB' | 'maxSandboxes';
      used: readonly ('usedVcpusMilli' | 'usedMemoryMiB' | 'heldMemoryMiB' | 'sandboxes')[];
      ask: 'vcpusMilli' | 'memoryMiB' | 'one';
    };

/** The placement rule: a node takes a sandbox when every one of these holds. */
export const PLACEMENT_RULES = [
  { name: 'alive', kind: 'flag', field: 'alive' },
  { name: 'schedulable', kind: 'flag', field: 'schedulable' },
  { name: 'template', kind: 'has', field: 'templates', ask: 'template' },
  { name: 'store', kind: 'matches', field: 'hibernateStore', ask: 'store' },
  { name: 'driver', kind: 'in', field: 'driver', ask: 'drivers' },
  { name: 'vcpus', kind: 'room', total: 'vcpusMilli', used: ['usedVcpusMilli'], ask: 'vcpusMilli' },
  {
    name: 'memory',
    kind: 'room',
    total: 'memoryMiB',
    used: ['usedMemoryMiB', 'heldMemoryMiB'],
    ask: 'memoryMiB',
  },
  { name: 'sandboxes', kind: 'room', total: 'maxSandboxes', used: ['sandboxes'], ask: 'one' },
] as const satisfies readonly PlacementRule[];

/** Names of the rules in {@link PLACEMENT_RULES}. */
export type PlacementRuleName = (typeof PLACEMENT_RULES)[number]['name'];

/** The rules as place.lua receives them (ARGV, JSON). */
export const PLACEMENT_RULES_JSON = JSON.stringify(PLACEMENT_RULES);

/** Whether `rule` holds for node `v` and ask `a`; with `empty`, room is judged on an empty node. Pure. */
function holds(rule: PlacementRule, v: NodeView, a: AskView, empty: boolean): boolean {
  switch (rule.kind) {
    case 'flag':
      return v[rule.field];
    case 'has':
      return v[rule.field].includes(a[rule.ask]);
    case 'in':
      return a[rule.ask].includes(v[rule.field]);
    case 'matches':
      return a[rule.ask] === '' || v[rule.field] === a[rule.ask];
    case 'room': {
      const used = empty ? 0 : rule.used.reduce((sum, f) => sum + v[f], 0);
      return used + a[rule.ask] <= v[rule.total];
    }
  }
}

/**
 * Whether node `v` takes ask `a` now under the rules named `only` (default: all of
 * {@link PLACEMENT_RULES}); with `empty`, room is judged as if the node held nothing. Pure.
 */
export function nodeTakes(
  v: NodeView,
  a: AskView,
  opts: { only?: readonly PlacementRuleName[]; empty?: boolean } = {},
): boolean {
  const judged = opts.only ?? PLACEMENT_RULES.map((r) => r.name);
  return PLACEMENT_RULES.every((r) => !judged.includes(r.name) || holds(r, v, a, opts.empty ?? false));
}

/** A node's view from its registration (warm-slot memory is not part of `NodeInfo`: 0). Pure. */
export function nodeView(n: NodeInfo): NodeView {
  return {
    alive: n.alive,
    schedulable: n.schedulable,
    templates: n.templates,
    driver: n.driver,
    hibernateStore: n.hibernateStore,
    vcpusMilli: Math.round(n.vcpus * 1000),
    usedVcpusMilli: Math.round(n.usedVcpus * 1000),
    memoryMiB: n.memoryMiB,
    usedMemoryMiB: n.usedMemoryMiB,
    heldMemoryMiB: 0,
    maxSandboxes: n.maxSandboxes,
    sandboxes: n.sandboxes,
  };
}

/** What a create asks (template, vCPUs, memory in MiB; `store` for a hibernated resume). Pure. */
export function askView(ask: PlacementAsk, store = ''): AskView {
  return {
    template: ask.template,
    drivers: acceptingDrivers(ask),
    store,
    vcpusMilli: Math.round(ask.vcpus * 1000),
    memoryMiB: ask.memoryMiB,
    one: 1,
  };
}

/** What a create asks of a node: a template and a shape (vCPUs, memory in MiB). */
export interface PlacementAsk {
  template: string;
  vcpus: number;
  memoryMiB: number;
}

/**
 * Refuses `ask` when no node in `all` (every registered node, alive or not) could ever hold it.
 * Pure.
 * @throws SpaceError TEMPLATE_NOT_READY (some node holds the template, none alive does),
 *   NODE_UNAVAILABLE (no node heartbeats), TEMPLATE_NOT_FOUND (no node holds it), SHAPE_TOO_LARGE
 *   (no alive schedulable node is that large even when empty; R25), SHAPE_UNSUPPORTED (every such
 *   node holding the template runs a driver that cannot run the shape; rules in core/drivers.ts).
 */
export function precheckPlacement(all: readonly NodeInfo[], ask: PlacementAsk): void {
  const { template, vcpus, memoryMiB } = ask;
  const want = askView(ask);
  const served = all.some((n) => nodeTakes(nodeView(n), want, { only: ['alive', 'template'] }));
  if (!served) {
    // transient states get retryable codes: a template some node holds but no live node serves
    // now is not ready; with no live node at all, nothing can be said about it
    if (knownTemplates(all).has(template)) {
      throw new SpaceError('TEMPLATE_NOT_READY', `template "${template}" has no live node right now`, {
        template,
      });
    }
    if (!all.some((n) => n.alive)) {
      throw new SpaceError('NODE_UNAVAILABLE', 'no node is heartbeating right now', { template });
    }
    throw new SpaceError('TEMPLATE_NOT_FOUND', `no template "${template}" on any available node`, {
      template,
      known: [...readyTemplates(all)].sort(),
    });
  }
  const nodes = all.filter((n) => nodeTakes(nodeView(n), want, { only: ['alive', 'schedulable'] }));
  const ever = (n: NodeInfo) => nodeTakes(nodeView(n), want, { only: ['vcpus', 'memory'], empty: true });
  if (nodes.length > 0 && !nodes.some(ever)) {
    // no node could ever hold it, however empty: a 4xx that names what is on offer, not a
    // retryable 503 (R25); a shape some node holds but not now stays NODE_CAPACITY_EXHAUSTED
    const largest = largestShapes(nodes);
    const offer = largest.map((n) => `${n.vcpus} vCPU / ${n.memoryMiB} MiB`).join(', ');
    throw new SpaceError(
      'SHAPE_TOO_LARGE',
      `no node is large enough for ${vcpus} vCPU / ${memoryMiB} MiB; the largest on offer: ${offer}`,
      { vcpus, memoryMiB, largest },
    );
  }
  const able = nodes.filter((n) => nodeTakes(nodeView(n), want, { only: ['template'] }));
  if (able.length > 0 && !able.some((n) => nodeTakes(nodeView(n), want, { only: ['driver'] }))) {
    // every node that could hold the template runs a driver that cannot run this shape
    const problems = able.flatMap((n) => {
      const why = isDriverName(n.driver)
        ? shapeProblem(n.driver, { vcpus, memoryMiB })
        : `unknown driver ${n.driver}`;
      return why ? [why] : [];
    });
    throw new SpaceError('SHAPE_UNSUPPORTED', [...new Set(problems)].join('; '), {
      vcpus,
      memoryMiB,
      drivers: [...new Set(able.map((n) => n.driver))].sort(),
    });
  }
}

/**
 * The largest sandbox shapes `nodes` offer: each node's whole vCPUs and memory (MiB), keeping only
 * those no other node beats on both (a node with the most memory may have fewer vCPUs than another),
 * largest memory first. Pure.
 */
export function largestShapes(
  nodes: readonly { vcpus: number; memoryMiB: number }[],
): { vcpus: number; memoryMiB: number }[] {
  const shapes = [...new Map(nodes.map((n) => [`${n.vcpus}/${n.memoryMiB}`, n])).values()].map((n) => ({
    vcpus: n.vcpus,
    memoryMiB: n.memoryMiB,
  }));
  return shapes
    .filter(
      (a) =>
        !shapes.some(
          (b) =>
            b !== a &&
            b.vcpus >= a.vcpus &&
            b.memoryMiB >= a.memoryMiB &&
            (b.vcpus > a.vcpus || b.memoryMiB > a.memoryMiB),
        ),
    )
    .sort((a, b) => b.memoryMiB - a.memoryMiB || b.vcpus - a.vcpus);
}

/**
 * Seconds a client refused for want of room (or of a live node) is told to wait before it asks
 * again (`Retry-After`, RFC 9110 §10.2.3): about how long a sandbox takes to be deleted and its
 * room returned, or a node's heartbeat to come back.
 */
export const ROOM_RETRY_AFTER_SEC = 2;

/**
 * The error of a create no node can take now (admit.lua's or place.lua's `reason`): `no_nodes`
 * (none counts as alive) is NODE_UNAVAILABLE, anything else (`full`) NODE_CAPACITY_EXHAUSTED; both
 * retryable, with `details.retryAfterSec` ({@link ROOM_RETRY_AFTER_SEC}, sent as `Retry-After`). Pure.
 */
export function roomError(reason: string, details: Record<string, unknown> = {}): SpaceError {
  const more = { ...details, retryAfterSec: ROOM_RETRY_AFTER_SEC };
  return reason === 'no_nodes'
    ? new SpaceError('NODE_UNAVAILABLE', 'no node is available right now', more)
    : new SpaceError('NODE_CAPACITY_EXHAUSTED', 'no node has room for this sandbox right now', more);
}
