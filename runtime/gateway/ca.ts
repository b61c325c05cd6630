/**
 * The per-deployment CA the gateway uses to terminate TLS for credential hosts (DESIGN.md,
 * "Credentials"). Templates trust its certificate; only the gateway holds its key.
 *
 * - ECDSA P-256 (not Ed25519: browsers and several TLS stacks still refuse Ed25519 certificates),
 *   10-year validity, `basicConstraints` CA with path length 0 (it signs leaves, never other CAs).
 * - Leaves are minted per SNI on demand: SAN = that one name, `serverAuth` only, 24 h validity
 *   (back-dated 1 h for guest clock skew), a fresh P-256 key each, cached in a bounded LRU with a
 *   ready `tls.SecureContext`, re-minted when under a quarter of their life is left.
 *
 * X.509 encoding uses pkijs (PeculiarVentures; with its peer asn1js). Why not node-forge: forge can
 * only sign certificates with RSA. Why not @peculiar/x509: it needs a global `reflect-metadata`
 * polyfill (tsyringe) just to load. Keys and signatures come from Node's own crypto (WebCrypto).
 */
import { createHash, createPrivateKey, generateKeyPair, type KeyObject, X509Certificate } from 'node:crypto';
import { mkdir, open, readFile, rename, stat, unlink } from 'node:fs/promises';
import { dirname } from 'node:path';
import tls from 'node:tls';
import { promisify } from 'node:util';
import * as asn1js from 'asn1js';
import * as pkijs from 'pkijs';
import { normaliseName } from '../core/egress.ts';

const generateKeyPairAsync = promisify(generateKeyPair);

/** CA certificate lifetime: long, because rotating it means rebuilding every template. */
export const CA_VALIDITY_MS = 10 * 365 * 24 * 3600 * 1000;
/** Default leaf lifetime: short, so a leaked leaf key is worth little. */
export const LEAF_TTL_MS = 24 * 3600 * 1000;
/** Leaves start this far in the past: a guest whose clock lags still accepts them. */
export const LEAF_BACKDATE_MS = 3600 * 1000;
/** Default number of cached leaves (one per credential host name in use on the node). */
export const MAX_CACHED_LEAVES = 1024;

const ECDSA_P256 = { name: 'ECDSA', namedCurve: 'P-256' } as const;
const OID = {
  commonName: '2.5.4.3',
  serverAuth: '1.3.6.1.5.5.7.3.1',
} as const;

/** A leaf certificate for one SNI, ready to serve. */
export interface Leaf {
  readonly name: string;
  readonly certPem: string;
  readonly keyPem: string;
  /** `cert` + `key` of this leaf, TLS 1.2 minimum. */
  readonly context: tls.SecureContext;
  readonly notAfter: Date;
}

/** The deployment CA as the interceptor sees it. */
export interface DeploymentCa {
  /** PEM of the CA certificate (what templates install as trusted). */
  readonly certPem: string;
  /** A leaf for canonical host name `sni` (cached); rejects a name that is not a valid DNS name. */
  leafFor(sni: string): Promise<Leaf>;
}

/** Tunables, mostly for tests. */
export interface CaOptions {
  /** Leaf lifetime, ms (default {@link LEAF_TTL_MS}). */
  leafTtlMs?: number;
  /** Cached leaves at most (default {@link MAX_CACHED_LEAVES}); the least recently used goes first. */
  maxLeaves?: number;
  /** Clock, ms since the epoch. */
  now?: () => number;
}

function toPem(label: string, der: ArrayBuffer | Uint8Array): string {
  const b64 = Buffer.from(der instanceof Uint8Array ? der : new Uint8Array(der)).toString('base64');
  return `-----BEGIN ${label}-----\n${b64.replace(/.{64}/g, '$&\n').replace(/\n?$/, '\n')}-----END ${label}-----\n`;
}

function rdn(entries: [oid: string, value: string][]): pkijs.RelativeDistinguishedNames {
  return new pkijs.RelativeDistinguishedNames({
    typesAndValues: entries.map(
      ([type, value]) => new pkijs.AttributeTypeAndValue({ type, value: new asn1js.Utf8String({ value }) }),
    ),
  });
}

