/** The agent serves exactly the data-plane routes `core/data-plane.ts` declares (the router forwards those). */
import fastify from 'fastify';
import { describe, expect, it } from 'vitest';
import { DATA_PLANE_ROUTES } from '../../core/data-plane.ts';
import type { AgentDeps } from '../app.ts';
import { dataPlaneRoutes } from './data-plane.ts';

describe('agent data-plane routes', () => {
  it('match the declared table (method and path)', async () => {
    const app = fastify();
    const routes: string[] = [];
    app.addHook('onRoute', (r) => {
      for (const m of [r.method].flat()) if (m !== 'HEAD') routes.push(`${m} ${r.url}`);
    });
    // registering reads no deps (handlers use them per request)
    await app.register(dataPlaneRoutes({} as AgentDeps));
    await app.ready();
    expect(routes.sort()).toEqual(DATA_PLANE_ROUTES.map((r) => `${r.method} ${r.path}`).sort());
    await app.close();
  });
});
