"""A client that writes its whole request before it reads a byte of the answer, as Python's
http.client (and curl -T) do: the R22/R23 refusals must reach it.

Usage: whole-body-client.py URL METHOD BYTES [CONTENT-TYPE] [MODE]
  MODE http.client (default): the request through http.client; then the answer.
  MODE raw: the request through a plain socket (sendall), then reads until the server closes.
Prints one JSON line: status, the error code of the body, and (raw) whether the server closed the
connection within the client's 20 s timeout ("closed").
"""
import http.client
import json
import socket
import sys
import time
from urllib.parse import urlsplit

url, method, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
ctype = sys.argv[4] if len(sys.argv) > 4 else 'application/octet-stream'
mode = sys.argv[5] if len(sys.argv) > 5 else 'http.client'
u = urlsplit(url)
path = u.path + ('?' + u.query if u.query else '')
body = b'{"x":"' + b'a' * max(0, size - 8) + b'"}' if 'json' in ctype else b'\0' * size
started = time.monotonic()
out = {}
try:
    if mode == 'raw':
        s = socket.create_connection((u.hostname, u.port), timeout=20)
        head = (f'{method} {path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: {ctype}\r\n'
                f'Content-Length: {len(body)}\r\n\r\n').encode()
        s.sendall(head + body)
        got = b''
        closed = False
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    closed = True
                    break
                got += chunk
        except socket.timeout:
            pass
        head_part, _, rest = got.partition(b'\r\n\r\n')
        out['status'] = int(head_part.split(b' ')[1]) if head_part else 0
        out['closed'] = closed
        text = rest
    else:
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=20)
        c.request(method, path, body=body, headers={'content-type': ctype})
        r = c.getresponse()
        out['status'] = r.status
        text = r.read()
    try:
        out['code'] = json.loads(text)['error']['code']
    except Exception:
        out['body'] = text[:200].decode('utf8', 'replace')
except Exception as e:
    out['error'] = f'{type(e).__name__}: {e}'
out['seconds'] = round(time.monotonic() - started, 3)
print(json.dumps(out))
