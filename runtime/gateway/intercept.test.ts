/**
 * Intercepted TLS end to end on 127.0.0.1, no mocks: a real upstream HTTPS server (its certificate
 * from a test "public" CA the gateway is told to trust) that records what it receives, a stand-in
 * for the TLS proxy that reads the ClientHello and calls `interceptTls`, and raw TLS clients that
 * trust the deployment CA. Every refusal also checks the far side: the upstream saw nothing.
 */
import https from 'node:https';
import net, { type AddressInfo } from 'node:net';
import tls from 'node:tls';
import { gunzipSync, gzipSync } from 'node:zlib';
import { pino } from 'pino';
import { afterAll, beforeAll, beforeEach, describe, expect, it, vi } from 'vitest';
import { caFromPem, type DeploymentCa, generateCaPem } from './ca.ts';
import { type CredentialSource, staticCredentialSource } from './credential-source.ts';
import { type CredentialGrant, type CredentialSecret, mintPlaceholder } from './credentials.ts';
import { type InterceptContext, interceptTls } from './intercept.ts';
import { UnpackPool } from './unpack-pool.ts';

const NAME = 'api.test.local';
const REAL = 'sk-REAL-7f3a9c1e5b2d4f60';
const OTHER_REAL = 'other-REAL-secret-93ab';

const grant: CredentialGrant = {
  name: 'api',
  placeholder: mintPlaceholder(),
  domains: [NAME],
  header: 'authorization',
  format: 'Bearer {value}',
};
/** Granted to the same sandbox, but for another host. */
const otherGrant: CredentialGrant = {
  name: 'other',
  placeholder: mintPlaceholder(),
  domains: ['*.other.test.local'],
  header: 'x-api-key',
  format: '{value}',
};

/** The live secret of `g` as the state of record would hold it. */
function secretOf(g: CredentialGrant, value: string, over: Partial<CredentialSecret> = {}): CredentialSecret {
  return {
    name: g.name,
    generation: 'g1',
    domains: g.domains,
    header: g.header,
    format: g.format,
    value,
    methods: null,
    paths: null,
    ...over,
  };
}
const LIVE: CredentialSource = staticCredentialSource([
  secretOf(grant, REAL),
  secretOf(otherGrant, OTHER_REAL),
]);

interface Seen {
  method: string;
  url: string;
  rawHeaders: string[];
  body: string;
  complete: boolean;
}

interface Upstream {
  port: number;
  seen: Seen[];
  close(): void;
}

