/** Credential grants live in core (the API validates them exactly as the gateway does); re-exported here. */
export {
  applyFormat,
  type CredentialGrant,
  CredentialGrantSchema,
  describeGrant,
  FORBIDDEN_GRANT_HEADERS,
  type GrantProblem,
  grantsCovering,
  MIN_VALUE_LENGTH,
  mintPlaceholder,
  PLACEHOLDER_PREFIX,
  PLACEHOLDER_RE,
  PLACEHOLDER_SCAN_RE,
  VALUE_MARKER,
  validateGrants,
} from '../core/credentials.ts';