function time(date: Date): pkijs.Time {
  // RFC 5280 §4.1.2.5: UTCTime through 2049, GeneralizedTime from 2050
  const type = date.getUTCFullYear() < 2050 ? pkijs.TimeType.UTCTime : pkijs.TimeType.GeneralizedTime;
  return new pkijs.Time({ type, value: date });
}

function extension(extnID: string, critical: boolean, value: { toBER(sizeOnly?: boolean): ArrayBuffer }) {
  return new pkijs.Extension({ extnID, critical, extnValue: value.toBER(false) });
}

/** KeyUsage bits (RFC 5280 §4.2.1.3), DER: trailing zero bits counted as unused. */
function keyUsage(bits: number): asn1js.BitString {
  let unused = 0;
  while (unused < 7 && (bits & (1 << unused)) === 0) unused++;
  return new asn1js.BitString({ valueHex: new Uint8Array([bits]), unusedBits: unused });
}
const KU_DIGITAL_SIGNATURE = 0x80;
const KU_KEY_CERT_SIGN = 0x04;
const KU_CRL_SIGN = 0x02;

/** SHA-1 of the subjectPublicKey bits: the RFC 5280 §4.2.1.2 method (1) key identifier. */
function keyId(spkiDer: Buffer): Uint8Array {
  const info = pkijs.PublicKeyInfo.fromBER(spkiDer);
  return createHash('sha1').update(info.subjectPublicKey.valueBlock.valueHexView).digest();
}

function spkiOf(key: KeyObject): Buffer {
  return key.export({ type: 'spki', format: 'der' });
}

function serialNumber(): asn1js.Integer {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  bytes[0] = (bytes[0]! & 0x7f) | 0x01; // positive, and never a leading zero byte
  return new asn1js.Integer({ valueHex: bytes });
}

interface CertSpec {
  subject: pkijs.RelativeDistinguishedNames;
  issuer: pkijs.RelativeDistinguishedNames;
  notBefore: Date;
  notAfter: Date;
  publicKey: KeyObject;
  signingKey: KeyObject;
  extensions: pkijs.Extension[];
}

async function signCertificate(spec: CertSpec): Promise<string> {
  const cert = new pkijs.Certificate({
    version: 2,
    serialNumber: serialNumber(),
    issuer: spec.issuer,
    subject: spec.subject,
    notBefore: time(spec.notBefore),
    notAfter: time(spec.notAfter),
    subjectPublicKeyInfo: pkijs.PublicKeyInfo.fromBER(spkiOf(spec.publicKey)),
    extensions: spec.extensions,
  });
  await cert.sign(spec.signingKey.toCryptoKey(ECDSA_P256, false, ['sign']), 'SHA-256');
  return toPem('CERTIFICATE', cert.toSchema(true).toBER(false));
}

async function newP256(): Promise<{ publicKey: KeyObject; privateKey: KeyObject }> {
  return generateKeyPairAsync('ec', { namedCurve: 'P-256' });
}

function isP256(key: KeyObject): boolean {
  return key.asymmetricKeyType === 'ec' && key.asymmetricKeyDetails?.namedCurve === 'prime256v1';
}

/** A new self-signed deployment CA (PEMs); the subject carries a random id so deployments differ. */
export async function generateCaPem(now: number = Date.now()): Promise<{ certPem: string; keyPem: string }> {
  const { publicKey, privateKey } = await newP256();
  const id = Buffer.from(crypto.getRandomValues(new Uint8Array(6))).toString('hex');
  // one attribute: pkijs would put several into a single multi-valued RDN
  const name = rdn([[OID.commonName, `SPACE deployment CA ${id}`]]);
  const ski = keyId(spkiOf(publicKey));
  const certPem = await signCertificate({
    subject: name,
    issuer: name,
    notBefore: new Date(now - LEAF_BACKDATE_MS),
    notAfter: new Date(now + CA_VALIDITY_MS),
    publicKey,
    signingKey: privateKey,
    extensions: [
      extension('2.5.29.19', true, new pkijs.BasicConstraints({ cA: true, pathLenConstraint: 0 }).toSchema()),
      extension('2.5.29.15', true, keyUsage(KU_KEY_CERT_SIGN | KU_CRL_SIGN)),
      extension('2.5.29.14', false, new asn1js.OctetString({ valueHex: ski })),
    ],
  });
  return { certPem, keyPem: privateKey.export({ type: 'pkcs8', format: 'pem' }) as string };
}

