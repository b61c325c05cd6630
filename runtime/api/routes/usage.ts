/** GET /v1/usage: the key's team's active, idle and paused time summed over a range, grouped. */
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { ErrorSchema, UsageQuery, UsageReportSchema } from '../../core/api-schemas.ts';
import { SpaceError } from '../../core/errors.ts';
import type { ApiDeps } from '../app.ts';
import { principalOf } from '../auth.ts';

/** Default range of a query without `from` (ms): the last 24 hours. */
const DEFAULT_RANGE_MS = 24 * 3600 * 1000;

export function usageRoutes(deps: ApiDeps): FastifyPluginAsyncTypebox {
  return async (app) => {
    app.get(
      '/v1/usage',
      {
        config: { scope: 'usage:read' },
        schema: {
          summary:
            'The team’s usage in [from, to): seconds, vCPU-seconds and GiB-seconds of active, idle and paused time, grouped by sandbox, API key or template',
          querystring: UsageQuery,
          response: { 200: UsageReportSchema, 400: ErrorSchema, 401: ErrorSchema, 403: ErrorSchema },
        },
      },
      async (req) => {
        const toMs = req.query.to ? Date.parse(req.query.to) : Date.now();
        const fromMs = req.query.from ? Date.parse(req.query.from) : toMs - DEFAULT_RANGE_MS;
        if (Number.isNaN(fromMs) || Number.isNaN(toMs)) {
          throw new SpaceError('BAD_REQUEST', '`from` and `to` must be ISO 8601 times');
        }
        return deps.usage.query({ fromMs, toMs }, req.query.groupBy ?? 'sandbox', principalOf(req).team);
      },
    );
  };
}
