/** The control VM's own TLS from an ACME CA (certbot): for clouds with no TLS-terminating load balancer. */
import { TLS_CERT_FILE, TLS_DIR, TLS_KEY_FILE } from '../runtime-settings.ts';
import type { VmFile } from './plan.ts';

/**
 * ACME TLS on the control VM: `space-tls` (bash) asks certbot for one certificate naming
 * `SPACE_TLS_HOSTNAMES` (HTTP-01, certbot's standalone server on port 80), copies it to
 * {@link TLS_DIR} and writes the API's and the router's TLS env files (`*.tls.env`), restarting
 * them only when what they serve changed. It runs at every boot (a unit, ordered before them), when
 * the VM configuration changes `space-tls`, and as certbot's deploy hook after each renewal
 * (Debian's certbot package renews from its own timer). Idempotent: certbot keeps a certificate
 * until it is due. Until a certificate exists (DNS not pointed yet, CA unreachable) the API and the
 * router serve plain HTTP, and the unit retries every 5 minutes; with no hostnames they serve
 * plain HTTP.
 */
export function acmeFiles(): VmFile[] {
  const live = '/etc/letsencrypt/live/space';
  return [
    {
      path: '/usr/local/sbin/space-tls',
      mode: '0755',
      content: [
        '#!/bin/bash',
        '# usage: space-tls [--installed]  (--installed: certbot deploy hook, installs without asking the CA)',
        'set -euo pipefail',
        'conf=/etc/space/space-tls.env',
        'get() { sed -n "s/^$1=//p" "$conf" 2>/dev/null | head -n 1; }',
        'hosts=$(get SPACE_TLS_HOSTNAMES)',
        'email=$(get SPACE_ACME_EMAIL)',
        'server=$(get SPACE_ACME_SERVER)',
        `live=${live}`,
        // biome-ignore lint/suspicious/noTemplateCurlyInString: bash parameter expansion, not a template
        'if [ -n "$hosts" ] && [ "${1:-}" != "--installed" ]; then',
        '  [[ "$hosts" =~ ^[a-z0-9.-]+(,[a-z0-9.-]+)*$ ]] || { echo "space-tls: bad SPACE_TLS_HOSTNAMES" >&2; exit 2; }',
        '  [[ "$email" =~ ^[^[:space:]@]+@[^[:space:]@]+$ ]] || { echo "space-tls: bad SPACE_ACME_EMAIL" >&2; exit 2; }',
        '  [[ "$server" =~ ^https://[^[:space:]]+$ ]] || { echo "space-tls: bad SPACE_ACME_SERVER" >&2; exit 2; }',
        '  domains=()',
        '  IFS=, read -ra names <<< "$hosts"',
        // biome-ignore lint/suspicious/noTemplateCurlyInString: bash parameter expansion, not a template
        '  for h in "${names[@]}"; do domains+=(-d "$h"); done',
        '  certbot certonly --standalone --non-interactive --agree-tos --email "$email" --server "$server" \\',
        // biome-ignore lint/suspicious/noTemplateCurlyInString: bash parameter expansion, not a template
        '    --cert-name space --keep-until-expiring --expand "${domains[@]}" \\',
        '    --deploy-hook "/usr/local/sbin/space-tls --installed"',
        'fi',
        'restart=""',
        'api_env=""',
        'router_env=""',
        'if [ -n "$hosts" ] && [ -s "$live/fullchain.pem" ] && [ -s "$live/privkey.pem" ]; then',
        `  mkdir -p -m 0700 ${TLS_DIR}`,
        `  if ! cmp -s "$live/fullchain.pem" ${TLS_CERT_FILE} || ! cmp -s "$live/privkey.pem" ${TLS_KEY_FILE}; then`,
        `    install -m 0644 "$live/fullchain.pem" ${TLS_CERT_FILE}.new`,
        `    install -m 0600 "$live/privkey.pem" ${TLS_KEY_FILE}.new`,
        `    mv ${TLS_CERT_FILE}.new ${TLS_CERT_FILE}`,
        `    mv ${TLS_KEY_FILE}.new ${TLS_KEY_FILE}`,
        '    restart="space-api space-router"',
        '  fi',
        `  api_env=$(printf 'SPACE_API_TLS_CERT_FILE=%s\\nSPACE_API_TLS_KEY_FILE=%s' ${TLS_CERT_FILE} ${TLS_KEY_FILE})`,
        `  router_env=$(printf 'SPACE_ROUTER_TLS_CERT_FILE=%s\\nSPACE_ROUTER_TLS_KEY_FILE=%s' ${TLS_CERT_FILE} ${TLS_KEY_FILE})`,
        'fi',
        "# put <unit> <content>: rewrites the unit's TLS env file when it differs",
        'put() {',
        '  f=/etc/space/$1.tls.env',
        '  if [ ! -e "$f" ] || [ "$(cat "$f")" != "$2" ]; then',
        '    if [ -n "$2" ]; then printf \'%s\\n\' "$2" > "$f"; else : > "$f"; fi',
        '    restart="$restart $1"',
        '  fi',
        '}',
        'put space-api "$api_env"',
        'put space-router "$router_env"',
        '# try-restart: at boot they are not running yet and start after this unit',
        'if [ -n "$restart" ]; then systemctl try-restart $restart; fi',
        '',
      ].join('\n'),
    },
    {
      path: '/etc/systemd/system/space-tls.service',
      mode: '0644',
      content: [
        '[Unit]',
        'Description=SPACE: ACME certificate of the API and the router',
        'Wants=network-online.target',
        'After=network-online.target',
        'Before=space-api.service space-router.service',
        '',
        '[Service]',
        'Type=oneshot',
        'ExecStart=/usr/local/sbin/space-tls',
        // DNS not pointed at the VM yet, the CA unreachable: try again, while the API serves plain HTTP
        'Restart=on-failure',
        'RestartSec=300',
        '',
        '[Install]',
        'WantedBy=multi-user.target',
        '',
      ].join('\n'),
    },
  ];
}
