/** Prometheus metrics of the router (served at /metrics). */
import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from 'prom-client';

export interface RouterMetrics {
  registry: Registry;
  /** Requests by data-plane route name and final status (status `0`: the response broke midway). */
  requests: Counter<'route' | 'status'>;
  /** Responses being forwarded right now (SSE streams, downloads, any request in flight). */
  activeStreams: Gauge<'route'>;
  /** Resumes a request caused, by outcome (`resumed`, `failed`, `timeout`). */
  resumes: Counter<'outcome'>;
  /** Time a request waited for its paused sandbox to run, s. */
  resumeSeconds: Histogram;
}

/** A fresh registry (one per app, so tests don't share counters); process metrics prefixed `space_router_`. */
export function createRouterMetrics(): RouterMetrics {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix: 'space_router_' });
  return {
    registry,
    requests: new Counter({
      name: 'space_router_requests_total',
      help: 'Data-plane requests by route and status.',
      labelNames: ['route', 'status'],
      registers: [registry],
    }),
    activeStreams: new Gauge({
      name: 'space_router_active_streams',
      help: 'Requests being forwarded now (streams, transfers), by route.',
      labelNames: ['route'],
      registers: [registry],
    }),
    resumes: new Counter({
      name: 'space_router_resumes_total',
      help: 'Resumes of paused sandboxes caused by traffic, by outcome.',
      labelNames: ['outcome'],
      registers: [registry],
    }),
    resumeSeconds: new Histogram({
      name: 'space_router_resume_seconds',
      help: 'Time a request waited for its paused sandbox to run, seconds.',
      buckets: [0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60],
      registers: [registry],
    }),
  };
}