class CertificateAuthority implements DeploymentCa {
  readonly certPem: string;
  private readonly key: KeyObject;
  private readonly subject: pkijs.RelativeDistinguishedNames;
  private readonly keyIdentifier: Uint8Array;
  private readonly notAfter: number;
  private readonly leafTtlMs: number;
  private readonly maxLeaves: number;
  private readonly now: () => number;
  /** LRU by Map insertion order; values are promises so concurrent callers share one mint. */
  private readonly leaves = new Map<string, Promise<Leaf>>();

  constructor(certPem: string, key: KeyObject, options: CaOptions) {
    this.certPem = certPem;
    this.key = key;
    const x = new X509Certificate(certPem);
    const parsed = pkijs.Certificate.fromBER(x.raw);
    this.subject = parsed.subject;
    this.keyIdentifier = keyId(spkiOf(x.publicKey));
    this.notAfter = x.validToDate.getTime();
    this.leafTtlMs = options.leafTtlMs ?? LEAF_TTL_MS;
    this.maxLeaves = options.maxLeaves ?? MAX_CACHED_LEAVES;
    this.now = options.now ?? Date.now;
  }

  leafFor(sni: string): Promise<Leaf> {
    const name = normaliseName(sni);
    if (name === null || name !== sni) {
      return Promise.reject(new Error('leaf requested for a name that is not a canonical host name'));
    }
    const cached = this.leaves.get(name);
    if (cached) {
      this.leaves.delete(name);
      this.leaves.set(name, cached);
      return cached.then((leaf) => (this.fresh(leaf) ? leaf : this.mint(name)));
    }
    return this.mint(name);
  }

  private fresh(leaf: Leaf): boolean {
    return leaf.notAfter.getTime() - this.now() > this.leafTtlMs / 4;
  }

  private mint(name: string): Promise<Leaf> {
    const p = this.sign(name);
    this.leaves.delete(name);
    this.leaves.set(name, p);
    p.catch(() => {
      if (this.leaves.get(name) === p) this.leaves.delete(name);
    });
    while (this.leaves.size > this.maxLeaves) {
      const oldest = this.leaves.keys().next().value as string;
      this.leaves.delete(oldest);
    }
    return p;
  }

  private async sign(name: string): Promise<Leaf> {
    const now = this.now();
    const notAfter = new Date(Math.min(now + this.leafTtlMs, this.notAfter));
    const { publicKey, privateKey } = await newP256();
    const san = new pkijs.AltName({ altNames: [new pkijs.GeneralName({ type: 2, value: name })] });
    const certPem = await signCertificate({
      subject: rdn([[OID.commonName, name]]),
      issuer: this.subject,
      notBefore: new Date(now - LEAF_BACKDATE_MS),
      notAfter,
      publicKey,
      signingKey: this.key,
      extensions: [
        extension('2.5.29.19', true, new pkijs.BasicConstraints({ cA: false }).toSchema()),
        extension('2.5.29.15', true, keyUsage(KU_DIGITAL_SIGNATURE)),
        extension('2.5.29.37', false, new pkijs.ExtKeyUsage({ keyPurposes: [OID.serverAuth] }).toSchema()),
        extension('2.5.29.17', false, san.toSchema()),
        extension('2.5.29.14', false, new asn1js.OctetString({ valueHex: keyId(spkiOf(publicKey)) })),
        extension(
          '2.5.29.35',
          false,
          new pkijs.AuthorityKeyIdentifier({
            keyIdentifier: new asn1js.OctetString({ valueHex: this.keyIdentifier }),
          }).toSchema(),
        ),
      ],
    });
    const keyPem = privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;
    const context = tls.createSecureContext({ cert: certPem, key: keyPem, minVersion: 'TLSv1.2' });
    return { name, certPem, keyPem, context, notAfter };
  }
}

