/**
 * Pulling the SPACE image from a registry that wants credentials (`space:imagePullUsername` and
 * the secret `space:imagePullPassword`): which registry a repository names, and the two documents
 * that log in to it, in the Docker config format both readers take: podman's auth file on VMs and
 * a `kubernetes.io/dockerconfigjson` Secret on Kubernetes. Pure.
 */

/**
 * The registry host of an image repository, as container tools read a reference (the grammar of
 * distribution/distribution `reference/normalize.go`, `splitDockerDomain`): the first path
 * component when it holds a `.` or a `:` or is `localhost`, else Docker Hub (`docker.io`).
 * E.g. `ghcr.io/space-sandbox/space` → `ghcr.io`, `registry.local:5000/space` →
 * `registry.local:5000`, `space-sandbox/space` → `docker.io`. containers-auth.json(5) keys
 * entries by this name.
 */
export function imageRegistry(repository: string): string {
  const first = repository.split('/')[0]!;
  return repository.includes('/') && (first.includes('.') || first.includes(':') || first === 'localhost')
    ? first
    : 'docker.io';
}

/** Credentials for the image's registry. */
export interface ImagePullCredentials {
  /** Registry user name (no `:`, which would end it inside the `auth` field). */
  readonly username: string;
  /** Its password or token (secret). */
  readonly password: string;
}

/** The `auth` field of a Docker config entry: base64 of `username:password` (RFC 7617 basic credentials). */
function basicAuth(username: string, password: string): string {
  return Buffer.from(`${username}:${password}`, 'utf8').toString('base64');
}

/**
 * The auth file podman reads with `--authfile` (containers-auth.json(5), the Docker config
 * format): one entry for `repository`'s registry whose `auth` is base64 of `username:password`;
 * with no credentials an empty `auths` object, so the same `--authfile` pulls anonymously.
 * @throws Error when the user name holds a `:` (the stack configuration refuses it first).
 */
export function registryAuthFile(repository: string, creds?: ImagePullCredentials): string {
  if (creds?.username.includes(':')) throw new Error('the image pull user name must not contain ":"');
  const auths = creds
    ? { [imageRegistry(repository)]: { auth: basicAuth(creds.username, creds.password) } }
    : {};
  return `${JSON.stringify({ auths }, null, 2)}\n`;
}

/**
 * The `.dockerconfigjson` document of a `kubernetes.io/dockerconfigjson` Secret (kubernetes.io/docs/
 * concepts/configuration/secret/#docker-config-secrets) that logs in to `registry` with basic
 * credentials: `auths.<registry>` with `username`, `password` and `auth` = base64 of
 * `username:password` (RFC 7617 basic credentials, so the username holds no `:`). Docker Hub is
 * keyed by its legacy index URL, `https://index.docker.io/v1/`, as `docker login` writes it.
 */
export function dockerConfigJson(registry: string, username: string, password: string): string {
  const key = registry === 'docker.io' ? 'https://index.docker.io/v1/' : registry;
  return JSON.stringify({ auths: { [key]: { username, password, auth: basicAuth(username, password) } } });
}
