/**
 * The create's pre-check: before anything is written, refuse a sandbox no node could ever hold,
 * with a code that says why (a template nobody has, a shape too large for every node, a shape no
 * driver of the nodes that hold the template can run). Whether a node has room *now* is judged
 * when the create operation places it (place.lua).
 */
import { isDriverName, shapeProblem } from '../core/drivers.ts';
import { SpaceError } from '../core/errors.ts';
import type { NodeInfo } from '../core/types.ts';
import { knownTemplates, readyTemplates } from './node-store.ts';

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
  const templates = readyTemplates(all);
  if (!templates.has(template)) {
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
      known: [...templates].sort(),
    });
  }
  const nodes = all.filter((n) => n.alive && n.schedulable);
  if (nodes.length > 0 && !nodes.some((n) => n.vcpus >= vcpus && n.memoryMiB >= memoryMiB)) {
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
  const able = nodes.filter((n) => n.templates.includes(template));
  const problems = able.flatMap((n) => {
    const why = isDriverName(n.driver)
      ? shapeProblem(n.driver, { vcpus, memoryMiB })
      : `unknown driver ${n.driver}`;
    return why ? [why] : [];
  });
  if (able.length > 0 && problems.length === able.length) {
    // every node that could hold the template runs a driver that cannot run this shape
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
