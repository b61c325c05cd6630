/**
 * Egress policy for the gateway: the shape, schema, normalisation and matching live in
 * `runtime/core/egress.ts` (shared with the API and the agent); this module is the gateway's one
 * import point for them, so the proxies never reach into core for policy logic directly.
 * Credential grants are `credentials.ts`.
 */
export type { EgressMode, EgressPolicy, EgressPolicyInput, NameDecision } from '../core/egress.ts';
export {
  decideName,
  EGRESS_MODES,
  EgressPolicySchema,
  findMatch,
  MAX_LABEL_BYTES,
  MAX_NAME_BYTES,
  matchesPattern,
  normaliseName,
  normalisePattern,
  normalisePolicy,
} from '../core/egress.ts';