async function startUpstream(ca: DeploymentCa, certName: string): Promise<Upstream> {
  const leaf = await ca.leafFor(certName);
  const seen: Seen[] = [];
  const server = https.createServer({ cert: leaf.certPem, key: leaf.keyPem }, (req, res) => {
    const entry: Seen = {
      method: req.method!,
      url: req.url!,
      rawHeaders: req.rawHeaders,
      body: '',
      complete: false,
    };
    seen.push(entry);
    req.on('data', (d: Buffer) => {
      entry.body += d.toString();
    });
    req.on('end', () => {
      entry.complete = true;
      if (req.url === '/echo') {
        // an endpoint that reflects the credential in a header, the status text and the body
        res.setHeader('x-echo', String(req.headers.authorization));
        res.setHeader('content-type', 'application/json');
        res.statusMessage = `OK ${req.headers.authorization}`;
        res.end(JSON.stringify({ headers: req.headers, padding: 'x'.repeat(3000) }));
      } else if (req.url === '/reflect') {
        // E10: the value comes back as a header name and encoded in the body
        const value = String(req.headers.authorization).slice('Bearer '.length);
        res.setHeader(`x-${value}`, '1');
        res.end(
          JSON.stringify({
            upper: value.toUpperCase(),
            b64: Buffer.from(value).toString('base64'),
            b64url: Buffer.from(`a${value}`).toString('base64url'),
            b64two: Buffer.from(`ab${value}`).toString('base64'),
            hex: Buffer.from(value).toString('hex'),
            hexUpper: Buffer.from(value).toString('hex').toUpperCase(),
          }),
        );
      } else if (req.url === '/reflect-gz-split') {
        // the gzip magic cut into single bytes, each its own TLS record, a moment apart
        const gz = gzipSync(`echo ${String(req.headers.authorization)}`);
        res.setHeader('content-length', gz.length);
        res.write(gz.subarray(0, 1));
        setTimeout(() => {
          res.write(gz.subarray(1, 2));
          setTimeout(() => res.end(gz.subarray(2)), 20);
        }, 20);
      } else if (req.url === '/reflect-gz-nul') {
        // E16: a whole gzip member, a NUL, then the value in the clear
        res.end(Buffer.concat([gzipSync('x'), Buffer.from(`\0${String(req.headers.authorization)}`)]));
      } else if (req.url === '/reflect-gz-hidden') {
        // E16: a second member hidden behind a NUL
        res.end(
          Buffer.concat([gzipSync('x'), Buffer.from([0]), gzipSync(String(req.headers.authorization))]),
        );
      } else if (req.url === '/reflect-gz') {
        res.end(gzipSync(`echo ${String(req.headers.authorization)}`)); // gzip without a label
      } else if (req.url === '/bad-status') {
        // E11: a control character in the status line (node:http would refuse to write it)
        req.socket.end('HTTP/1.1 200 O\x01K\r\ncontent-length: 2\r\n\r\nhi');
      } else if (req.url === '/gzip') {
        res.setHeader('content-encoding', 'gzip');
        res.end(gzipSync(String(req.headers.authorization)));
      } else if (req.url === '/large') {
        res.end('y'.repeat(5000));
      } else if (req.headers.authorization === `Bearer ${REAL}`) {
        res.end(`ok ${entry.body.length}`);
      } else {
        res.writeHead(401).end('no credential');
      }
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    port: (server.address() as AddressInfo).port,
    seen,
    close: () => server.close(),
  };
}

let deployment: DeploymentCa;
let publicCa: DeploymentCa;
let upstream: Upstream;
let rogue: Upstream;
let wrongName: Upstream;
let proxy: net.Server;
let proxyPort: number;
let ctx: InterceptContext;
const unpack = new UnpackPool({ workers: 1, timeoutMs: 5000, maxUnpackedBytes: 1024 * 1024 });
const logLines: string[] = [];
const log = pino({ level: 'info' }, { write: (line: string) => void logLines.push(line) });

function baseCtx(): InterceptContext {
  return {
    sandboxId: 'sbx_a',
    sni: NAME,
    grants: [grant, otherGrant],
    credentials: LIVE,
    resolve: async () => '127.0.0.1',
    log,
    limits: { handshakeTimeoutMs: 3000, idleTimeoutMs: 5000, maxHeaderBytes: 16 * 1024, maxBodyBytes: 4096 },
    upstreamCa: [Buffer.from(publicCa.certPem)],
    upstreamPort: upstream.port,
    ca: deployment,
    unpack: (body, needles) => unpack.mask('sbx_a', body, needles),
  };
}

beforeAll(async () => {
  const d = await generateCaPem();
  deployment = caFromPem(d.certPem, d.keyPem);
  const p = await generateCaPem();
  publicCa = caFromPem(p.certPem, p.keyPem);
  const r = await generateCaPem();
  upstream = await startUpstream(publicCa, NAME);
  rogue = await startUpstream(caFromPem(r.certPem, r.keyPem), NAME);
  wrongName = await startUpstream(publicCa, 'elsewhere.test.local');
  // stands in for the TLS proxy: read one whole TLS record (the ClientHello), then hand over
  proxy = net.createServer((socket) => {
    let buf = Buffer.alloc(0);
    const onData = (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      if (buf.length >= 5 && buf.length >= 5 + buf.readUInt16BE(3)) {
        socket.off('data', onData);
        void interceptTls(socket, buf, ctx);
      }
    };
    socket.on('data', onData);
  });
  await new Promise<void>((r) => proxy.listen(0, '127.0.0.1', r));
  proxyPort = (proxy.address() as AddressInfo).port;
});

afterAll(async () => {
  await unpack.close();
  proxy.close();
  for (const u of [upstream, rogue, wrongName]) u.close();
});

beforeEach(() => {
  ctx = baseCtx();
  for (const u of [upstream, rogue, wrongName]) u.seen.length = 0;
  logLines.length = 0;
});

interface Exchange {
  /** Everything the client received (one or more responses), decrypted. */
  text: string;
  /** TLS / socket error code on the client, if any. */
  error?: string;
}

/** Opens a TLS connection to the stand-in proxy, writes `raw`, reads until the server closes. */
function exchange(
  raw: string | ((s: tls.TLSSocket) => void),
  opts: { servername?: string; alpn?: string[]; rejectUnauthorized?: boolean } = {},
): Promise<Exchange> {
  return new Promise((resolve) => {
    let text = '';
    const s = tls.connect({
      host: '127.0.0.1',
      port: proxyPort,
      servername: opts.servername ?? NAME,
      ca: [deployment.certPem],
      ALPNProtocols: opts.alpn,
      rejectUnauthorized: opts.rejectUnauthorized ?? true,
    });
    const guard = setTimeout(() => s.destroy(), 8000);
    s.on('secureConnect', () => (typeof raw === 'string' ? s.write(raw) : raw(s)));
    s.on('data', (d: Buffer) => {
      text += d.toString('latin1');
    });
    s.on('error', (err: NodeJS.ErrnoException) => {
      clearTimeout(guard);
      resolve({ text, error: err.code ?? err.message });
    });
    s.on('close', () => {
      clearTimeout(guard);
      resolve({ text });
    });
  });
}

function request(lines: string[], body = ''): string {
  return `${lines.join('\r\n')}\r\n\r\n${body}`;
}

/** One request to NAME carrying this sandbox's placeholder in the granted header, then close. */
function withPlaceholder(path: string, method = 'GET'): string {
  return request([
    `${method} ${path} HTTP/1.1`,
    `Host: ${NAME}`,
    `Authorization: Bearer ${grant.placeholder}`,
    'Connection: close',
  ]);
}

function statuses(text: string): number[] {
  return [...text.matchAll(/HTTP\/1\.1 (\d{3}) /g)].map((m) => Number(m[1]));
}

function headerValues(rawHeaders: string[], name: string): string[] {
  const out: string[] = [];
  for (let i = 0; i < rawHeaders.length; i += 2) {
    if (rawHeaders[i]!.toLowerCase() === name) out.push(rawHeaders[i + 1]!);
  }
  return out;
}

function audits(): { msg: string; reason?: string; rule?: string; address?: string }[] {
  return logLines.map((l) => JSON.parse(l)).filter((l) => String(l.msg).startsWith('egress '));
}

async function denied(reason: string): Promise<void> {
  await vi.waitFor(() =>
    expect(audits().some((a) => a.msg === 'egress deny' && a.reason === reason)).toBe(true),
  );
}

describe('interceptTls', () => {
  it('replaces the placeholder with the real value: upstream sees exactly one Authorization: Bearer REAL', async () => {
    const r = await exchange(
      request(
        [
          'POST /v1/things?q=1 HTTP/1.1',
          `Host: ${NAME}:443`,
          `Authorization: Bearer ${grant.placeholder}`,
          'Accept-Encoding: gzip, br',
          'Content-Length: 5',
          'Connection: close',
        ],
        'hello',
      ),
    );
    expect(statuses(r.text)).toEqual([200]);
    expect(r.text).toMatch(/ok 5$/);
    expect(upstream.seen).toHaveLength(1);
    const seen = upstream.seen[0]!;
    expect(seen.url).toBe('/v1/things?q=1');
    expect(headerValues(seen.rawHeaders, 'authorization')).toEqual([`Bearer ${REAL}`]);
    expect(headerValues(seen.rawHeaders, 'host')).toEqual([NAME]);
    expect(headerValues(seen.rawHeaders, 'accept-encoding')).toEqual(['identity']);
    expect(seen.body).toBe('hello');
    expect(r.text).not.toContain(REAL);
    expect(audits()).toContainEqual(
      expect.objectContaining({ msg: 'egress allow', rule: 'credential:api', address: '127.0.0.1' }),
    );
  });

  it('serves several requests on one connection, each checked (keep-alive)', async () => {
    const get = (extra: string[] = []) =>
      request(['GET / HTTP/1.1', `Host: ${NAME}`, `Authorization: Bearer ${grant.placeholder}`, ...extra]);
    const r = await exchange(get() + get() + get(['Connection: close']));
    expect(statuses(r.text)).toEqual([200, 200, 200]);
    expect(upstream.seen).toHaveLength(3);
  });

  it('never hands the real value back: echoing headers, status text and body are masked', async () => {
    const r = await exchange(withPlaceholder('/echo'));
    expect(statuses(r.text)).toEqual([200]);
    expect(headerValues(upstream.seen[0]!.rawHeaders, 'authorization')).toEqual([`Bearer ${REAL}`]);
    expect(r.text).not.toContain(REAL);
    expect(r.text).toMatch(new RegExp(`x-echo: Bearer \\*{${REAL.length}}`, 'i'));
    expect(r.text).toContain(`"authorization":"Bearer ${'*'.repeat(REAL.length)}"`);
    // masking keeps the length: the body still parses as the upstream's JSON
    const body = r.text.slice(r.text.indexOf('\r\n\r\n') + 4);
    expect(JSON.parse(body).padding).toHaveLength(3000);
  });

  it('E10: masks the value in a header name and in base64, hex and case-folded forms of the body', async () => {
    const r = await exchange(withPlaceholder('/reflect'));
    expect(statuses(r.text)).toEqual([200]);
    expect(headerValues(upstream.seen[0]!.rawHeaders, 'authorization')).toEqual([`Bearer ${REAL}`]);
    const lower = r.text.toLowerCase();
    for (const form of [
      REAL.toLowerCase(),
      Buffer.from(REAL).toString('hex'),
      Buffer.from(REAL).toString('base64').slice(0, -4),
      Buffer.from(`a${REAL}`).toString('base64url').slice(4, -4),
      Buffer.from(`ab${REAL}`).toString('base64').slice(4, -4),
    ])
      expect(lower).not.toContain(form.toLowerCase());
    const body = JSON.parse(r.text.slice(r.text.indexOf('\r\n\r\n') + 4)) as Record<string, string>;
    expect(Object.keys(body)).toHaveLength(6); // the body still parses: masking keeps lengths
  });

  it.each(['/reflect-gz', '/reflect-gz-split'])(
    'E10: a gzip body without a label (%s) is unpacked, masked and packed again',
    async (path) => {
      const raw: Buffer[] = [];
      const r = await exchange((s) => {
        s.on('data', (d: Buffer) => raw.push(d));
        s.write(withPlaceholder(path));
      });
      expect(statuses(r.text)).toEqual([200]);
      const all = Buffer.concat(raw);
      const unpacked = gunzipSync(all.subarray(all.indexOf('\r\n\r\n') + 4)).toString();
      expect(unpacked).toBe(`echo Bearer ${'*'.repeat(REAL.length)}`);
    },
  );

  it('E16: bytes after a gzip member are masked as raw bytes; a member hidden behind them refuses the body', async () => {
    const nul = await exchange(withPlaceholder('/reflect-gz-nul'));
    expect(statuses(nul.text)).toEqual([200]);
    expect(nul.text).not.toContain(REAL);
    expect(nul.text).toContain(`\0Bearer ${'*'.repeat(REAL.length)}`);
    const hidden = await exchange(withPlaceholder('/reflect-gz-hidden'));
    expect(statuses(hidden.text)).toEqual([502]);
    await denied('upstream-encoding');
  });

  it('E9: a revoked credential is not injected: its placeholder goes out untouched', async () => {
    ctx = { ...baseCtx(), credentials: staticCredentialSource([secretOf(otherGrant, OTHER_REAL)]) };
    const r = await exchange(withPlaceholder('/'));
    expect(statuses(r.text)).toEqual([401]); // the upstream's own answer to a worthless token
    expect(headerValues(upstream.seen[0]!.rawHeaders, 'authorization')).toEqual([
      `Bearer ${grant.placeholder}`,
    ]);
  });

  it('E9: a credential deleted and registered again (another generation) does not reach the old grant', async () => {
    const regranted = { ...grant, generation: 'g0' };
    ctx = { ...baseCtx(), grants: [regranted, otherGrant] };
    await exchange(withPlaceholder('/'));
    expect(headerValues(upstream.seen[0]!.rawHeaders, 'authorization')).toEqual([
      `Bearer ${grant.placeholder}`,
    ]);
  });

  it('rotation: the current value is injected, read per request', async () => {
    const values = [REAL, 'rotated-value-0001'];
    let i = 0;
    ctx = {
      ...baseCtx(),
      credentials: { fetch: (g) => staticCredentialSource([secretOf(grant, values[i++]!)]).fetch(g) },
    };
    const get = (extra: string[] = []) =>
      request(['GET / HTTP/1.1', `Host: ${NAME}`, `Authorization: Bearer ${grant.placeholder}`, ...extra]);
    await exchange(get() + get(['Connection: close']));
    expect(upstream.seen.map((x) => headerValues(x.rawHeaders, 'authorization')[0])).toEqual([
      `Bearer ${REAL}`,
      'Bearer rotated-value-0001',
    ]);
  });

  it('refuses (503) when the values cannot be read: nothing is sent upstream', async () => {
    ctx = {
      ...baseCtx(),
      credentials: {
        fetch: async () => {
          throw new Error('store down');
        },
      },
    };
    const r = await exchange(withPlaceholder('/'));
    expect(statuses(r.text)).toEqual([503]);
    expect(upstream.seen).toEqual([]);
    await denied('credential-unavailable');
  });

  it('method and path limits: the value is never sent elsewhere (refused, upstream sees nothing)', async () => {
    ctx = {
      ...baseCtx(),
      credentials: staticCredentialSource([secretOf(grant, REAL, { methods: ['GET'], paths: ['/v1/*'] })]),
    };
    for (const [line, extra] of [
      ['GET /echo HTTP/1.1'],
      ['POST /v1/x HTTP/1.1'],
      ['GET /v1%2f..%2fecho HTTP/1.1'],
      // E15: a path routers read as another (Servlet path parameters) and method overrides
      ['GET /v1/..;/echo HTTP/1.1'],
      ['GET /v1/%E2%80%A5/echo HTTP/1.1'],
      ['GET /v1/x HTTP/1.1', 'X-HTTP-Method-Override: DELETE'],
      ['GET /v1/x?_method=DELETE HTTP/1.1'],
    ] as const) {
      const r = await exchange(
        request([
          line,
          `Host: ${NAME}`,
          `Authorization: Bearer ${grant.placeholder}`,
          ...(extra ? [extra] : []),
          'Content-Length: 0',
          'Connection: close',
        ]),
      );
      expect(statuses(r.text), line).toEqual([403]);
    }
    expect(upstream.seen).toEqual([]);
    await denied('credential-scope');
    const ok = await exchange(withPlaceholder('/v1/models'));
    expect(statuses(ok.text)).toEqual([200]);
  });

  it('E11: a control character in the upstream status line ends that exchange with a 502, and the next one is served', async () => {
    const bad = await exchange(withPlaceholder('/bad-status'));
    expect(statuses(bad.text)).toEqual([502]);
    await denied('malformed-response');
    const next = await exchange(withPlaceholder('/'));
    expect(statuses(next.text)).toEqual([200]);
  });

  it('refuses a Host that differs from the SNI, and the upstream sees nothing', async () => {
    for (const host of ['evil.test.local', `${NAME}:8443`, '127.0.0.1', `${NAME}@evil.test.local`]) {
      const r = await exchange(
        request([
          'GET / HTTP/1.1',
          `Host: ${host}`,
          `Authorization: Bearer ${grant.placeholder}`,
          'Connection: close',
        ]),
      );
      expect(statuses(r.text), host).toEqual([421]);
    }
    const abs = await exchange(
      request([
        'GET https://evil.test.local/ HTTP/1.1',
        `Host: ${NAME}`,
        `Authorization: Bearer ${grant.placeholder}`,
      ]),
    );
    expect(statuses(abs.text)).toEqual([421]);
    const twoHosts = await exchange(request(['GET / HTTP/1.1', `Host: ${NAME}`, 'Host: evil.test.local']));
    expect(statuses(twoHosts.text)).toEqual([400]); // E6: refused before either Host is looked at
    const noHost = await exchange(request(['GET / HTTP/1.0', `Authorization: Bearer ${grant.placeholder}`]));
    expect(statuses(noHost.text)).toEqual([421]);
    expect(upstream.seen).toHaveLength(0);
    await denied('host-sni-mismatch');
  });

  it('refuses a smuggled second request to another host after an injected one', async () => {
    const r = await exchange(
      request([
        'POST / HTTP/1.1',
        `Host: ${NAME}`,
        `Authorization: Bearer ${grant.placeholder}`,
        'Content-Length: 0',
      ]) + request(['GET / HTTP/1.1', 'Host: evil.test.local', `Authorization: Bearer ${grant.placeholder}`]),
    );
    expect(statuses(r.text)).toEqual([200, 421]);
    expect(upstream.seen).toHaveLength(1);
  });

  it('refuses a placeholder of another sandbox (replay from sandbox B) and any unknown placeholder', async () => {
    ctx = { ...baseCtx(), sandboxId: 'sbx_b', grants: [{ ...grant, placeholder: mintPlaceholder() }] };
    const replay = await exchange(withPlaceholder('/'));
    expect(statuses(replay.text)).toEqual([403]);
    ctx = baseCtx();
    const unknown = await exchange(
      request([
        'GET / HTTP/1.1',
        `Host: ${NAME}`,
        `X-Other: space_ph_${'a'.repeat(10)}`,
        'Connection: close',
      ]),
    );
    expect(statuses(unknown.text)).toEqual([403]);
    expect(upstream.seen).toHaveLength(0);
    await denied('foreign-placeholder');
  });

  it('does not replace a placeholder sent to a host its credential does not cover (refused)', async () => {
    const r = await exchange(
      request([
        'GET / HTTP/1.1',
        `Host: ${NAME}`,
        `X-Api-Key: ${otherGrant.placeholder}`,
        'Connection: close',
      ]),
    );
    expect(statuses(r.text)).toEqual([403]);
    expect(upstream.seen).toHaveLength(0);
    await denied('placeholder-wrong-host');
  });

  it('refuses its own placeholder anywhere but the granted header in the granted format', async () => {
    for (const lines of [
      ['GET /?key=' + grant.placeholder + ' HTTP/1.1', `Host: ${NAME}`],
      ['GET / HTTP/1.1', `Host: ${NAME}`, `Authorization: Token ${grant.placeholder}`],
      ['GET / HTTP/1.1', `Host: ${NAME}`, `X-Api-Key: ${grant.placeholder}`],
    ]) {
      const r = await exchange(request([...lines, 'Connection: close']));
      expect(statuses(r.text), lines.join(' | ')).toEqual([403]);
    }
    expect(upstream.seen).toHaveLength(0);
    await denied('placeholder-misplaced');
  });

  it('replaces a pre-set duplicate Authorization: exactly one header upstream', async () => {
    for (const order of [0, 1]) {
      const auths = [`Authorization: Bearer ${grant.placeholder}`, 'Authorization: Bearer attacker-chosen'];
      if (order) auths.reverse();
      const r = await exchange(request(['GET / HTTP/1.1', `Host: ${NAME}`, ...auths, 'Connection: close']));
      expect(statuses(r.text)).toEqual([200]);
    }
    expect(upstream.seen).toHaveLength(2);
    for (const s of upstream.seen)
      expect(headerValues(s.rawHeaders, 'authorization')).toEqual([`Bearer ${REAL}`]);
  });

  it('strips hop-by-hop and Connection-named headers', async () => {
    const r = await exchange(
      request([
        'GET / HTTP/1.1',
        `Host: ${NAME}`,
        `Authorization: Bearer ${grant.placeholder}`,
        'Connection: close, x-hop',
        'X-Hop: 1',
        'Keep-Alive: timeout=5',
        'TE: trailers',
        'Proxy-Authorization: Basic Zm9vOmJhcg==',
        'Upgrade: websocket',
        'X-Kept: yes',
      ]),
    );
    expect(statuses(r.text)).toEqual([200]);
    const names = upstream.seen[0]!.rawHeaders.filter((_, i) => i % 2 === 0).map((n) => n.toLowerCase());
    for (const hop of ['x-hop', 'keep-alive', 'te', 'proxy-authorization', 'upgrade'])
      expect(names).not.toContain(hop);
    expect(names).toContain('x-kept');
  });

  it('refuses an upstream whose certificate is untrusted or for another name: 502, nothing sent', async () => {
    ctx = { ...baseCtx(), upstreamPort: rogue.port };
    const r = await exchange(withPlaceholder('/'));
    expect(statuses(r.text)).toEqual([502]);
    ctx = { ...baseCtx(), upstreamPort: wrongName.port };
    const w = await exchange(withPlaceholder('/'));
    expect(statuses(w.text)).toEqual([502]);
    expect(rogue.seen).toHaveLength(0);
    expect(wrongName.seen).toHaveLength(0);
    await denied('upstream-certificate');
    expect(audits().filter((a) => a.reason === 'upstream-certificate')).toHaveLength(2);
  });

  it('refuses ambiguous framing: CL+TE, duplicate CL, obfuscated TE', async () => {
    const cases = [
      ['Content-Length: 4', 'Transfer-Encoding: chunked'],
      ['Transfer-Encoding: chunked', 'Content-Length: 4'],
      ['Content-Length: 4', 'Content-Length: 5'],
      ['Content-Length: 4', 'Content-Length: 4'],
      ['Transfer-Encoding: xchunked'],
      ['Transfer-Encoding: chunked, identity'],
      ['Transfer-Encoding: chunked', 'Transfer-Encoding: identity'],
    ];
    for (const framing of cases) {
      const r = await exchange(
        request(
          ['POST / HTTP/1.1', `Host: ${NAME}`, `Authorization: Bearer ${grant.placeholder}`, ...framing],
          '0\r\n\r\n',
        ),
      );
      expect(statuses(r.text), framing.join(' | ')).toEqual([400]);
    }
    expect(upstream.seen).toHaveLength(0);
    await denied('malformed-http');
  });

  it('enforces the body cap: a large Content-Length is refused upfront, a long chunked body is cut', async () => {
    const big = await exchange(
      request(
        [
          'POST / HTTP/1.1',
          `Host: ${NAME}`,
          `Authorization: Bearer ${grant.placeholder}`,
          'Content-Length: 5000',
        ],
        'x'.repeat(5000),
      ),
    );
    expect(statuses(big.text)).toEqual([413]);
    expect(upstream.seen).toHaveLength(0);
    const chunk = `${(1000).toString(16)}\r\n${'z'.repeat(1000)}\r\n`;
    const chunked = await exchange((s) => {
      s.write(
        request([
          'POST / HTTP/1.1',
          `Host: ${NAME}`,
          `Authorization: Bearer ${grant.placeholder}`,
          'Transfer-Encoding: chunked',
        ]),
      );
      for (let i = 0; i < 6; i++) s.write(chunk);
      s.write('0\r\n\r\n');
    });
    expect(statuses(chunked.text)).toEqual([413]);
    await new Promise((r) => setTimeout(r, 100));
    expect(upstream.seen.every((s) => !s.complete && s.body.length <= 4096)).toBe(true);
    await denied('body-too-large');
  });

  it('refuses a response over the body cap and an encoded response it cannot scan', async () => {
    for (const path of ['/large', '/gzip']) {
      const r = await exchange(
        request([
          `GET ${path} HTTP/1.1`,
          `Host: ${NAME}`,
          `Authorization: Bearer ${grant.placeholder}`,
          'Connection: close',
        ]),
      );
      expect(statuses(r.text), path).toEqual([502]);
    }
    await denied('response-too-large');
    await denied('upstream-encoding');
  });

  it('refuses TRACE, CONNECT and dot segments', async () => {
    for (const line of [
      'TRACE / HTTP/1.1',
      `CONNECT ${NAME}:443 HTTP/1.1`,
      'GET /public/../admin HTTP/1.1',
      'GET /a/%2e%2E/b HTTP/1.1',
    ]) {
      const r = await exchange(
        request([line, `Host: ${NAME}`, `Authorization: Bearer ${grant.placeholder}`, 'Connection: close']),
      );
      expect(statuses(r.text).length === 0 || statuses(r.text)[0]! >= 400, line).toBe(true);
      expect(r.text, line).toMatch(/^HTTP\/1\.1 (405|400)/);
    }
    expect(upstream.seen).toHaveLength(0);
  });

  it('refuses a ClientHello whose SNI differs from the intercepted name, or has none', async () => {
    const other = await exchange('GET / HTTP/1.1\r\n\r\n', { servername: 'evil.test.local' });
    expect(other.error).toBeDefined();
    await denied('sni-mismatch');
    logLines.length = 0;
    const none = await exchange(`GET / HTTP/1.1\r\nHost: ${NAME}\r\n\r\n`, {
      servername: '',
      rejectUnauthorized: false,
    });
    expect(statuses(none.text)).toEqual([]);
    await denied('sni-mismatch');
    expect(upstream.seen).toHaveLength(0);
  });

  it('fails closed for an h2-only client (no common ALPN protocol)', async () => {
    const r = await exchange('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', { alpn: ['h2'] });
    expect(r.error).toBe('ERR_SSL_TLSV1_ALERT_NO_APPLICATION_PROTOCOL');
    expect(upstream.seen).toHaveLength(0);
    await denied('handshake-failed');
  });

  it('closes a connection that sends no request head before the deadline', async () => {
    ctx = { ...baseCtx(), limits: { ...baseCtx().limits, handshakeTimeoutMs: 300 } };
    const t0 = Date.now();
    const r = await exchange(() => {});
    expect(Date.now() - t0).toBeLessThan(3000);
    expect(r.text).toBe('');
    expect(audits()).toContainEqual(
      expect.objectContaining({ msg: 'egress close', reason: 'handshake-timeout' }),
    );
  });

  it('closes a keep-alive connection idle past the idle timeout', async () => {
    ctx = { ...baseCtx(), limits: { ...baseCtx().limits, idleTimeoutMs: 300 } };
    const r = await exchange(
      request(['GET / HTTP/1.1', `Host: ${NAME}`, `Authorization: Bearer ${grant.placeholder}`]),
    );
    expect(statuses(r.text)).toEqual([200]);
    expect(audits()).toContainEqual(expect.objectContaining({ msg: 'egress close', reason: 'idle-timeout' }));
  });

  it('a resolver refusal is a 502 and nothing is dialled', async () => {
    ctx = {
      ...baseCtx(),
      resolve: async () => {
        throw new Error('resolved to a denied address');
      },
    };
    const r = await exchange(withPlaceholder('/'));
    expect(statuses(r.text)).toEqual([502]);
    expect(upstream.seen).toHaveLength(0);
    await denied('resolution-failed');
  });

  it('never writes a real value to the log', async () => {
    await exchange(withPlaceholder('/echo'));
    ctx = { ...baseCtx(), upstreamPort: rogue.port };
    await exchange(withPlaceholder('/'));
    expect(logLines.length).toBeGreaterThan(0);
    for (const line of logLines) {
      expect(line).not.toContain(REAL);
      expect(line).not.toContain(OTHER_REAL);
    }
  });
});