/**
 * A CA from PEMs. Checks that the certificate is a CA, is valid now, and that `keyPem` is its
 * P-256 private key; throws with a reason otherwise (messages never include key material).
 */
export function caFromPem(certPem: string, keyPem: string, options: CaOptions = {}): DeploymentCa {
  let cert: X509Certificate;
  try {
    cert = new X509Certificate(certPem);
  } catch {
    throw new Error('deployment CA certificate is not a PEM X.509 certificate');
  }
  let key: KeyObject;
  try {
    key = createPrivateKey(keyPem);
  } catch {
    throw new Error('deployment CA key is not a PEM private key');
  }
  if (!cert.ca) throw new Error('deployment CA certificate is not a CA (basicConstraints cA=false)');
  if (!isP256(key)) throw new Error('deployment CA key must be ECDSA P-256');
  if (!cert.checkPrivateKey(key)) throw new Error('deployment CA key does not match its certificate');
  const now = (options.now ?? Date.now)();
  if (cert.validToDate.getTime() <= now) throw new Error(`deployment CA certificate expired ${cert.validTo}`);
  if (cert.validFromDate.getTime() > now)
    throw new Error(`deployment CA certificate not valid before ${cert.validFrom}`);
  return new CertificateAuthority(certPem, key, options);
}

async function exists(path: string): Promise<boolean> {
  try {
    await stat(path);
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return false;
    throw err;
  }
}

/** Writes `data` to `path` atomically (temp file + rename) with `mode`; fails if `path` appeared meanwhile. */
async function writeNew(path: string, data: string, mode: number): Promise<void> {
  const tmp = `${path}.${process.pid}.tmp`;
  const fh = await open(tmp, 'wx', mode);
  try {
    await fh.writeFile(data);
    await fh.sync();
  } finally {
    await fh.close();
  }
  try {
    if (await exists(path)) throw new Error(`${path} appeared while the CA was being created`);
    await rename(tmp, path);
  } catch (err) {
    await unlink(tmp).catch(() => {});
    throw err;
  }
}

/**
 * Loads the deployment CA from `certFile`/`keyFile`, or creates both when neither exists (key mode
 * 0600, its directory 0700 if created). One without the other is an error, never overwritten: the
 * certificate may already be baked into templates. A key readable by group or others is refused.
 */
export async function loadOrCreateCa(
  certFile: string,
  keyFile: string,
  options: CaOptions = {},
): Promise<DeploymentCa> {
  const [haveCert, haveKey] = await Promise.all([exists(certFile), exists(keyFile)]);
  if (haveCert !== haveKey) {
    const [present, missing] = haveCert ? [certFile, keyFile] : [keyFile, certFile];
    throw new Error(`deployment CA: ${present} exists but ${missing} does not; restore it or remove both`);
  }
  if (!haveCert) {
    const { certPem, keyPem } = await generateCaPem((options.now ?? Date.now)());
    await mkdir(dirname(keyFile), { recursive: true, mode: 0o700 });
    await mkdir(dirname(certFile), { recursive: true, mode: 0o755 });
    // key first: a crash between the two leaves "key without cert", which the next start reports
    await writeNew(keyFile, keyPem, 0o600);
    await writeNew(certFile, certPem, 0o644);
    return caFromPem(certPem, keyPem, options);
  }
  const mode = (await stat(keyFile)).mode & 0o777;
  if ((mode & 0o077) !== 0) {
    throw new Error(
      `deployment CA: ${keyFile} has mode ${mode.toString(8)}; it must not be readable by group or others (chmod 600)`,
    );
  }
  const [certPem, keyPem] = await Promise.all([readFile(certFile, 'utf8'), readFile(keyFile, 'utf8')]);
  return caFromPem(certPem, keyPem, options);
}
