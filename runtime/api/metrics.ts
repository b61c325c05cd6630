/** Prometheus metrics of the API (served at /metrics). */
import { Counter, collectDefaultMetrics, Histogram, Registry } from 'prom-client';

export interface ApiMetrics {
  registry: Registry;
  requests: Counter<'method' | 'route' | 'status'>;
  requestDuration: Histogram<'method' | 'route'>;
  sandboxesCreated: Counter<'template'>;
  /** Creates refused at POST because no node could take them then (after any `roomWaitMs`), by code. */
  createsRefused: Counter<'code'>;
  /** Metered sandbox time closed by this API's reports (paused time; idle/active up to a pause or end). */
  usageSeconds: Counter<'state'>;
  /** Pause and resume operations by kind, mode and result, with their duration. */
  lifecycleDuration: Histogram<'kind' | 'mode' | 'result'>;
}

/** A fresh registry (one per app, so tests don't share counters). */
export function createApiMetrics(): ApiMetrics {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix: 'space_api_' });
  return {
    registry,
    requests: new Counter({
      name: 'space_api_requests_total',
      help: 'HTTP requests by route and status.',
      labelNames: ['method', 'route', 'status'],
      registers: [registry],
    }),
    requestDuration: new Histogram({
      name: 'space_api_request_duration_seconds',
      help: 'HTTP request duration in seconds.',
      labelNames: ['method', 'route'],
      buckets: [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 60],
      registers: [registry],
    }),
    sandboxesCreated: new Counter({
      name: 'space_api_sandboxes_accepted_total',
      help: 'Sandbox creations accepted.',
      labelNames: ['template'],
      registers: [registry],
    }),
    createsRefused: new Counter({
      name: 'space_api_creates_refused_total',
      help: 'Creates refused at admission: no node had room (NODE_CAPACITY_EXHAUSTED) or counted as alive (NODE_UNAVAILABLE).',
      labelNames: ['code'],
      registers: [registry],
    }),
    usageSeconds: new Counter({
      name: 'space_api_usage_seconds_total',
      help: 'Sandbox time closed by this API process, by activity state (agents count the rest).',
      labelNames: ['state'],
      registers: [registry],
    }),
    lifecycleDuration: new Histogram({
      name: 'space_api_pause_resume_duration_seconds',
      help: 'Pause and resume operations (worker time), by kind, mode and result.',
      labelNames: ['kind', 'mode', 'result'],
      buckets: [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
      registers: [registry],
    }),
  };
}
